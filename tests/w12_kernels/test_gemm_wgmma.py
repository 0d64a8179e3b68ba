"""GPU tests of the experimental warpgroup-MMA kernel (``w12_kernels/gemm/wgmma.py``; skipped
without a compute-capability 9.0 GPU and CuPy): error budget at awkward shapes with escapes and
bias, determinism, and row independence at a fixed activation block."""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import prepare_weight, wgmma

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and wgmma.available()),
                                reason="needs a compute-capability 9.0 GPU and CuPy")


def _run(x, pw, bias=None, **kw):
    return wgmma.gemm_wg(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, bias,
                         pw.n, pw.k, **kw)


@pytest.mark.parametrize("n,k", [(1000, 3000), (130, 72), (4096, 4096), (37, 640)])
@pytest.mark.parametrize("kw,depth", [(1, 2), (2, 3)])
def test_within_budget(n, k, kw, depth):
    t = make_weight(n, k, seed=n + k, device="cuda")
    pw = prepare_weight(encoded(t))
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in (1, 17, 64, 129, 256):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.double() @ t.double().T + bias.double()
        assert_within_budget(_run(x, pw, bias, kw=kw, depth=depth), x, t, ref, bias)


def test_deterministic_and_rows_independent_at_a_fixed_block():
    t = make_weight(1000, 3000, seed=5, device="cuda")
    pw = prepare_weight(encoded(t))
    x = torch.randn(40, 3000, device="cuda").to(torch.bfloat16)
    first = _run(x, pw, kw=2, n_block=48).view(torch.int16)
    for _ in range(5):
        assert torch.equal(_run(x, pw, kw=2, n_block=48).view(torch.int16), first)
    alone = _run(x[7:8], pw, kw=2, n_block=48).view(torch.int16)
    assert torch.equal(alone, first[7:8])
