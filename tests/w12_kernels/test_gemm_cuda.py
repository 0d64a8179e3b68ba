"""GPU tests of the W12 GEMM kernels (skipped without CUDA): correctness at real sizes,
the decode kernel, determinism, batch invariance, torch.compile and CUDA graphs."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import dispatch, prepare_weight, table, w12_linear
from w12_kernels.gemm.cuda import runtime
from w12_kernels.gemm.decode import launcher as decode_launcher
from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.large.launcher import WglConfig
from w12_kernels.gemm.small import launcher as small

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_cupy = pytest.mark.skipif(not torch.cuda.is_available() or not runtime.available(),
                                reason="needs CuPy (NVRTC kernels)")
needs_wgl = pytest.mark.skipif(not torch.cuda.is_available() or not large.available(),
                               reason="needs a compute-capability 9.0 GPU and CuPy")

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


def _wgl(x, pw, bias, cfg: WglConfig, **kw):
    """The large-M kernel of ``cfg`` (``kw``: ``out`` and the tests' launch hooks)."""
    return large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_val,
                          pw.esc_delta, pw.esc_entry, pw.esc_fix, bias, pw.n, pw.k, cfg, **kw)


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
    """The small-M kernel at awkward splits and ring depths: within budget, every output
    written (the output starts as NaN)."""
    t, x = _inputs(1000, 3000, 40, seed=kw)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(1000, device="cuda").to(torch.bfloat16)
    for m in (1, 9, 40):
        out = torch.full((m, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
        small.gemm_small(x[:m], pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta,
                         bias, pw.n, pw.k, kw=kw, depth=depth, out=out)
        assert_within_budget(out, x[:m], t, _ref(x[:m], t, bias), bias)


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
        want = small.gemm_small(*args, kw=5, depth=2)
        got = small.gemm_small(*args, kw=5, depth=depth, tiles=tiles, min_blocks=min_blocks,
                               x_stages=x_stages, groups=groups, w_stages=w_stages)
        assert_within_budget(got, x[:m], t, _ref(x[:m], t, bias), bias)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m}"


@needs_cupy
@pytest.mark.parametrize("kw,cluster,tiles,min_blocks,groups,depth",
                         [(8, 2, 1, 4, 1, 1), (8, 2, 2, 4, 1, 1), (8, 4, 2, 8, 1, 1),
                          (8, 2, 3, 2, 1, 1), (6, 2, 2, 2, 1, 2), (4, 4, 1, 8, 2, 1),
                          (16, 2, 2, 1, 1, 1), (16, 4, 1, 4, 2, 2)])
def test_small_kernel_clusters_change_no_bits(kw, cluster, tiles, min_blocks, groups, depth):
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
        want = small.gemm_small(*args, kw=kw, depth=2)
        got = torch.full((m, 1000), float("nan"), device="cuda", dtype=torch.bfloat16)
        small.gemm_small(*args, kw=kw, depth=depth, tiles=tiles, min_blocks=min_blocks,
                         groups=groups, cluster=cluster, out=got)
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
        want = small.gemm_small(*args, kw=16, depth=2)
        assert_within_budget(want, x[:m], t, _ref(x[:m], t, None), None)
        layouts = [dict(depth=1, w_stages=3, groups=2), dict(depth=2, tiles=2, min_blocks=2)]
        if m <= 16:  # 16 warps' activation stages fit the shared memory up to 16 rows
            layouts.append(dict(depth=1, x_stages=3, w_stages=3))
        for lay in layouts:
            got = small.gemm_small(*args, kw=16, **lay)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"M={m} {lay}"


@needs_cupy
def test_decode_kernel_is_exact():
    for n, k in [(513, 1000), (37, 77), (16, 64), (40, 4096)]:
        t = make_weight(n, k, seed=3, device="cuda")
        pw = prepare_weight(encoded(t))
        d = decode_launcher.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, n, k)
        assert torch.equal(d.view(torch.int16), t.view(torch.int16)), f"{n}x{k}"
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    t = every.reshape(256, 256).cuda()
    pw = prepare_weight(encoded(t))
    d = decode_launcher.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, 256, 256)
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
    want = emu.gemm_small(x, pw, bias, kw=3, depth=2)
    pw_gpu = pw.to("cuda")
    got = small.gemm_small(x.cuda(), pw_gpu.chunks, pw_gpu.scale, pw_gpu.esc_rowptr,
                           pw_gpu.esc_col, pw_gpu.esc_delta, bias.cuda(), 70, 300, kw=3,
                           depth=2).cpu()
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    finite = ~torch.isnan(want)
    assert torch.equal(got.view(torch.int16)[finite], want.view(torch.int16)[finite])


@pytest.mark.parametrize("m", [1, 17, 64, 65])
def test_triton_fallback_on_the_gpu(m):
    """The Triton kernels (used where CuPy is missing) at a real size, and their decode."""
    pytest.importorskip("triton")
    from w12_kernels.gemm.triton import launcher as triton_launcher

    t, x = _inputs(4096, 4096, m, seed=23)
    pw = prepare_weight(encoded(t))
    bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
    out = triton_launcher.gemm(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row, pw.esc_col,
                               pw.esc_delta, bias, pw.n, pw.k, kw=4)
    assert_within_budget(out, x, t, _ref(x, t, bias), bias)
    d = triton_launcher.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, 4096,
                               4096)
    assert torch.equal(d.view(torch.int16), t.view(torch.int16))


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


def _graph_replay(run, x, next_x) -> tuple[torch.Tensor, torch.Tensor]:
    """``run(x)`` captured in a CUDA graph (run once before on the capture's stream, so that
    stream-K's work memory is made there), replayed on ``next_x`` copied into the captured
    input: (the replay's output, the eager output on ``next_x``)."""
    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y = run(static)
    static.copy_(next_x)
    graph.replay()
    torch.cuda.synchronize()
    return y, run(next_x)


WGL_CONFIGS = [WglConfig(128, 2, 4, 8, 2, 1), WglConfig(64, 1, 3, 2, 1, 1),
               WglConfig(256, 2, 4, 6, 1, 1), WglConfig(192, 2, 3, 3, 4, 1),
               WglConfig(256, 2, 4, 6, 1, 2), WglConfig(256, 2, 4, 6, 2, 2),
               WglConfig(128, 2, 4, 8, 4, 2), WglConfig(256, 2, 5, 5, 1, 2),
               WglConfig(256, 2, 5, 5, 2, 2), WglConfig(128, 2, 8, 8, 2, 1),
               WglConfig(256, 2, 4, 5, 4, 2),
               # K in three ranges: token shares that do not divide the block
               WglConfig(256, 2, 5, 5, 3, 2), WglConfig(128, 2, 8, 8, 3, 1),
               # one MMA warpgroup (two blocks a multiprocessor for the last two)
               WglConfig(256, 1, 5, 8, 2, 1), WglConfig(256, 1, 5, 8, 1, 1),
               WglConfig(128, 1, 6, 12, 2, 1), WglConfig(128, 1, 4, 5, 1, 1),
               WglConfig(128, 1, 4, 5, 2, 1),
               # two MMA warpgroups on one 64-row group, every other column each
               WglConfig(256, 1, 5, 8, 1, 3), WglConfig(256, 1, 5, 8, 2, 3),
               WglConfig(256, 1, 5, 6, 3, 3), WglConfig(128, 1, 4, 5, 4, 3),
               WglConfig(64, 1, 3, 2, 1, 3),
               # 64 tokens, two warpgroups of 64 rows
               WglConfig(64, 2, 4, 4, 1, 1)]


@needs_wgl
@pytest.mark.parametrize("cfg", WGL_CONFIGS, ids=lambda c: c.kernel_name)
def test_wgmma_large_kernel(cfg):
    """The warpgroup-MMA kernel for many rows (large/kernels.cu) at awkward sizes: within
    budget (escapes, NaN/inf, bias included; rows, columns and tokens not multiples of the
    block; K ranges shorter than the stages), bit-identical when run again."""
    def run(x, pw, bias, out):
        _wgl(x, pw, bias, cfg, out=out)

    _check_large_kernel(run, ((300, 1000, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70),
                              (200, 200, 3)))


@needs_wgl
@pytest.mark.parametrize("cfg", [WglConfig(256, 2, 5, 5, 1, 2), WglConfig(256, 2, 5, 5, 3, 2),
                                 WglConfig(128, 2, 8, 8, 2, 1)], ids=lambda c: c.kernel_name)
def test_wgmma_large_kernel_after_its_image_pass(cfg):
    """The GEMM starts while its image pass runs (programmatic dependent launch) and waits for
    the images before it copies them: back-to-back calls whose images land where the previous
    call's (other activations) were give each call's own bits, eager and replayed in a CUDA
    graph."""
    for n, k, m in ((300, 1001, 129), (4096, 4096, 300), (1, 64, 70)):
        t, _ = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        xs = [_inputs(n, k, m, seed=n + m + s)[1] for s in range(4)]
        alone = []
        for x in xs:  # each call alone
            alone.append(_wgl(x, pw, bias, cfg).view(torch.int16).clone())
            torch.cuda.synchronize()
        outs = [_wgl(x, pw, bias, cfg) for x in xs]  # back to back, images reusing memory
        for i, out in enumerate(outs):
            assert torch.equal(out.view(torch.int16), alone[i]), f"{n}x{k} M={m} call {i}"
        assert_within_budget(outs[0], xs[0], t, _ref(xs[0], t, bias), bias)
        y, eager = _graph_replay(lambda x, pw=pw, bias=bias: _wgl(x, pw, bias, cfg), xs[0],
                                 xs[1])
        assert torch.equal(y.view(torch.int16), eager.view(torch.int16)), f"{n}x{k} graph"


@needs_wgl
@pytest.mark.parametrize("cfg", [WglConfig(256, 2, 5, 5, 1, 2), WglConfig(256, 2, 5, 5, 3, 2),
                                 WglConfig(256, 1, 5, 8, 2, 1), WglConfig(128, 2, 8, 8, 2, 1),
                                 WglConfig(192, 2, 3, 3, 4, 1), WglConfig(256, 1, 5, 8, 2, 3),
                                 WglConfig(256, 1, 5, 8, 1, 3), WglConfig(256, 2, 5, 5, 2, 2),
                                 WglConfig(128, 1, 4, 6, 2, 1), WglConfig(persist=True),
                                 WglConfig(x_stages=4, w_stages=6, persist=True)],
                         ids=lambda c: c.kernel_name)
def test_wgmma_large_kernel_row_group_stores(cfg):
    """The epilogue's 16-byte store paths (N a multiple of 8, the output 16-byte aligned, no row
    of the block with corrections: 8 rows of one token a thread; with two K ranges each block
    keeping its own share of tokens and storing through a staging tile; stream-K's last segment
    through a staging tile) give the bits of the paths an output one element off alignment
    takes (a row a thread, the partial tile of both ranges, stream-K's stores from the
    accumulators): weights with and without escapes (NaN/inf rows send their blocks to the
    other paths), token counts past the block, K ranges of a cluster."""
    for n, k, m, esc in ((4096, 4096, 300, True), (2048, 1024, 513, False),
                         (512, 200, 70, True), (8, 64, 3, False), (1000, 4160, 70, False),
                         (300, 256, 256, False)):
        t = make_weight(n, k, seed=n + k, escapes=esc, device="cuda")
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        outs = []
        for off in (0, 1):  # aligned, then one element off
            buf = torch.full((m * n + 8,), float("nan"), device="cuda", dtype=torch.bfloat16)
            out = buf[off:off + m * n].view(m, n)
            for b in (bias, None):
                _wgl(x, pw, b, cfg, out=out)
                outs.append(out.view(torch.int16).clone())
                assert_within_budget(out, x, t, _ref(x, t, b), b)
        assert torch.equal(outs[0], outs[2]), f"{n}x{k} M={m}: the paths differ (bias)"
        assert torch.equal(outs[1], outs[3]), f"{n}x{k} M={m}: the paths differ (no bias)"


@needs_wgl
@pytest.mark.parametrize("cfg", [WglConfig(tail=2), WglConfig(tail=3),
                                 WglConfig(x_stages=4, w_stages=6, tail=4),
                                 WglConfig(128, 2, 4, 8, 1, 1, tail=2), WglConfig(tail=1),
                                 WglConfig(x_stages=4, w_stages=6, tail=1)],
                         ids=lambda c: f"{c.kernel_name}_t{c.tail}")
def test_wgmma_large_kernel_tail(cfg):
    """``tail``: the tile blocks of whole waves (``wave`` set small so that small shapes have
    several) in one launch with one K range, the rest in a second launch with K in ``tail``
    ranges (``tail`` 1: stream-K over the tail's units): rows before the tail carry the bits of
    the one-launch kernel, rows of the tail those of the ``tail``-range kernel (stream-K: its
    own, the same when run again); within budget, eager and replayed in a CUDA graph."""
    ran = 0
    for n, k, m, wave in ((300, 1001, 129, 2), (4096, 4096, 300, 20), (2000, 200, 513, 20),
                          (4100, 72, 70, 30)):
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        tile_blocks = math.ceil(math.ceil(n / 16) / (4 * cfg.warpgroups))
        first = large.tail_plan(tile_blocks, math.ceil(m / cfg.block_m), wave, cfg.tail)
        if first is None:
            continue
        ran += 1
        rows = first * 64 * cfg.warpgroups

        def run(x, c=cfg, pw=pw, bias=bias, wave=wave):
            return _wgl(x, pw, bias, c, wave=wave)

        one = run(x, replace(cfg, tail=0)).view(torch.int16)
        split = (run(x).view(torch.int16).clone() if cfg.tail == 1
                 else run(x, cfg.tail_config()).view(torch.int16))
        got = run(x)
        assert_within_budget(got, x, t, _ref(x, t, bias), bias)
        bits = got.view(torch.int16)
        assert torch.equal(bits[:, :rows], one[:, :rows]), f"{n}x{k} M={m}: whole waves"
        assert torch.equal(bits[:, rows:], split[:, rows:]), f"{n}x{k} M={m}: the tail"
        y, eager = _graph_replay(run, x, _inputs(n, k, m, seed=n + m + 1)[1])
        assert torch.equal(y.view(torch.int16), eager.view(torch.int16)), f"{n}x{k} graph"
    assert ran, "no shape of the test has a tail at this configuration"


def _toggle(option, cfg):
    """``run(x, pw, bias, on)``: the large-M kernel of ``cfg`` with ``option`` off or on (the
    launch hooks ``grid_cap`` and ``wave`` of ``cfg``, a dict, passed as such)."""
    hooks = {key: cfg[key] for key in ("grid_cap", "wave") if key in cfg}
    base = WglConfig(**{key: v for key, v in cfg.items() if key not in hooks})

    def run(x, pw, bias, on):
        return _wgl(x, pw, bias, replace(base, **{option: on}), **hooks)
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


def _check_same_bits(option, cfg):
    """For a large-M kernel option that must not change the bits, the kernel of ``cfg`` with
    ``option`` off then on at several token blocks, tokens past M, rows past the last tile and
    odd K (escapes in one row's run, scattered over every row, or none; a bias): the same bits,
    within the error budget."""
    run = _toggle(option, cfg)
    for n, k, m, esc in ((4096, 4096, 300, True), (2000, 200, 513, False),
                         (1000, 1001, 777, True), (1536, 3000, 520, None)):
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
    run = _toggle(option, cfg)
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


@needs_wgl
@pytest.mark.parametrize("cfg", [dict(splits=2), dict(warpgroups=1, w_stages=8, splits=2,
                                                      a_regs=3),
                                 dict(persist=True, grid_cap=7),
                                 dict(block_m=128, x_stages=8, w_stages=8, a_regs=1),
                                 dict(tail=2, wave=3)], ids=str)
def test_wgmma_large_kernel_xorder(cfg):
    """``xorder``: the activations copied straight from x (no image pass), each column summed
    in x's K order: within the error budget (weights with patched and NaN/inf escapes, bias,
    tokens past M, rows past the last tile, K not a multiple of 64 read from a wider row),
    the same bits on a rerun and under CUDA-graph replay, close to the image pass's sums, and
    an inf or NaN activation still gives non-finite outputs where the image pass does."""
    def make_x(m, k):
        width = -(-k // 8) * 8  # (a row stride the tensor copy can take)
        x = torch.randn(m, width, device="cuda").to(torch.bfloat16)[:, :k]
        assert large.xorder_applies(x)
        return x

    _check_off_on("xorder", cfg, rel=2.0 ** -6, col=2.0 ** -10, make_x=make_x)
    run = _toggle("xorder", cfg)
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


@needs_wgl
@pytest.mark.parametrize("cfg", [dict(), dict(splits=2, xorder=True),
                                 dict(block_m=128, warpgroups=1, x_stages=4, w_stages=6,
                                      splits=3, a_regs=1),
                                 dict(warpgroups=1, w_stages=8, splits=2, a_regs=3),
                                 dict(tail=2, wave=3), dict(persist=True),
                                 dict(persist=True, grid_cap=7, xorder=True),
                                 dict(tail=1, wave=3)], ids=str)
def test_wgmma_large_kernel_wreuse(cfg):
    """``wreuse``: the token blocks of one tile block launched next to each other (their block
    order remapped in the kernel; K in one to three ranges, a tail launch) gives the same bits
    as the grid's order at several token blocks, tokens past M, rows past the last tile and odd
    K; stream-K with its units ordered token block outermost (the whole launch, or a tail of
    stream-K) cuts the units elsewhere, so there: within the error budget, the same on a rerun,
    close to the tile-major order's sums and non-finite where they are."""
    if cfg.get("persist") or cfg.get("tail") == 1:
        _check_off_on("wreuse", cfg, rel=2.0 ** -7, col=2.0 ** -12)
        return
    _check_same_bits("wreuse", cfg)


@needs_wgl
@pytest.mark.parametrize("cfg", [dict(persist=True, wreuse=True), dict(persist=True, grid_cap=7),
                                 dict(persist=True, grid_cap=7, xorder=True),
                                 dict(tail=2, wave=3), dict(x_stages=4, w_stages=6, splits=2),
                                 dict(block_m=128, x_stages=4, w_stages=8, splits=2, a_regs=1),
                                 dict(warpgroups=1, w_stages=8, splits=2, a_regs=3,
                                      xorder=True)], ids=str)
def test_wgmma_large_kernel_l2hint(cfg):
    """``l2hint``: the copies with L2 eviction hints (activations kept, weights evicted first)
    give the same bits as without (stream-K with wreuse or xorder, a tail launch, two K
    ranges, the producer warp and the interleaved warpgroups), at several token blocks, tokens
    past M, rows past the last tile and odd K, escapes scattered over every row or none."""
    _check_same_bits("l2hint", cfg)


@needs_wgl
@pytest.mark.parametrize("x_stages,w_stages,grid_cap", [(5, 5, None), (4, 6, None), (5, 5, 3),
                                                      (4, 6, 7), (5, 5, 1)])
def test_wgmma_large_kernel_stream_k(x_stages, w_stages, grid_cap):
    """``persist`` (stream-K): blocks taking shares of all (unit, column) steps, units cut
    between blocks (``grid_cap`` 3 and 7 cut nearly every unit, into pieces down to one
    column, and make every block walk many units; stage counters and barrier phases running
    on across them): within budget at awkward sizes (rows past the last tile, odd K, tokens
    past M, several token blocks, NaN/inf escapes, bias), bit-identical when run again and
    under CUDA-graph replay (the piece flags left cleared by every call); where no unit is
    cut (one block for all), the bits of the same configuration launched one block a unit."""
    cfg = WglConfig(x_stages=x_stages, w_stages=w_stages, persist=True)

    def run(x, pw, bias, out):
        return _wgl(x, pw, bias, cfg, grid_cap=grid_cap, out=out)

    shapes = ((300, 1001, 129), (4096, 4096, 300), (130, 72, 1000), (1, 64, 70),
              (2000, 200, 513))
    _check_large_kernel(run, shapes)
    for n, k, m in shapes:
        t, x = _inputs(n, k, m, seed=n + m)
        pw = prepare_weight(encoded(t))
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        one_block = _wgl(x, pw, bias, cfg, grid_cap=1).view(torch.int16)
        plain = _wgl(x, pw, bias, WglConfig(x_stages=x_stages, w_stages=w_stages))
        assert torch.equal(one_block, plain.view(torch.int16)), \
            f"{n}x{k} M={m}: one block changes the bits"
        eager = run(x, pw, bias, None).view(torch.int16).clone()
        y, again = _graph_replay(lambda x, pw=pw, bias=bias: run(x, pw, bias, None), x, x)
        assert torch.equal(y.view(torch.int16), eager), f"{n}x{k} M={m} replay"
        assert torch.equal(again.view(torch.int16), eager), f"{n}x{k} M={m} rerun"


@needs_wgl
@pytest.mark.parametrize("blocks", [2, 9, 40])
def test_wgmma_large_kernel_stream_k_any_cuts(blocks):
    """Stream-K with the blocks' steps cut anywhere (``cuts``: random increasing cuts, blocks
    of one step, units cut into many pieces): within budget at awkward sizes, bit-identical
    when run again; the model's cuts (the default) are within budget too. Bad cuts raise."""
    gen = random.Random(blocks)

    def run_with(**kw):
        def run(x, pw, bias, out):
            return _wgl(x, pw, bias, WglConfig(persist=True), grid_cap=blocks, out=out, **kw)
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
        with pytest.raises(ValueError, match="do not cut"):
            run_with(cuts=(0, *equal[2:]))(x, pw, None, None)
        with pytest.raises(ValueError, match="do not cut"):
            run_with(cuts=(0, *equal[1:-1], steps + 1))(x, pw, None, None)


@needs_wgl
def test_prefill_rows_through_the_large_table():
    """Rows through ``w12_linear`` in every M class of the shipped large-M table above 256, on
    the smallest shape whose entry in that class is the warpgroup kernel (300 and 1000 rows up
    to the 1024-row class, then the class's size less 48): the dispatch takes that entry, and
    the result is within budget and bit-identical when run again."""
    rule = table.large_rule(table.gpu_key())  # (this GPU's view of the table)
    classes = sorted({int(c) for by_m in rule["shapes"].values() for c in by_m if int(c) > 256})
    assert 1024 in classes
    points = []
    for cls in classes:
        shapes = [tuple(map(int, shape.split("x"))) for shape, by_m in rule["shapes"].items()
                  if by_m.get(str(cls), {}).get("kind") == "wgmma"]
        n, k = min(shapes, key=lambda s: s[0] * s[1])
        for m in ((300, 1000) if cls == 1024 else (cls - 48,)):
            assert table.large_config(n, k, m) is not None
            points.append((n, k, m))

    def run(x, pw, bias, out):
        out.copy_(w12_linear(x, pw, bias))

    _check_large_kernel(run, points)


def test_first_large_table_lookup_inside_graph_capture():
    """The table's first lookup of a process (the GPU's key read to pick its sections)
    happening inside CUDA-graph capture: the capture succeeds and its replays give the bits of
    the eager call."""
    t, x = _inputs(4096, 4096, 512, seed=23)
    pw = prepare_weight(encoded(t))
    static_x = x.clone()

    def forget():
        table._gpu_key.cache_clear()
        table._large_rule.cache_clear()

    forget()
    dispatch._has_wgl()  # (loading the kernels is not a table lookup; warm it outside)
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
        forget()
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
    """The distinct warpgroup-kernel entries of the shipped table in its M classes of
    ``min_class`` rows and more, every section's (read at collection: the table is part of the
    package)."""
    sections = json.loads(table.TUNED_PATH.read_text())["sections"]
    seen = []
    for section in sections.values():
        for by_m in section.get("large", {}).get("shapes", {}).values():
            for cls, entry in by_m.items():
                if int(cls) >= min_class and entry.get("kind") == "wgmma" and entry not in seen:
                    seen.append(entry)
    return seen


@needs_wgl
@pytest.mark.parametrize("entry", _table_entries(256),
                         ids=lambda e: table.entry_config(e).kernel_name
                         + (f"_t{e['tail']}" if e["tail"] else ""))
def test_table_entries_over_eight_token_blocks(entry, monkeypatch):
    """Every warpgroup entry of the table's 256-row and larger classes, every section's
    (stream-K, xorder, the tail launches, wreuse, l2hint: an H200 section's entries run on
    whatever Hopper GPU runs the tests), taken by ``w12_linear`` for 1999-2000 rows: eight
    token blocks of 256, more than any class uses. Within budget (escapes, NaN/inf, bias) and
    bit-identical when run again, on a shape with a partial last wave and on one of a single
    wave with rows past the last tile and K not a multiple of 64."""
    monkeypatch.setattr(table, "large_rule",
                        lambda *_: {"default": entry, "max_m": 4096, "shapes": {}})
    calls, wgl = [], large.gemm_wgl

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return wgl(*args, **kwargs)

    monkeypatch.setattr(large, "gemm_wgl", spy)

    def run(x, pw, bias, out):
        out.copy_(w12_linear(x, pw, bias))

    _check_large_kernel(run, ((4096, 4096, 2000), (1000, 1000, 1999)))
    assert calls and all(c == table.entry_config(entry) for c in calls)


@needs_wgl
def test_invariant_rows_64_sends_prefill_rows_to_the_large_table(monkeypatch):
    """Inside ``invariant_rows(64)`` (or with ``invariant_rows=64`` passed to the call), 65..128
    rows of a tuned shape run its 128-row warpgroup entry (within budget, bit-identical when run
    again); outside, the two small-kernel passes (each row the bits it gets alone)."""
    from w12_kernels.gemm import invariant_rows

    calls, wgl = [], large.gemm_wgl

    def spy(*args, **kwargs):
        calls.append(args[-1])
        return wgl(*args, **kwargs)

    monkeypatch.setattr(large, "gemm_wgl", spy)
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
        assert len(calls) == 3 and calls[0].block_m == 128
        calls.clear()
        assert_within_budget(got, x[:m], t, _ref(x[:m], t))
        assert torch.equal(got.view(torch.int16), again.view(torch.int16))
        assert torch.equal(per_call.view(torch.int16), got.view(torch.int16))


@needs_wgl
def test_wgmma_stage_images():
    """The activation images on the GPU equal the CPU statement of their layout."""
    from stage_image import stage_images

    base = torch.randn(300, 152, device="cuda").to(torch.bfloat16)
    # rows 4-byte aligned, and (one column in) not: the pairs path and the 2-byte path; tokens
    # past M and the columns past K = 150 of the last chunk come out as zeros
    for x in (base[:70, :150], base[:, 1:151]):
        for block_m in (64, 128, 192, 256):
            got = large.permute_x(x, 3, block_m).view(torch.int16).cpu()
            want = stage_images(x.cpu(), 3, block_m).view(torch.int16)
            assert torch.equal(got, want)


def test_backend_is_reported():
    assert dispatch.backend() in ("cuda", "triton", "torch")


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


@pytest.mark.parametrize("n,k", [(960, 576), (576, 576), (3072, 576), (576, 1536),
                                 (49152, 576)])
def test_batch_invariant_on_the_demo_models_shapes_with_escapes(n, k):
    """The demo model's layer shapes (SmolLM2-135M: q/k/v, o, gate/up, down, the tied head),
    whose weights carry escapes in most rows: each row's bits at every M up to 128 are the
    bits of the 128-row call (a speculative verify step against plain decoding at batch 8)."""
    t = _scattered_escapes(n, k, seed=n + k)
    x = (torch.randn(128, k, device="cuda") * 0.5).to(torch.bfloat16)
    pw = prepare_weight(encoded(t))
    full = w12_linear(x, pw).view(torch.int16)
    for m in (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128):
        part = w12_linear(x[:m].contiguous(), pw).view(torch.int16)
        assert torch.equal(part, full[:m]), f"M={m}"


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
