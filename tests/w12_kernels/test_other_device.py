"""Every Triton kernel family runs on the GPU that holds its tensors, not on the current one
(``w12_kernels.device``): tensors on ``cuda:1`` while ``cuda:0`` is current give the results
they give on ``cuda:0``. The CUDA C launchers' own test of this is in ``test_gemm_cuda.py``."""

from __future__ import annotations

import gated_delta_interp_runner as gdn_runner
import pytest
import torch
from gemm_helpers import encoded, make_weight
from tree_attention_interp_runner import check_budget, make_case

from w12_kernels.gemm import prepare_weight
from w12_kernels.gemm.triton import launcher as triton_gemm
from w12_kernels.int8_head import quantize
from w12_kernels.int8_head.launcher import approx_logits
from w12_kernels.norm import rms_norm
from w12_kernels.tree_attention import tree_attention
from w12_kernels.tree_attention.reference import reference_tree_attention
from w12_kernels.view8 import prepare_view, view8_linear

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    assert b.device == torch.device("cuda:1")
    return torch.equal(a.cpu().view(torch.int16 if a.dtype == torch.bfloat16 else a.dtype),
                       b.cpu().view(torch.int16 if b.dtype == torch.bfloat16 else b.dtype))


def _both(run, *tensors):
    """``run`` on cuda:0 and on cuda:1 with cuda:0 current."""
    here = run(*(t.to("cuda:0") for t in tensors))
    with torch.cuda.device(0):
        there = run(*(t.to("cuda:1") for t in tensors))
    return here, there


def test_view8_gemm():
    w = encoded(make_weight(300, 1000, seed=1))
    x = torch.randn(9, 1000).to(torch.bfloat16)
    here, there = _both(lambda x: view8_linear(x, prepare_view(w, device=x.device)), x)
    assert _same(here, there)


def test_triton_gemm():
    pw = prepare_weight(encoded(make_weight(200, 700, seed=2)))
    x = torch.randn(5, 700).to(torch.bfloat16)

    def run(x):
        p = pw.to(x.device)
        return triton_gemm.gemm(x, p.chunks, p.scale, p.esc_rowptr, p.esc_row, p.esc_col,
                                p.esc_delta, None, p.n, p.k, kw=4)
    here, there = _both(run, x)
    assert _same(here, there)


def test_row_norm():
    x = torch.randn(7, 512).to(torch.bfloat16)
    w = torch.randn(512).to(torch.bfloat16)
    here, there = _both(lambda x, w: rms_norm(x, w, 1e-6), x, w)
    assert _same(here, there)


def test_int8_head_product():
    head = quantize((torch.randn(500, 256) * 0.05).to(torch.bfloat16))
    h = torch.randn(4, 256).to(torch.bfloat16)
    here, there = _both(approx_logits, h, head.q, head.scale)
    assert _same(here, there)


def test_tree_attention():
    inputs = make_case(1, 7, 9, 3, 64, [150], 0, seed=3)
    here, there = _both(tree_attention, *inputs)
    assert _same(here, there)
    check_budget(there.cpu(), reference_tree_attention(*inputs))


def test_gated_delta_path():
    with torch.cuda.device(0):
        gdn_runner.check(*gdn_runner.CASES["verify_tree"], device="cuda:1")
