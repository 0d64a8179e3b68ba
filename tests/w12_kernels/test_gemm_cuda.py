"""GPU tests of the W12 GEMM kernels (skipped without CUDA): correctness at real sizes,
the inline-PTX decode, determinism, batch invariance, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import prepare_weight, triton_available, w12_linear

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs a CUDA GPU and triton")

SIZES = [(1, 64), (300, 1000), (4096, 4096), (6144, 4096), (1024, 14336)]
M_VALUES = [1, 3, 16, 17, 33, 64, 65, 128, 300]


def _inputs(n, k, m, seed):
    t = make_weight(n, k, seed=seed, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    return t, x


def _ref(x, t, bias=None):
    y = x.double() @ t.double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("n,k", SIZES, ids=[f"{n}x{k}" for n, k in SIZES])
def test_kernel_within_budget(n, k):
    from w12_kernels.gemm import launcher

    t, _ = _inputs(n, k, 1, seed=n + k)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in M_VALUES:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        cfg = launcher.default_config(n, k, m, x.device)
        if cfg is None:  # decode + cuBLAS
            out = w12_linear(x, pw, bias)
        else:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            launcher.launch_packed(x, pw, bias, cfg, out=out)
        assert_within_budget(out, x, t, _ref(x, t, bias), bias)


def test_split_k_configs_can_alternate_on_one_weight():
    from w12_kernels.gemm import config as cfgs
    from w12_kernels.gemm import launcher

    t, x = _inputs(4096, 14336, 3, seed=7)
    pw = prepare_weight(encoded(t))
    ref = _ref(x, t)
    for split in (2, 4, 8, 2, 4, 1, 8):
        cfg = cfgs.GemmConfig(block_n=64, block_k=256, split_k=split, num_warps=4,
                              num_stages=3)
        out = torch.full((3, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
        launcher.launch_packed(x, pw, None, cfg, out=out)
        assert_within_budget(out, x, t, ref)


def test_ptx_decode_is_exact():
    from w12_kernels.gemm import launcher

    t = make_weight(513, 1000, seed=3, device="cuda")
    pw = prepare_weight(encoded(t))
    for use_asm in (True, False):
        d = launcher.decode(pw, use_asm=use_asm)
        assert torch.equal(d.view(torch.int16), t.view(torch.int16)), f"use_asm={use_asm}"
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    t = every.reshape(256, 256).cuda()
    d = launcher.decode(prepare_weight(encoded(t)))
    assert torch.equal(d.view(torch.int16), t.view(torch.int16))


def test_ptx_and_plain_decode_give_the_same_product():
    from w12_kernels.gemm import launcher

    t, x = _inputs(4096, 4096, 16, seed=5)
    pw = prepare_weight(encoded(t))
    cfg = launcher.default_config(4096, 4096, 16, x.device)
    a = launcher.launch_packed(x, pw, None, cfg)
    b = launcher.launch_packed(x, pw, None, cfg.with_(use_asm=False))
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("m", [1, 5, 64, 200])
def test_deterministic(m):
    t, x = _inputs(4096, 4096, m, seed=11)
    pw = prepare_weight(encoded(t))
    first = w12_linear(x, pw)
    for _ in range(20):
        assert torch.equal(w12_linear(x, pw).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("n,k", [(4096, 4096), (28672, 4096), (1000, 300)])
def test_batch_invariant_up_to_64_rows(n, k):
    t, x = _inputs(n, k, 64, seed=13)
    pw = prepare_weight(encoded(t))
    full = w12_linear(x, pw).view(torch.int16)
    for m in (1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 48, 63):
        part = w12_linear(x[:m].contiguous(), pw).view(torch.int16)
        assert torch.equal(part, full[:m]), f"M={m}"
    perm = torch.randperm(64, device="cuda")
    shuffled = w12_linear(x[perm].contiguous(), pw).view(torch.int16)
    assert torch.equal(shuffled, full[perm])


def test_compile_and_cuda_graph():
    t, x = _inputs(4096, 4096, 8, seed=17)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
    eager = w12_linear(x, pw, bias)
    compiled = torch.compile(lambda a: w12_linear(a, pw, bias), fullgraph=True)
    assert torch.equal(compiled(x).view(torch.int16), eager.view(torch.int16))
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w12_linear(static_x, pw, bias)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = w12_linear(static_x, pw, bias)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y.view(torch.int16), eager.view(torch.int16))
