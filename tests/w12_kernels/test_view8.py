"""The 8-bit view (w12_kernels/view8): the vectorised view against the element-by-element
reference, its error bound, the per-row error norms, and the view GEMM (CPU path, Triton
kernels under the interpreter and on a GPU)."""

from __future__ import annotations

import math

import interp_harness
import pytest
import torch
import view8_interp_runner as runner

from w12.errors import W12Error
from w12.tensor import encode
from w12_kernels.view8 import (
    prepare_view,
    row_error_norms,
    view8_linear,
    view_bf16,
    view_bits,
)
from w12_kernels.view8.reference import reference_view


def weights_with_escapes(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[0, :5] = 0.0
    w[1, 3] = -0.0
    w[2, 7] = 3e-41  # a subnormal
    w[3, 1] = 1e4  # far outside the row's window
    w[4, 2] = float("inf")
    return w


def test_view_matches_the_reference_at_awkward_shapes():
    for n, k in ((7, 13), (16, 64), (5, 129)):
        w = encode(weights_with_escapes(n, k, seed=n))
        got = view_bf16(w).double()
        ref = reference_view(w)
        assert torch.equal(got.isinf(), ref.isinf())
        finite = ~ref.isinf()
        assert torch.equal(got[finite], ref[finite])


def test_escapes_keep_their_exact_bits():
    exact = weights_with_escapes(8, 40)
    view = view_bf16(encode(exact))
    for r, c in ((0, 0), (1, 3), (2, 7), (3, 1), (4, 2)):
        assert view[r, c].view(torch.int16) == exact[r, c].view(torch.int16)


def test_every_in_window_weight_is_within_a_sixteenth_of_its_binade():
    exact = weights_with_escapes(12, 96)
    view = view_bf16(encode(exact)).double()
    x = exact.double()
    finite = x.isfinite() & (x != 0)
    binade = torch.exp2(torch.floor(torch.log2(x[finite].abs())))
    err = (x[finite] - view[finite]).abs()
    assert bool((err <= binade / 16).all())
    assert float(err.max()) > 0  # the view really drops the low nibble


def test_row_error_norms_bound_every_dot_product():
    exact = weights_with_escapes(32, 256, seed=3)
    w = encode(exact)
    norms = row_error_norms(w)
    assert bool(norms.isfinite().all())  # the infinity is an escape, kept exactly
    exact[4, 2] = 1.0  # finite, so every dot product below is finite
    w = encode(exact)
    norms = row_error_norms(w)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 256, generator=g, dtype=torch.float64)
    gap = (h @ exact.double().T - h @ view_bf16(w).double().T).abs()
    bound = h.norm(dim=1, keepdim=True) * norms.double()[None, :]
    assert bool((gap <= bound).all())
    diff = exact.double() - view_bf16(w).double()
    assert math.isclose(float(norms[9]), float(diff[9].norm()), rel_tol=1e-6)


# ------------------------------------------------------------------ the view GEMM

def test_packed_view_has_the_views_bits_and_aligned_rows():
    exact = weights_with_escapes(9, 70, seed=4)
    w = encode(exact)
    packed = prepare_view(w)
    assert packed.hi.shape == (9, 128) and not packed.hi[:, 70:].any()
    assert torch.equal(packed.bits(), view_bits(w))


def test_cpu_view8_linear_is_the_bf16_product_of_the_view():
    exact = weights_with_escapes(21, 130, seed=5)
    w = encode(exact)
    x = torch.randn(2, 3, 130, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    bias = torch.randn(21, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    got = view8_linear(x, prepare_view(w), bias)
    want = torch.nn.functional.linear(x, view_bf16(w), bias)
    assert got.shape == (2, 3, 21)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_escape_deltas_restore_the_exact_values():
    """Record 0's view plus the escape's delta is the escape's value (float32 rounding only)."""
    exact = weights_with_escapes(8, 40)
    exact[4, 2] = 1.0  # finite: the check below is arithmetic
    w = encode(exact)
    p = prepare_view(w)
    rows = torch.repeat_interleave(torch.arange(8), (p.esc_rowptr[1:] - p.esc_rowptr[:-1]).long())
    record0 = 1.0625 * torch.exp2(p.e0.double() - 127)[rows]
    value = exact.double()[rows, p.esc_col.long()]
    assert torch.allclose(record0 + p.esc_delta.double(), value, rtol=2 ** -23, atol=0)


def test_bad_inputs_are_refused():
    p = prepare_view(encode(weights_with_escapes(8, 40)))
    with pytest.raises(W12Error, match="PackedView8"):
        view8_linear(torch.zeros(1, 40, dtype=torch.bfloat16), torch.zeros(8, 40))
    with pytest.raises(W12Error, match="bfloat16"):
        view8_linear(torch.zeros(1, 40), p)
    with pytest.raises(W12Error, match=r"\[\.\.\., 40\]"):
        view8_linear(torch.zeros(1, 41, dtype=torch.bfloat16), p)
    with pytest.raises(W12Error, match="bias"):
        view8_linear(torch.zeros(1, 40, dtype=torch.bfloat16), p, torch.zeros(7))
    with pytest.raises(W12Error, match="W12Tensor"):
        prepare_view(torch.zeros(8, 40))


interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "view8_interp_runner.py")


@pytest.mark.parametrize("case", list(runner.CASES))
def test_interpreted_kernel(interpreter_verdicts, case):
    """The Triton view GEMM (one split with its own epilogue, several splits and the reduce
    kernel, uneven last split, rows past one block) against the float64 product of the view,
    within the project's GEMM error budget; escapes (zeros, subnormals, out-of-window values,
    inf and NaN) counted with their exact values."""
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 3])
def test_gpu_view8_gemv(m):
    """The CUDA-core kernel on the GPU, one and several K splits: within the GEMM error budget
    of the float64 product of the view."""
    from gemm_helpers import assert_within_budget, make_weight

    from w12_kernels.view8.launcher import View8Config, gemm
    from w12_kernels.view8.reference import reference_view

    t = make_weight(300, 1536, seed=m)
    w = encode(t)
    x = torch.randn(m, 1536, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    p = prepare_view(w, device="cuda")
    rows = 1 if m == 1 else 4
    for split in (1, 4):
        out = gemm(x.cuda(), p, config=View8Config(32, rows, 256, split, gemv=True))
        assert_within_budget(out.cpu(), x, view_bf16(w), x.double() @ reference_view(w).T)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 7, 16, 32, 64, 100, 128])
def test_gpu_view8_gemm(m):
    """On the GPU, at the launcher's own configuration for each row count: within the GEMM
    error budget of the float64 product of the view, and the same bits run to run."""
    from gemm_helpers import assert_within_budget, make_weight

    from w12_kernels.view8.reference import reference_view

    t = make_weight(300, 1536, seed=m)
    w = encode(t)
    x = torch.randn(m, 1536, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    p = prepare_view(w, device="cuda")
    out = view8_linear(x.cuda(), p)
    assert torch.equal(out.view(torch.int16), view8_linear(x.cuda(), p).view(torch.int16))
    assert_within_budget(out.cpu(), x, view_bf16(w), x.double() @ reference_view(w).T)
