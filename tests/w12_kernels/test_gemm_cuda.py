"""GPU tests of the W12 GEMM kernels (skipped without CUDA): correctness at real sizes,
the decode kernel, determinism, batch invariance, torch.compile and CUDA graphs."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import cuda, launcher, prepare_weight, w12_linear

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_cupy = pytest.mark.skipif(not cuda.available(), reason="needs CuPy (NVRTC kernels)")

SIZES = [(1, 64), (300, 1000), (4096, 4096), (6144, 4096), (1024, 14336), (130, 72)]
M_VALUES = [1, 3, 16, 17, 33, 64, 65, 128, 200, 300]


def _inputs(n, k, m, seed):
    t = make_weight(n, k, seed=seed, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    return t, x


def _ref(x, t, bias=None):
    y = x.double() @ t.double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("n,k", SIZES, ids=[f"{n}x{k}" for n, k in SIZES])
def test_linear_within_budget(n, k):
    t, _ = _inputs(n, k, 1, seed=n + k)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in M_VALUES:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        assert_within_budget(w12_linear(x, pw, bias), x, t, _ref(x, t, bias), bias)


@needs_cupy
@pytest.mark.parametrize("kw,depth", [(1, 2), (3, 3), (5, 4), (8, 6), (8, 2), (16, 2), (13, 1)])
def test_small_kernel_any_split(kw, depth):
    """The small-M kernel at awkward splits: within budget, and the same bits with and without
    the activation prefetch (it changes when loads happen, not what is summed)."""
    t, x = _inputs(1000, 3000, 40, seed=kw)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    for m in (1, 9, 40):
        outs = []
        for prefetch in (False, True) if depth % 2 == 0 else (False,):
            out = torch.full((m, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
            cuda.gemm_small(x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                            pw.esc_delta, bias, pw.n, pw.k, kw=kw, depth=depth,
                            prefetch=prefetch, out=out)
            assert_within_budget(out, x[:m], t, _ref(x[:m], t, bias), bias)
            outs.append(out.view(torch.int16))
        assert torch.equal(outs[0], outs[-1]), f"M={m}: prefetch changed the bits"


@needs_cupy
@pytest.mark.parametrize("tiles,min_blocks,depth,x_stages,groups,w_stages",
                         [(2, 1, 1, 0, 1, 0), (3, 1, 1, 0, 1, 0), (4, 2, 2, 0, 1, 0),
                          (1, 3, 1, 0, 1, 0), (1, 1, 1, 2, 1, 0), (2, 2, 1, 3, 1, 0),
                          (1, 1, 2, 4, 1, 0), (1, 1, 1, 0, 2, 0), (2, 1, 1, 0, 3, 0),
                          (1, 2, 1, 2, 2, 0), (1, 1, 2, 0, 4, 0), (1, 1, 1, 0, 1, 2),
                          (2, 2, 1, 0, 1, 4), (1, 1, 1, 3, 1, 3), (3, 3, 1, 0, 1, 6),
                          (2, 1, 1, 0, 2, 3), (1, 2, 1, 4, 1, 4)])
def test_small_kernel_schedules_change_no_bits(tiles, min_blocks, depth, x_stages, groups,
                                               w_stages):
    """Tiles per block, tile groups per block, the register cap and shared-memory activation
    and weight stages change how the work is scheduled, not what is summed: the same bits as
    the plainest schedule, also when the tile count (1000 rows = 63 tiles) is not a multiple
    of the block's ``tiles * groups`` and a warp's chunk count (47 columns, kw 5: 9 or 10) not
    one of the stage count."""
    t, x = _inputs(1000, 3000, 64, seed=tiles)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    for m in (1, 9, 32, 64):
        args = (x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, bias,
                pw.n, pw.k)
        want = cuda.gemm_small(*args, kw=5, depth=2)
        got = cuda.gemm_small(*args, kw=5, depth=depth, tiles=tiles, min_blocks=min_blocks,
                              x_stages=x_stages, groups=groups, w_stages=w_stages)
        assert_within_budget(got, x[:m], t, _ref(x[:m], t, bias), bias)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m}"


@needs_cupy
@pytest.mark.parametrize("tiles,min_blocks,groups", [(1, 2, 1), (2, 1, 1), (3, 1, 1), (1, 1, 2)])
def test_small_kernel_activation_prefetch_with_tiles_changes_no_bits(tiles, min_blocks, groups):
    """The activations one column ahead in registers with several tiles or tile groups per
    block at 17-32 rows (timed as sweep candidates in docs/PERF_GEMM.md #47; any caller of
    gemm_small may ask for them): the same bits as the plainest schedule."""
    t, x = _inputs(1000, 3000, 32, seed=20 + tiles)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    for m in (17, 25, 32):
        args = (x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, bias,
                pw.n, pw.k)
        want = cuda.gemm_small(*args, kw=5, depth=2)
        got = cuda.gemm_small(*args, kw=5, depth=2, prefetch=True, tiles=tiles,
                              min_blocks=min_blocks, groups=groups)
        assert_within_budget(got, x[:m], t, _ref(x[:m], t, bias), bias)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m}"


@needs_cupy
@pytest.mark.parametrize("kw,cluster,tiles,min_blocks,groups,depth,prefetch",
                         [(8, 2, 1, 4, 1, 1, False), (8, 2, 2, 4, 1, 1, False),
                          (8, 4, 2, 8, 1, 1, False), (8, 2, 3, 2, 1, 1, False),
                          (6, 2, 2, 2, 1, 2, True), (4, 4, 1, 8, 2, 1, False),
                          (16, 2, 2, 1, 1, 1, False), (16, 4, 1, 4, 2, 2, False)])
def test_small_kernel_clusters_change_no_bits(kw, cluster, tiles, min_blocks, groups, depth,
                                              prefetch):
    """A tile group's kw warps spread over the blocks of a thread-block cluster, the partial
    tiles added through distributed shared memory: the same bits as the plainest schedule at
    that kw, every output written (the output starts as NaN), also when 63 tiles do not fill
    the last cluster and a warp's chunk count (47 columns) differs between warps."""
    t, x = _inputs(1000, 3000, 64, seed=30 + kw + cluster)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    for m in (1, 9, 17, 32, 64):
        args = (x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, bias,
                pw.n, pw.k)
        want = cuda.gemm_small(*args, kw=kw, depth=2)
        got = torch.full((m, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
        cuda.gemm_small(*args, kw=kw, depth=depth, prefetch=prefetch, tiles=tiles,
                        min_blocks=min_blocks, groups=groups, cluster=cluster, out=got)
        assert_within_budget(got, x[:m], t, _ref(x[:m], t, bias), bias)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m}"


@needs_cupy
def test_small_kernel_sixteen_warps_a_tile():
    """kw 16 (a 1024-thread block with two tile groups): every schedule the same bits as the
    plainest one at that kw."""
    t, x = _inputs(1000, 3000, 64, seed=16)
    pw = prepare_weight(encoded(t))
    for m in (1, 13, 40):
        args = (x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, None,
                pw.n, pw.k)
        want = cuda.gemm_small(*args, kw=16, depth=2)
        assert_within_budget(want, x[:m], t, _ref(x[:m], t, None), None)
        layouts = [dict(depth=1, w_stages=3, groups=2), dict(depth=2, tiles=2, min_blocks=2)]
        if m <= 16:  # 16 warps' activation stages fit the shared memory up to 16 rows
            layouts.append(dict(depth=1, x_stages=3, w_stages=3))
        for lay in layouts:
            got = cuda.gemm_small(*args, kw=16, **lay)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m} {lay}"


@needs_cupy
def test_decode_kernel_is_exact():
    for n, k in [(513, 1000), (37, 77), (16, 64), (40, 4096)]:
        t = make_weight(n, k, seed=3, device="cuda")
        pw = prepare_weight(encoded(t))
        d = cuda.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, n, k)
        assert torch.equal(d.view(torch.int16), t.view(torch.int16)), f"{n}x{k}"
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    t = every.reshape(256, 256).cuda()
    pw = prepare_weight(encoded(t))
    d = cuda.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, 256, 256)
    assert torch.equal(d.view(torch.int16), t.view(torch.int16))


@needs_cupy
def test_cuda_kernel_matches_its_emulator():
    """The NumPy emulator that CI runs (cuda_emulator.py) against the real kernel: equal bits
    wherever the output is finite (short K, so float32 sums are exact in both), NaN in the same
    places."""
    import cuda_emulator as emu

    t = make_weight(70, 300, seed=21)
    pw = prepare_weight(encoded(t))
    x = torch.randn(17, 300, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    bias = torch.randn(70, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    want = emu.gemm_small(x, pw, bias, kw=3, depth=2, prefetch=True)
    pw_gpu = pw.to("cuda")
    got = cuda.gemm_small(x.cuda(), pw_gpu.chunks, pw_gpu.scale, pw_gpu.esc_rowptr,
                          pw_gpu.esc_col, pw_gpu.esc_delta, bias.cuda(), 70, 300, kw=3, depth=2,
                          prefetch=True).cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(got.view(torch.int16)[finite], want.view(torch.int16)[finite])


@pytest.mark.parametrize("m", [1, 17, 64, 65])
def test_triton_fallback_on_the_gpu(m):
    """The Triton kernels (used where CuPy is missing) at a real size, and their decode."""
    pytest.importorskip("triton")
    from w12_kernels.gemm import triton_path

    t, x = _inputs(4096, 4096, m, seed=23)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
    out = triton_path.gemm(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                           pw.esc_delta, bias, pw.n, pw.k, kw=4)
    assert_within_budget(out, x, t, _ref(x, t, bias), bias)
    d = triton_path.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, 4096, 4096)
    assert torch.equal(d.view(torch.int16), t.view(torch.int16))


LARGE_CONFIGS = [(4, 64, 4, 3, 0, 1), (8, 128, 8, 3, 168, 1), (2, 64, 4, 2, 0, 1),
                 (4, 128, 4, 4, 128, 1), (8, 128, 4, 3, 0, 1), (4, 256, 8, 3, 0, 1),
                 (16, 64, 8, 3, 0, 1), (4, 128, 4, 3, 168, 3), (4, 64, 4, 3, 0, 2)]


@pytest.mark.parametrize("tiles,block_m,num_warps,num_stages,maxnreg,splits", LARGE_CONFIGS,
                         ids=[f"t{t}_m{b}_w{w}_s{s}{f'_r{r}' if r else ''}"
                              f"{f'_k{k}' if k > 1 else ''}"
                              for t, b, w, s, r, k in LARGE_CONFIGS])
def test_fused_large_kernel(tiles, block_m, num_warps, num_stages, maxnreg, splits):
    """The tensor-core kernel for many rows at awkward sizes and every block shape the sweep
    tries (K splits included): within budget (escapes, NaN/inf included), bit-identical when
    run again."""
    pytest.importorskip("triton")
    from w12_kernels.gemm import triton_path

    def run(x, pw, bias, out):
        triton_path.gemm_large(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col,
                               pw.esc_delta, bias, pw.n, pw.k, tiles=tiles, block_m=block_m,
                               num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg,
                               splits=splits, out=out)

    _check_large_kernel(run, ((300, 1000, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70)))


def _check_large_kernel(run, shapes) -> None:
    """``run(x, pw, bias, out)`` at each (N, K, M): within budget (escapes, NaN/inf and bias
    included), every output written (``out`` starts as NaN), bit-identical when run again."""
    for n, k, m in shapes:
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            run(x, pw, bias, out)
            outs.append(out.view(torch.int16).clone())
        assert_within_budget(out, x, t, _ref(x, t, bias), bias)
        assert torch.equal(outs[0], outs[1]), f"{n}x{k} M={m}: not deterministic"


WGMMA_CONFIGS = [(256, 2, 4, 3, 1, 0), (256, 2, 3, 5, 2, 0), (128, 2, 4, 8, 2, 0),
                 (256, 2, 4, 3, 4, 0), (128, 1, 6, 12, 1, 0), (64, 1, 3, 2, 1, 0),
                 (192, 2, 3, 3, 4, 0), (256, 1, 4, 10, 2, 0), (128, 1, 3, 2, 2, 0),
                 (128, 2, 4, 8, 2, 1), (64, 1, 3, 2, 1, 1), (256, 2, 4, 6, 1, 1),
                 (192, 2, 3, 3, 4, 1), (256, 2, 4, 6, 1, 2), (256, 2, 4, 6, 2, 2),
                 (128, 2, 4, 8, 4, 2), (256, 2, 5, 5, 1, 2), (256, 2, 5, 5, 2, 2),
                 (128, 2, 8, 8, 2, 1), (256, 2, 4, 5, 4, 2),
                 # K in three ranges: token shares that do not divide the block
                 (256, 2, 5, 5, 3, 2), (128, 2, 8, 8, 3, 1), (64, 1, 3, 2, 3, 0),
                 # one MMA warpgroup with the register operand (two blocks a multiprocessor
                 # for the last two)
                 (256, 1, 5, 8, 2, 1), (256, 1, 5, 8, 1, 1), (128, 1, 6, 12, 2, 1),
                 (128, 1, 4, 5, 1, 1), (128, 1, 4, 5, 2, 1),
                 # two MMA warpgroups on one 64-row group, every other column each
                 (256, 1, 5, 8, 1, 3), (256, 1, 5, 8, 2, 3), (256, 1, 5, 6, 3, 3),
                 (128, 1, 4, 5, 4, 3), (64, 1, 3, 2, 1, 3),
                 # 64 tokens, two warpgroups of 64 rows, the register operand (#68)
                 (64, 2, 4, 4, 1, 1)]


@pytest.mark.parametrize("block_m,warpgroups,x_stages,w_stages,splits,a_regs", WGMMA_CONFIGS,
                         ids=[f"m{b}_g{g}_x{s}_w{w}_k{k}" + ("", "_r", "_rp", "_ri")[r]
                              for b, g, s, w, k, r in WGMMA_CONFIGS])
def test_wgmma_large_kernel(block_m, warpgroups, x_stages, w_stages, splits, a_regs):
    """The warpgroup-MMA kernel for many rows (kernels_large.cu) at awkward sizes: within budget
    (escapes, NaN/inf, bias included; rows, columns and tokens not multiples of the block; K
    ranges shorter than the stages), bit-identical when run again."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    def run(x, pw, bias, out):
        cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                            pw.esc_val, pw.esc_delta, pw.esc_order,
                            pw.esc_entry, pw.esc_fix, bias, pw.n, pw.k,
                            block_m=block_m, warpgroups=warpgroups,
                            x_stages=x_stages, w_stages=w_stages, splits=splits,
                            a_regs=a_regs, out=out)

    _check_large_kernel(run, ((300, 1000, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70),
                              (200, 200, 3)))


MCAST_CONFIGS = [(256, 1, 5, 8, 1, 3), (256, 1, 5, 6, 2, 3), (256, 1, 5, 8, 3, 3),
                 (128, 1, 4, 5, 4, 3), (256, 2, 5, 5, 1, 2), (256, 2, 5, 5, 2, 2),
                 (128, 2, 4, 8, 4, 2)]


@pytest.mark.parametrize("cfg", MCAST_CONFIGS, ids=lambda c: "_".join(map(str, c)))
def test_wgmma_large_kernel_multicast_pairs(cfg):
    """``mcast``: blocks in pairs, each copying half of every activation stage into both
    (multicast), give the bits of the unpaired kernel (its two-range push in float32, as the
    pairs' is): odd tile-block counts (a partner that stores nothing), K ranges shorter than
    the stages, 1-4 K ranges (clusters of 2-8), eager and replayed in a CUDA graph; within
    budget."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    block_m, warpgroups, x_stages, w_stages, splits, a_regs = cfg

    def run(x, pw, bias, mcast):
        return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                   pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                   pw.esc_entry, pw.esc_fix, bias,
                                   pw.n, pw.k, block_m=block_m, warpgroups=warpgroups,
                                   x_stages=x_stages, w_stages=w_stages, splits=splits,
                                   a_regs=a_regs, mcast=mcast, narrow=False)

    # (tile blocks of 64 or 128 rows: 300 -> 5 or 3, 4096 -> 64 or 32, 130 -> 3 or 2, 1 -> 1)
    for n, k, m in ((300, 1000, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70),
                    (200, 200, 3)):
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        plain = run(x, pw, bias, 0).view(torch.int16).clone()
        paired = run(x, pw, bias, 1)
        assert torch.equal(paired.view(torch.int16), plain), f"{n}x{k} M={m}"
        assert_within_budget(paired, x, t, _ref(x, t, bias), bias)
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(static, pw, bias, 1)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = run(static, pw, bias, 1)
        x2 = _inputs(n, k, m, seed=n + m + 1)[1]
        static.copy_(x2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), run(x2, pw, bias, 0).view(torch.int16)), \
            f"{n}x{k} M={m} graph"


@pytest.mark.parametrize("cfg", [(256, 2, 5, 5, 1, 2), (256, 2, 5, 5, 3, 2), (128, 2, 8, 8, 2, 1),
                                 (256, 2, 4, 3, 1, 0)], ids=lambda c: "_".join(map(str, c)))
def test_wgmma_large_kernel_with_programmatic_dependent_launch(cfg):
    """``pdl``: the GEMM may start while its image pass runs and waits for the images before it
    copies them: the bits of the plain launch, eager and replayed in a CUDA graph, also when
    each call's images land where the previous call's (other activations) were."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    block_m, warpgroups, x_stages, w_stages, splits, a_regs = cfg

    def run(x, pw, bias, pdl):
        return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                   pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                   pw.esc_entry, pw.esc_fix, bias,
                                   pw.n, pw.k, block_m=block_m, warpgroups=warpgroups,
                                   x_stages=x_stages, w_stages=w_stages, splits=splits,
                                   a_regs=a_regs, pdl=pdl)

    for n, k, m in ((300, 1001, 129), (4096, 4096, 300), (1, 64, 70)):
        t, _ = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        xs = [_inputs(n, k, m, seed=n + m + s)[1] for s in range(4)]
        plain = [run(x, pw, bias, False).view(torch.int16) for x in xs]
        torch.cuda.synchronize()
        outs = [run(x, pw, bias, True) for x in xs]  # back to back, images reusing memory
        for i, out in enumerate(outs):
            assert torch.equal(out.view(torch.int16), plain[i]), f"{n}x{k} M={m} call {i}"
        assert_within_budget(outs[0], xs[0], t, _ref(xs[0], t, bias), bias)
        static = xs[0].clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(static, pw, bias, True)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = run(static, pw, bias, True)
        for i in (1, 2):
            static.copy_(xs[i])
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y.view(torch.int16), plain[i]), f"{n}x{k} M={m} graph {i}"


@pytest.mark.parametrize("cfg", [(256, 2, 5, 5, 1, 2, 0), (256, 2, 5, 5, 3, 2, 0),
                                 (256, 1, 5, 8, 2, 1, 0), (128, 2, 4, 8, 2, 0, 0),
                                 (256, 2, 5, 5, 1, 2, 1)], ids=lambda c: "_".join(map(str, c)))
def test_wgmma_large_kernel_weight_map(monkeypatch, cfg):
    """``WEIGHT_MAP``: a block's chunk words of a column by one tensor copy give the bits of the
    per-tile bulk copies, also where the last block's tiles run past the weight's (zeros come
    in for them), eager and replayed in a CUDA graph."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    kw = dict(zip(("block_m", "warpgroups", "x_stages", "w_stages", "splits", "a_regs",
                   "persist"), cfg, strict=True))

    def run(x, pw, bias):
        return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                   pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                   pw.esc_entry, pw.esc_fix, bias,
                                   pw.n, pw.k, **kw)

    for n, k, m in ((300, 1001, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70)):
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        monkeypatch.setattr(cuda_large, "WEIGHT_MAP", False)
        plain = run(x, pw, bias).view(torch.int16).clone()
        monkeypatch.setattr(cuda_large, "WEIGHT_MAP", True)
        mapped = run(x, pw, bias)
        assert torch.equal(mapped.view(torch.int16), plain), f"{n}x{k} M={m}"
        assert_within_budget(mapped, x, t, _ref(x, t, bias), bias)
        static = x.clone()
        stream = torch.cuda.Stream()  # (stream-K's work memory made on it before the capture)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(static, pw, bias)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = run(static, pw, bias)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), plain), f"{n}x{k} M={m} graph"


@pytest.mark.parametrize("cfg", [(256, 2, 5, 5, 1, 2, 0), (256, 2, 5, 5, 3, 2, 0),
                                 (256, 1, 5, 8, 2, 1, 0), (128, 2, 8, 8, 2, 1, 0),
                                 (128, 2, 4, 8, 2, 0, 0), (192, 2, 3, 3, 4, 1, 0),
                                 (256, 1, 5, 8, 2, 3, 0), (256, 1, 5, 8, 1, 3, 0)],
                         ids=lambda c: "_".join(map(str, c)))
def test_wgmma_large_kernel_row_group_stores(cfg):
    """The epilogue's 8-row path (N a multiple of 8, the output 16-byte aligned, no row of the
    block with corrections) gives the bits of the row-a-thread path, which an output one
    element off alignment takes: weights with and without escapes (NaN/inf rows send their
    blocks to the other path), token counts past the block, K ranges of a cluster."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    kw = dict(zip(("block_m", "warpgroups", "x_stages", "w_stages", "splits", "a_regs",
                   "persist"), cfg, strict=True))
    for n, k, m, esc in ((4096, 4096, 300, True), (2048, 1024, 513, False),
                         (512, 200, 70, True), (8, 64, 3, False)):
        t = make_weight(n, k, seed=n + k, escapes=esc, device="cuda")
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        outs = []
        for off in (0, 1):  # aligned, then one element off
            buf = torch.full((m * n + 8,), float("nan"), device="cuda", dtype=torch.bfloat16)
            out = buf[off:off + m * n].view(m, n)
            for b in (bias, None):
                cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                    pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                    pw.esc_entry, pw.esc_fix, b,
                                    pw.n, pw.k, out=out, **kw)
                outs.append(out.view(torch.int16).clone())
                assert_within_budget(out, x, t, _ref(x, t, b), b)
        assert torch.equal(outs[0], outs[2]), f"{n}x{k} M={m}: the paths differ (bias)"
        assert torch.equal(outs[1], outs[3]), f"{n}x{k} M={m}: the paths differ (no bias)"


@pytest.mark.parametrize("cfg,tail", [((256, 2, 5, 5, 1, 2), 2), ((256, 2, 5, 5, 1, 2), 3),
                                      ((256, 2, 4, 6, 1, 2), 4), ((128, 2, 4, 8, 1, 1), 2),
                                      ((256, 2, 5, 5, 1, 2), 1), ((256, 2, 4, 6, 1, 2), 1)],
                         ids=lambda c: "_".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_wgmma_large_kernel_tail(cfg, tail):
    """``tail``: the tile blocks of whole waves (``wave`` set small so that small shapes have
    several) in one launch with one K range, the rest in a second launch with K in ``tail``
    ranges (``tail`` 1: stream-K over the tail's units): rows before the tail carry the bits of
    the one-launch kernel, rows of the tail those of the ``tail``-range kernel (stream-K: its
    own, the same when run again); within budget, eager and replayed in a CUDA graph."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    block_m, warpgroups = cfg[0], cfg[1]
    kw = dict(zip(("block_m", "warpgroups", "x_stages", "w_stages", "splits", "a_regs"), cfg,
                  strict=True))
    ran = 0
    for n, k, m, wave in ((300, 1001, 129, 2), (4096, 4096, 300, 20), (2000, 200, 513, 20),
                          (4100, 72, 70, 30)):
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        tile_blocks = math.ceil(math.ceil(n / 16) / (4 * warpgroups))
        first = cuda_large.tail_plan(tile_blocks, math.ceil(m / block_m), wave, tail)
        if first is None:
            continue
        ran += 1
        rows = first * 64 * warpgroups

        def run(x, tail=tail, splits=1, pw=pw, bias=bias, wave=wave):
            return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                       pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                       pw.esc_entry, pw.esc_fix, bias,
                                       pw.n, pw.k, **{**kw, "splits": splits}, tail=tail,
                                       wave=wave)

        one = run(x, tail=0).view(torch.int16)
        split = (run(x).view(torch.int16).clone() if tail == 1
                 else run(x, tail=0, splits=tail).view(torch.int16))
        got = run(x)
        assert_within_budget(got, x, t, _ref(x, t, bias), bias)
        bits = got.view(torch.int16)
        assert torch.equal(bits[:, :rows], one[:, :rows]), f"{n}x{k} M={m}: whole waves"
        assert torch.equal(bits[:, rows:], split[:, rows:]), f"{n}x{k} M={m}: the tail"
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = run(static)
        x2 = _inputs(n, k, m, seed=n + m + 1)[1]
        static.copy_(x2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), run(x2).view(torch.int16)), f"{n}x{k} graph"
    assert ran, "no shape of the test has a tail at this configuration"


@pytest.mark.parametrize("x_stages,w_stages,grid_cap", [(5, 5, None), (4, 6, 5), (5, 5, 1)])
def test_wgmma_large_kernel_stream_k_staged_stores(x_stages, w_stages, grid_cap):
    """``staged``: stream-K's last segment storing its outputs through a BF16 staging tile gives
    the bits of the stores from the accumulators: weights with and without escapes (NaN/inf
    rows corrected in the accumulators first), with and without bias, tokens past M and rows
    past the last tile, an output one element off alignment and N not a multiple of 8 (both
    taking the stores from the accumulators), one block walking every unit (grid_cap 1)."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")

    def run(x, pw, bias, out, staged):
        cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                            pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry, pw.esc_fix,
                            bias, pw.n, pw.k, block_m=256, warpgroups=2, x_stages=x_stages,
                            w_stages=w_stages, splits=1, a_regs=2, persist=1,
                            grid_cap=grid_cap, out=out, staged=staged)

    for n, k, m, esc in ((4096, 4096, 300, True), (2000, 200, 513, False),
                         (1000, 1001, 129, True), (300, 256, 256, False)):
        t = make_weight(n, k, seed=n + k + m, escapes=esc, device="cuda")
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        for off in (0, 1):  # aligned, then one element off
            for b in (bias, None):
                outs = []
                for staged in (False, True):
                    buf = torch.full((m * n + 8,), float("nan"), device="cuda",
                                     dtype=torch.bfloat16)
                    out = buf[off:off + m * n].view(m, n)
                    run(x, pw, b, out, staged)
                    outs.append(out.view(torch.int16).clone())
                assert torch.equal(outs[0], outs[1]), f"{n}x{k} M={m} off={off}"
                assert_within_budget(out, x, t, _ref(x, t, b), b)


@pytest.mark.parametrize("block_m,warpgroups,x_stages,w_stages,a_regs",
                         [(256, 2, 5, 5, 2), (128, 2, 8, 8, 1), (192, 2, 4, 6, 2),
                          (128, 1, 4, 6, 0), (64, 2, 4, 4, 0), (256, 1, 5, 8, 3),
                          (128, 1, 5, 6, 3)])
def test_wgmma_large_kernel_own_share(block_m, warpgroups, x_stages, w_stages, a_regs):
    """``own``: a block of a two-range cluster keeping its share of tokens in its accumulators
    (the other share pushed, the partner's added in, stores through a staging tile) gives the
    partial tile's bits: weights with and without escapes (NaN/inf rows: both take the
    corrections path), with and without bias, tokens past M (a share with no tokens at all),
    rows past the last tile, an odd number of chunk columns (unequal ranges), an output one
    element off alignment and N not a multiple of 8 (both keeping the partial tile); each
    result within the error budget and the same on a rerun."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")

    def run(x, pw, bias, out, own):
        cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                            pw.esc_val, pw.esc_delta, pw.esc_order, pw.esc_entry, pw.esc_fix,
                            bias, pw.n, pw.k, block_m=block_m, warpgroups=warpgroups,
                            x_stages=x_stages, w_stages=w_stages, splits=2, a_regs=a_regs,
                            out=out, own=own, narrow=False)

    for n, k, m, esc in ((4096, 4096, 300, True), (2000, 200, 513, False),
                         (1000, 1001, 129, True), (1000, 4160, 70, False),
                         (300, 256, 256, False)):
        t = make_weight(n, k, seed=n + k + m, escapes=esc, device="cuda")
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        for off in (0, 1):  # aligned, then one element off
            for b in (bias, None):
                outs = []
                for own in (False, True, True):
                    buf = torch.full((m * n + 8,), float("nan"), device="cuda",
                                     dtype=torch.bfloat16)
                    out = buf[off:off + m * n].view(m, n)
                    run(x, pw, b, out, own)
                    outs.append(out.view(torch.int16).clone())
                assert torch.equal(outs[0], outs[1]), f"{n}x{k} M={m} off={off}"
                assert torch.equal(outs[1], outs[2]), f"{n}x{k} M={m} off={off} rerun"
                assert_within_budget(out, x, t, _ref(x, t, b), b)


def _wgl_toggle(option, cfg):
    """``run(x, pw, bias, on)``: the large-M kernel of ``cfg`` with ``option`` on or off."""
    from w12_kernels.gemm import cuda_large

    def run(x, pw, bias, on):
        return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                   pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                   pw.esc_entry, pw.esc_fix, bias, pw.n, pw.k,
                                   **{option: on}, **cfg)
    return run


def _scattered_escapes(n, k, seed):
    """A weight with escapes (zeros, subnormals) scattered over every row at ~0.3%: most warp
    tiles hold a few escapes at columns far apart, some many (a run of 80 zeros in row 17)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    hit = torch.rand(n, k, generator=gen) < 0.003
    t[hit] = 0.0
    t[hit & (torch.rand(n, k, generator=gen) < 0.5)] = 1.0e-39
    t[17, 100:180] = 0.0
    return t.to("cuda")


def _check_same_bits(option, cfg, scattered=False):
    """For a large-M kernel option that must not change the bits, the kernel of ``cfg`` with
    ``option`` off then on at several token blocks, tokens past M, rows past the last tile and
    odd K (escapes or none, a bias; ``scattered``: also escapes scattered over every row): the
    same bits, within the error budget."""
    run = _wgl_toggle(option, cfg)
    cases = [(4096, 4096, 300, True), (2000, 200, 513, False), (1000, 1001, 777, True)]
    for n, k, m, esc in cases + ([(1536, 3000, 520, None)] if scattered else []):
        t = (_scattered_escapes(n, k, n + k) if esc is None
             else make_weight(n, k, seed=n + k + m, escapes=esc, device="cuda"))
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        off, y = run(x, pw, bias, False), run(x, pw, bias, True)
        assert torch.equal(off.view(torch.int16), y.view(torch.int16)), f"{n}x{k} M={m}"
        assert_within_budget(y, x, t, _ref(x, t, bias), bias)


def _check_off_on(option, cfg, rel, col, make_x=None):
    """For a large-M kernel option that changes the bits but not the budget, the kernel of
    ``cfg`` with ``option`` off then on at awkward sizes (escapes with NaN/inf rows or none,
    bias or none, tokens past M, rows past the last tile, odd K): on within the error budget
    and the same bits on a rerun; non-finite where off is, elsewhere within ``rel`` of off's
    output plus ``col`` of its output column's largest; an inf or NaN activation non-finite
    alike, its rows wholly non-finite."""
    run = _wgl_toggle(option, cfg)
    for n, k, m, esc in ((4096, 4096, 300, True), (2000, 200, 513, False),
                         (1000, 1001, 129, True), (1024, 8192, 256, False)):
        t = make_weight(n, k, seed=n + k + m, escapes=esc, device="cuda")
        x = (make_x or (lambda m, k: torch.randn(m, k, device="cuda").to(torch.bfloat16)))(m, k)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        for b in (bias, None):
            off, y = run(x, pw, b, False), run(x, pw, b, True)
            assert torch.equal(y.view(torch.int16), run(x, pw, b, True).view(torch.int16))
            assert_within_budget(y, x, t, _ref(x, t, b), b)
            fin = torch.isfinite(off)
            assert torch.equal(fin, torch.isfinite(y)), f"{n}x{k} M={m} non-finite"
            w, v = off.float().where(fin, 0.0), y.float().where(fin, 0.0)
            tol = w.abs() * rel + w.abs().amax(dim=0, keepdim=True) * col
            assert ((v - w).abs() <= tol).all(), f"{n}x{k} M={m}"
        bad = x.clone()
        bad[3, 5] = float("inf")
        bad[7, 9] = float("nan")
        off, y = run(bad, pw, None, False), run(bad, pw, None, True)
        assert torch.equal(torch.isfinite(y), torch.isfinite(off)), f"{n}x{k} non-finite"
        assert not torch.isfinite(y[3]).any() and not torch.isfinite(y[7]).any()


@pytest.mark.parametrize("cfg", [dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=2, a_regs=2),
                                 dict(block_m=128, warpgroups=1, x_stages=4, w_stages=6,
                                      splits=2, a_regs=0),
                                 dict(block_m=256, warpgroups=1, x_stages=5, w_stages=8,
                                      splits=2, a_regs=3),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7),
                                 dict(block_m=256, warpgroups=2, x_stages=4, w_stages=6,
                                      splits=1, a_regs=2, persist=1)])
def test_wgmma_large_kernel_narrow_partials(cfg):
    """``narrow``: the partial sums one block hands another (stream-K pieces, a two-range
    block's push) as 24-bit truncated floats: within the error budget, the same on a rerun,
    close to the float32 hand-over (a BF16 step, plus 2^-12 of an output row's scale where sums
    cancel), non-finite where it is, and an inf or NaN activation still gives non-finite
    outputs where float32 does."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")

    # (outputs of inf/NaN escape rows non-finite alike; elsewhere within a BF16 step of the
    # float32 hand-over's, plus 2^-12 of the output row's scale for sums that cancel)
    _check_off_on("narrow", cfg, rel=2.0 ** -7, col=2.0 ** -12)


@pytest.mark.parametrize("cfg", [dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=2, a_regs=2),
                                 dict(block_m=256, warpgroups=1, x_stages=5, w_stages=8,
                                      splits=2, a_regs=3),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7),
                                 dict(block_m=128, warpgroups=2, x_stages=8, w_stages=8,
                                      splits=1, a_regs=1),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, tail=2, wave=3)])
def test_wgmma_large_kernel_xorder(cfg):
    """``xorder``: the activations copied straight from x (no image pass), each column summed
    in x's K order: within the error budget (weights with patched and NaN/inf escapes, bias,
    tokens past M, rows past the last tile, K not a multiple of 64 read from a wider row),
    the same bits on a rerun and under CUDA-graph replay, close to the image pass's sums, and
    an inf or NaN activation still gives non-finite outputs where the image pass does."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")

    def make_x(m, k):
        width = -(-k // 8) * 8  # (a row stride the tensor copy can take)
        x = torch.randn(m, width, device="cuda").to(torch.bfloat16)[:, :k]
        assert cuda_large.xorder_applies(x, cfg["a_regs"], 0)
        return x

    _check_off_on("xorder", cfg, rel=2.0 ** -6, col=2.0 ** -10, make_x=make_x)
    run = _wgl_toggle("xorder", cfg)
    # CUDA-graph replay: the captured call reads the x it was captured with, in place
    t = make_weight(1024, 4096, seed=9, escapes=True, device="cuda")
    pw = prepare_weight(encoded(t))
    x = torch.randn(256, 4096, device="cuda").to(torch.bfloat16)
    want = run(x, pw, None, True).view(torch.int16).clone()
    run(x, pw, None, True)  # (compiled and warm before capture)
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = run(x, pw, None, True)
    x.copy_(torch.randn(256, 4096, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), run(x, pw, None, True).view(torch.int16))
    assert not torch.equal(out.view(torch.int16), want)


@pytest.mark.parametrize("cfg", [dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=2, a_regs=2, xorder=True),
                                 dict(block_m=128, warpgroups=1, x_stages=4, w_stages=6,
                                      splits=3, a_regs=0),
                                 dict(block_m=256, warpgroups=1, x_stages=5, w_stages=8,
                                      splits=2, a_regs=3),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, tail=2, wave=3),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7, xorder=True),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, tail=1, wave=3)])
def test_wgmma_large_kernel_wreuse(cfg):
    """``wreuse``: the token blocks of one tile block launched next to each other (their block
    order remapped in the kernel; K in one to three ranges, a tail launch) gives the same bits
    as the grid's order at several token blocks, tokens past M, rows past the last tile and odd
    K; stream-K with its units ordered token block outermost (the whole launch, or a tail of
    stream-K) cuts the units elsewhere, so there: within the error budget, the same on a rerun,
    close to the tile-major order's sums and non-finite where they are."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    if cfg.get("persist") or cfg.get("tail") == 1:
        _check_off_on("wreuse", cfg, rel=2.0 ** -7, col=2.0 ** -12)
        return
    _check_same_bits("wreuse", cfg)


@pytest.mark.parametrize("cfg", [dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, wreuse=True),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7, xorder=True),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, tail=2, wave=3),
                                 dict(block_m=256, warpgroups=2, x_stages=4, w_stages=6,
                                      splits=2, a_regs=2),
                                 dict(block_m=128, warpgroups=2, x_stages=4, w_stages=8,
                                      splits=2, a_regs=1),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, mcast=1)])
def test_wgmma_large_kernel_l2hint(cfg):
    """``l2hint``: the bulk copies with L2 eviction hints (activations kept, weights evicted
    first) give the same bits as without (stream-K with wreuse or xorder, a tail launch, two K
    ranges, the register and shared-memory operands, multicast, whose activation copies take
    no hint), at several token blocks, tokens past M, rows past the last tile and odd K."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    _check_same_bits("l2hint", cfg)


@pytest.mark.parametrize("cfg", [dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, persist=1, grid_cap=7, xorder=True),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=1, a_regs=2, tail=2, wave=3),
                                 dict(block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                      splits=2, a_regs=2),
                                 dict(block_m=256, warpgroups=1, x_stages=5, w_stages=8,
                                      splits=2, a_regs=3, xorder=True),
                                 dict(block_m=128, warpgroups=2, x_stages=8, w_stages=8,
                                      splits=3, a_regs=1)])
def test_wgmma_large_kernel_escnext(cfg):
    """``escnext``: each warp keeping its next escape column and skipping the escape check
    before it gives the same bits as checking every column (stream-K over several segments,
    with xorder, a tail launch, two and three K ranges, the interleaved warpgroups), with
    escapes in one row's run, scattered over every row, or none."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    _check_same_bits("escnext", cfg, scattered=True)


@pytest.mark.parametrize("x_stages,w_stages,grid_cap", [(5, 5, None), (4, 6, None), (5, 5, 3),
                                                      (4, 6, 7), (5, 5, 1)])
def test_wgmma_large_kernel_stream_k(x_stages, w_stages, grid_cap):
    """``persist`` (stream-K): blocks taking shares of all (unit, column) steps, units cut
    between blocks (``grid_cap`` 3 and 7 cut nearly every unit, into pieces down to one
    column, and make every block walk many units; stage counters and barrier phases running
    on across them), outputs stored from the accumulators: within budget at awkward sizes
    (rows past the last tile, odd K, tokens past M, several token blocks, NaN/inf escapes,
    bias), bit-identical when run again and under CUDA-graph replay (the piece flags left
    cleared by every call); where no unit is cut (one block for all), the bits of the same
    configuration launched one block a unit."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")

    def run_with(persist, cap=grid_cap):
        def run(x, pw, bias, out):
            return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                       pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                       pw.esc_entry, pw.esc_fix,
                                       bias, pw.n, pw.k, block_m=256, warpgroups=2,
                                       x_stages=x_stages, w_stages=w_stages, splits=1,
                                       a_regs=2, persist=persist, grid_cap=cap, out=out)
        return run

    shapes = ((300, 1001, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70),
              (2000, 200, 513))
    _check_large_kernel(run_with(1), shapes)
    for n, k, m in shapes:
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        outs = []
        for persist, cap in ((0, None), (1, 1)):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            run_with(persist, cap)(x, pw, bias, out)
            outs.append(out.view(torch.int16))
        assert torch.equal(outs[0], outs[1]), f"{n}x{k} M={m}: one block changes the bits"
        eager = run_with(1)(x, pw, bias, None).view(torch.int16).clone()
        static = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run_with(1)(static, pw, bias, None)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = run_with(1)(static, pw, bias, None)
        for i in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y.view(torch.int16), eager), f"{n}x{k} M={m} replay {i}"


@pytest.mark.parametrize("blocks", [2, 9, 40])
def test_wgmma_large_kernel_stream_k_any_cuts(blocks):
    """Stream-K with the blocks' steps cut anywhere (``cuts``: random increasing cuts, blocks
    of one step, units cut into many pieces): within budget at awkward sizes, bit-identical
    when run again; the equal cuts passed as ``cuts`` give the bits of ``weighted`` False, and
    the model's weighted cuts (the default) are within budget too. Bad cuts raise."""
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    gen = random.Random(blocks)

    def run_with(**kw):
        def run(x, pw, bias, out):
            return cuda_large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                       pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                       pw.esc_entry, pw.esc_fix, bias, pw.n, pw.k,
                                       block_m=256, warpgroups=2, x_stages=5, w_stages=5,
                                       splits=1, a_regs=2, persist=1, grid_cap=blocks,
                                       out=out, **kw)
        return run

    for n, k, m in ((300, 1001, 129), (2000, 200, 513), (1000, 4096, 256)):
        steps = -(-n // 128) * -(-m // 256) * -(-k // 64)
        if steps < blocks:
            continue
        cuts = (0, *sorted(gen.sample(range(1, steps), blocks - 1)), steps)
        _check_large_kernel(run_with(cuts=cuts), [(n, k, m)])
        _check_large_kernel(run_with(), [(n, k, m)])
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        equal = tuple(steps * b // blocks for b in range(blocks + 1))
        a = run_with(cuts=equal)(x, pw, None, None).view(torch.int16)
        b = run_with(weighted=False)(x, pw, None, None).view(torch.int16)
        assert torch.equal(a, b), f"{n}x{k} M={m}: equal cuts given differ from equal shares"
        with pytest.raises(ValueError, match="do not cut"):
            run_with(cuts=(0, *equal[2:]))(x, pw, None, None)
        with pytest.raises(ValueError, match="do not cut"):
            run_with(cuts=(0, *equal[1:-1], steps + 1))(x, pw, None, None)


def test_prefill_rows_through_the_large_table():
    """Rows through ``w12_linear`` in every M class of the shipped large-M table above 256, on
    the smallest shape whose entry in that class is the warpgroup kernel (300 and 1000 rows up
    to the 1024-row class, then the class's size less 48): the launcher takes that entry, and
    the result is within budget and bit-identical when run again."""
    from w12_kernels.gemm import config as cfgs
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    rule = cfgs.large_rule(cfgs.current_gpu())  # (this GPU's view: its section, if any)
    classes = sorted({int(c) for by_m in rule["shapes"].values() for c in by_m if int(c) > 256})
    assert 1024 in classes
    points = []
    for cls in classes:
        shapes = [tuple(map(int, shape.split("x"))) for shape, by_m in rule["shapes"].items()
                  if by_m.get(str(cls), {}).get("kind") == "wgmma"]
        n, k = min(shapes, key=lambda s: s[0] * s[1])
        for m in ((300, 1000) if cls == 1024 else (cls - 48,)):
            assert cfgs.large_config(n, k, m).kind == "wgmma"
            points.append((n, k, m))

    def run(x, pw, bias, out):
        out.copy_(w12_linear(x, pw, bias))

    _check_large_kernel(run, points)


def test_first_large_table_lookup_inside_graph_capture():
    """The large-M table's first lookup of a process (the GPU's name read to pick its section)
    happening inside CUDA-graph capture: the capture succeeds and its replays give the bits of
    the eager call."""
    from w12_kernels.gemm import config as cfgs

    t, x = _inputs(4096, 4096, 512, seed=23)
    pw = prepare_weight(encoded(t))
    static_x = x.clone()
    cfgs._gpu_name.cache_clear()
    cfgs.large_rule.cache_clear()
    launcher._has_wgmma()  # (loading the kernels is not a table lookup; warm it outside)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            static_y = w12_linear(static_x, pw)
    except RuntimeError:
        # kernels compiled on first use cannot start inside a capture: warm them, capture again
        torch.cuda.synchronize()
        w12_linear(static_x, pw)
        cfgs._gpu_name.cache_clear()
        cfgs.large_rule.cache_clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            static_y = w12_linear(static_x, pw)
    torch.cuda.current_stream().wait_stream(stream)
    eager = w12_linear(x, pw)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y.view(torch.int16), eager.view(torch.int16))


def _table_entries(min_class: int) -> list[dict]:
    """The distinct warpgroup-kernel entries of the shipped large-M table in its M classes of
    ``min_class`` rows and more, its GPUs' sections included (read at collection: the table is
    part of the package)."""
    from w12_kernels.gemm import config as cfgs

    large = json.loads(cfgs.TUNED_PATH.read_text()).get("large", {})
    seen = []
    for by_m in [*large.get("shapes", {}).values(),
                 *(v for sec in large.get("by_device", {}).values()
                   for v in sec.get("shapes", {}).values())]:
        for cls, entry in by_m.items():
            if int(cls) >= min_class and entry.get("kind") == "wgmma" and entry not in seen:
                seen.append(entry)
    return seen


@pytest.mark.parametrize("entry", _table_entries(256),
                         ids=lambda e: "_".join(f"{k}{v}" for k, v in e.items() if k != "kind"))
def test_table_entries_over_eight_token_blocks(entry, monkeypatch):
    """Every warpgroup entry of the table's 256-row and larger classes, every GPU model's section
    included (stream-K, xorder, the tail launches, wreuse, l2hint: an H200 section's entries are
    run on whatever Hopper GPU runs the tests), taken by ``w12_linear`` for 1999-2000 rows:
    eight token blocks of 256, more than any class uses. Within budget (escapes, NaN/inf, bias) and
    bit-identical when run again, on a shape with a partial last wave and on one of a single
    wave with rows past the last tile and K not a multiple of 64."""
    from w12_kernels.gemm import config as cfgs
    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    default = {**cfgs.large_rule()["default"], "persist": 0, "tail": 0, "mcast": 0,
               "xorder": 0, "wreuse": 0, "l2hint": 0, **entry}
    monkeypatch.setattr(cfgs, "large_rule",
                        lambda *_: {"default": default, "max_m": 4096, "shapes": {}})
    calls, wgl = [], cuda_large.gemm_wgl

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return wgl(*args, **kwargs)

    monkeypatch.setattr(cuda_large, "gemm_wgl", spy)

    def run(x, pw, bias, out):
        out.copy_(w12_linear(x, pw, bias))

    _check_large_kernel(run, ((4096, 4096, 2000), (1000, 1000, 1999)))
    assert calls and all(c["persist"] == entry.get("persist", 0)
                         and c["tail"] == entry.get("tail", 0) for c in calls)


def test_invariant_rows_64_sends_prefill_rows_to_the_large_table(monkeypatch):
    """Inside ``invariant_rows(64)`` (or with ``invariant_rows=64`` passed to the call), 65..128
    rows of a tuned shape run its 128-row warpgroup entry (within budget, bit-identical when run
    again); outside, the two small-kernel passes (each row the bits it gets alone)."""
    from w12_kernels.gemm import cuda_large, invariant_rows

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    calls, wgl = [], cuda_large.gemm_wgl

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return wgl(*args, **kwargs)

    monkeypatch.setattr(cuda_large, "gemm_wgl", spy)
    t, x = _inputs(4096, 4096, 128, seed=7)
    pw = prepare_weight(encoded(t))
    for m in (65, 100, 128):
        alone = torch.cat([w12_linear(x[i : i + 1], pw) for i in range(m)])
        assert torch.equal(w12_linear(x[:m], pw).view(torch.int16), alone.view(torch.int16))
        assert not calls
        with invariant_rows(64):
            got = w12_linear(x[:m], pw)
            again = w12_linear(x[:m], pw)
        per_call = w12_linear(x[:m], pw, invariant_rows=64)  # (the SGLang plugin's way)
        assert len(calls) == 3 and calls[0]["block_m"] == 128
        calls.clear()
        assert_within_budget(got, x[:m], t, _ref(x[:m], t))
        assert torch.equal(got.view(torch.int16), again.view(torch.int16))
        assert torch.equal(per_call.view(torch.int16), got.view(torch.int16))


def test_wgmma_stage_images():
    """The activation images on the GPU equal the CPU statement of their layout."""
    from stage_image import stage_images

    from w12_kernels.gemm import cuda_large

    if not cuda_large.available():
        pytest.skip("needs a compute-capability 9.0 GPU and CuPy")
    base = torch.randn(300, 152, device="cuda").to(torch.bfloat16)
    # rows 4-byte aligned, and (one column in) not: the pairs path and the 2-byte path; tokens
    # past M and the columns past K = 150 of the last chunk come out as zeros
    for x in (base[:70, :150], base[:, 1:151]):
        for block_m in (64, 128, 192, 256):
            got = cuda_large.permute_x(x, 3, block_m).view(torch.int16).cpu()
            want = stage_images(x.cpu(), 3, block_m).view(torch.int16)
            assert torch.equal(got, want)


def test_backend_is_reported():
    assert launcher.backend() in ("cuda", "triton", "torch")


@pytest.mark.parametrize("m", [1, 5, 64, 200])
def test_deterministic(m):
    t, x = _inputs(4096, 4096, m, seed=11)
    pw = prepare_weight(encoded(t))
    first = w12_linear(x, pw)
    for _ in range(20):
        assert torch.equal(w12_linear(x, pw).view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("n,k", [(4096, 4096), (28672, 4096), (1000, 300)])
def test_batch_invariant_up_to_128_rows(n, k):
    t, x = _inputs(n, k, 128, seed=13)
    pw = prepare_weight(encoded(t))
    full = w12_linear(x, pw).view(torch.int16)
    for m in (1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 127):
        part = w12_linear(x[:m].contiguous(), pw).view(torch.int16)
        assert torch.equal(part, full[:m]), f"M={m}"
    perm = torch.randperm(128, device="cuda")
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


@needs_cupy
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_tensors_on_another_gpu_than_the_current_one():
    """The kernels run on the GPU that holds the tensors, not on CuPy's or torch's current one."""
    t, x = _inputs(1000, 3000, 17, seed=31)
    pw = prepare_weight(encoded(t))
    want = w12_linear(x, pw)
    with torch.cuda.device(0):
        got = w12_linear(x.to("cuda:1"), pw.to("cuda:1"))
    assert got.device == torch.device("cuda:1")
    assert torch.equal(got.cpu().view(torch.int16), want.cpu().view(torch.int16))
