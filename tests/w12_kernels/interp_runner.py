"""Runs the Triton kernels under ``TRITON_INTERPRET=1`` at small awkward shapes (a fresh process:
Triton reads the variable when imported). Prints one JSON line: case id -> "ok" or the failure.

Importing this module only defines the cases; ``test_gemm.py`` starts it as a script through
``interp_harness``.
"""

from __future__ import annotations

GEMM_CASES = {  # id: (m, n, k, kw, tiles_per_program, escapes)
    "m1_n1_k100_kw1": (1, 1, 100, 1, 1, True),
    "m3_n37_k250_kw3": (3, 37, 250, 3, 1, True),
    "m17_n70_k500_kw4_two_tiles": (17, 70, 500, 4, 2, True),
    "m3_n130_k300_kw4_uneven_split": (3, 130, 300, 4, 1, True),
    "m17_n20_k64_kw3_no_escapes": (17, 20, 64, 3, 1, False),
    "m70_n33_k200_kw3_wide_block": (70, 33, 200, 3, 1, True),
}
CASE_IDS = [*GEMM_CASES, "batch_invariant_m1_m17", "decode_kernel_exact", "tile_subset_rows",
            "tile_subset_fixed"]


def _inputs(m, n, k, escapes=True):
    import torch
    from gemm_helpers import encoded, make_weight

    from w12_kernels.gemm import prepare_weight

    t = make_weight(n, k, seed=m + n + k, escapes=escapes)
    w = encoded(t)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    return t, w, prepare_weight(w), x, bias


def _run(x, pw, bias, kw, tiles_per_program=1):
    import torch

    from w12_kernels.gemm.triton import launcher as triton_path

    out = torch.full((x.shape[0], pw.n), float("nan"), dtype=torch.bfloat16)  # poison
    triton_path.gemm(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                     pw.esc_delta, bias, pw.n, pw.k, kw=kw, on_gpu=False, out=out,
                     tiles_per_program=tiles_per_program)
    return out


def _gemm_case(m, n, k, kw, tiles_per_program, escapes):
    from gemm_helpers import assert_within_budget

    from w12_kernels.gemm.reference import reference_linear

    t, w, pw, x, bias = _inputs(m, n, k, escapes)
    out = _run(x, pw, bias, kw, tiles_per_program)
    assert_within_budget(out, x, t, reference_linear(x, w, bias), bias)


def _batch_invariance_case():
    import torch

    _, _, pw, x, bias = _inputs(17, 40, 300)
    alone = _run(x[5:6], pw, bias, kw=3)
    together = _run(x, pw, bias, kw=3)
    assert torch.equal(alone.view(torch.int16), together[5:6].view(torch.int16)), \
        "row 5 differs between M=1 and M=17"


def _tile_subset_case():
    """Rows recomputed from their gathered tiles (``rows.tile_subset``, the certified INT8
    head's recompute) have the bits of the whole product, escapes and bias included."""
    import torch

    from w12_kernels.gemm.layout import ROW_ALIGN
    from w12_kernels.gemm.rows import tile_subset
    from w12_kernels.gemm.triton import launcher as triton_path

    _, _, pw, x, bias = _inputs(5, 70, 300)
    assert pw.num_escapes > 0
    whole = _run(x, pw, bias, kw=3)
    ids = torch.tensor([0, 3, 17, 18, 47, 69])
    tiles, where = torch.unique(ids // ROW_ALIGN, return_inverse=True)
    sub = tile_subset(pw, tiles)
    padded = torch.zeros(int(pw.chunks.shape[0]) * ROW_ALIGN, dtype=torch.bfloat16)
    padded[: pw.n] = bias
    part = triton_path.gemm(x, sub.chunks, sub.scale, sub.esc_rowptr, sub.esc_row, sub.esc_col,
                            sub.esc_delta, padded.view(-1, ROW_ALIGN)[tiles].reshape(-1),
                            sub.n, pw.k, kw=3, on_gpu=False)
    got = part[:, where * ROW_ALIGN + ids % ROW_ALIGN]
    assert torch.equal(got.view(torch.int16), whole[:, ids].view(torch.int16)), \
        "gathered tiles give other bits"
    # the escapes of the subset are those of its rows, in order
    rows = (tiles[:, None] * ROW_ALIGN + torch.arange(ROW_ALIGN)).reshape(-1)
    want = [(int(r), int(c)) for r, c in zip(pw.esc_row, pw.esc_col, strict=True)
            if int(r) in set(rows.tolist())]
    have = [(int(rows[r]), int(c)) for r, c in zip(sub.esc_row, sub.esc_col, strict=True)]
    assert have == want and len(have) > 0


def _tile_fixed_case():
    """The fixed-shape gather (``rows.linear_tiles``'s: a set number of tiles, repeats
    allowed, a set room for escapes) gives the whole product's bits at every gathered row."""
    import torch

    from w12_kernels.gemm.layout import ROW_ALIGN
    from w12_kernels.gemm.rows import _gather_fixed, tile_escapes
    from w12_kernels.gemm.triton import launcher as triton_path

    _, _, pw, x, _ = _inputs(5, 70, 300)
    whole = _run(x, pw, None, kw=3)
    tiles = torch.tensor([1, 4, 0, 0])  # two tiles wanted, then padding with tile 0
    room = len(tiles) * tile_escapes(pw)
    sub = _gather_fixed(pw, tiles, room)
    assert sub.esc_col.numel() == room and 0 < int(sub.esc_rowptr[-1]) <= room
    part = triton_path.gemm(x, sub.chunks, sub.scale, sub.esc_rowptr, sub.esc_row, sub.esc_col,
                            sub.esc_delta, None, sub.n, pw.k, kw=3, on_gpu=False)
    rows = (tiles[:, None] * ROW_ALIGN + torch.arange(ROW_ALIGN)).reshape(-1)
    real = rows < pw.n
    assert torch.equal(part[:, real].view(torch.int16), whole[:, rows[real]].view(torch.int16)), \
        "fixed gather gives other bits"


def _decode_case():
    import torch
    from gemm_helpers import encoded, make_weight

    from w12_kernels.gemm import prepare_weight
    from w12_kernels.gemm.triton import launcher as triton_path

    t = make_weight(45, 333, seed=9)
    pw = prepare_weight(encoded(t))
    for tiles_per_program in (1, 2):
        d = triton_path.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, pw.n,
                               pw.k, on_gpu=False, tiles_per_program=tiles_per_program)
        assert torch.equal(d.view(torch.int16), t.view(torch.int16)), "decoded bits differ"


def main() -> None:
    from interp_harness import report

    jobs = {cid: (lambda c=c: _gemm_case(*c)) for cid, c in GEMM_CASES.items()}
    jobs["batch_invariant_m1_m17"] = _batch_invariance_case
    jobs["decode_kernel_exact"] = _decode_case
    jobs["tile_subset_rows"] = _tile_subset_case
    jobs["tile_subset_fixed"] = _tile_fixed_case
    report(jobs)


if __name__ == "__main__":
    main()
