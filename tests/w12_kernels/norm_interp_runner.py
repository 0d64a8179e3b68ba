"""Runs the Triton row-norm kernel under ``TRITON_INTERPRET=1`` (a fresh process) and prints one
JSON line: case id -> "ok" or the failure. ``test_norm.py`` starts it and imports the cases."""

from __future__ import annotations

# id: (rows, row length, with a residual input)
CASES = {
    "one_row_d576": (1, 576, False),
    "seven_rows_d100_residual": (7, 100, True),
    "rows_d64_residual": (33, 64, True),
}


def inputs(rows, d, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, d, generator=gen) * 3).to(torch.bfloat16)
    y = torch.randn(rows, d, generator=gen).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(torch.bfloat16)
    return x, y, w


def check_case(rows, d, residual):
    """Within twice the torch path's rounding of the float64 reference (the interpreter
    truncates where the GPU rounds to nearest when it narrows to bfloat16), and every row's
    bits equal to the same row normed alone."""
    import torch

    from w12_kernels.norm import add_rms_norm, rms_norm
    from w12_kernels.norm.kernel import rms_norm_rows
    from w12_kernels.norm.reference import rms_norm_reference

    x, y, w = inputs(rows, d)
    total, got = rms_norm_rows(x, y if residual else None, w, 1e-6)
    if residual:
        want_total, torch_path = add_rms_norm(x, y, w, 1e-6)
        sum_err = float((total.double() - want_total.double()).norm() / want_total.norm())
        assert sum_err < 2**-7, f"residual sum off by {sum_err:.2e}"
    else:
        want_total, torch_path = x, rms_norm(x, w, 1e-6)
    ref = rms_norm_reference(want_total, w, 1e-6)
    err = float((got.double() - ref).norm() / ref.norm())
    budget = 3 * float((torch_path.double() - ref).norm() / ref.norm())
    assert torch.isfinite(got.float()).all() and err <= budget, f"error {err:.2e} > {budget:.2e}"
    for r in range(rows):
        alone = rms_norm_rows(x[r:r + 1], y[r:r + 1] if residual else None, w, 1e-6)[1]
        assert torch.equal(alone[0].view(torch.int16), got[r].view(torch.int16)), f"row {r}"


def main() -> None:
    from interp_harness import report

    report({cid: (lambda c=c: check_case(*c)) for cid, c in CASES.items()})


if __name__ == "__main__":
    main()
