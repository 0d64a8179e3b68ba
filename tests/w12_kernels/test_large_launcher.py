"""The large-M kernel's configurations on the CPU: what ``WglConfig`` accepts, its shared
memory, threads and blocks per multiprocessor, the entry point a configuration compiles, the
tail launch's plan, and the grids ``gemm_wgl`` launches (the GPU calls stubbed)."""

from __future__ import annotations

import types

import pytest
import torch

from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.large.launcher import WglConfig


def _bad(**kw) -> None:
    with pytest.raises(ValueError, match="bad configuration"):
        WglConfig(**kw).check()


def test_configurations_the_kernel_has():
    for cfg in (WglConfig(), WglConfig(block_m=128, x_stages=8, w_stages=8, splits=2, a_regs=1),
                WglConfig(warpgroups=1, w_stages=8, splits=3, a_regs=3),
                WglConfig(persist=True), WglConfig(tail=2), WglConfig(tail=1),
                WglConfig(block_m=64, warpgroups=1, x_stages=3, w_stages=2, a_regs=1),
                WglConfig(block_m=192, x_stages=3, w_stages=3, splits=4, a_regs=2)):
        cfg.check()
        assert cfg.shared_bytes <= large.SHARED_LIMIT
    _bad(block_m=96)
    _bad(warpgroups=3)
    _bad(splits=5)
    _bad(x_stages=2)
    _bad(a_regs=0)  # the decoded weights are always the register operand
    _bad(a_regs=2, warpgroups=1)  # setmaxnreg's split is made for two MMA warpgroups
    _bad(a_regs=3, warpgroups=2)  # two MMA warpgroups on one group of 64 rows
    _bad(persist=True, splits=2)  # stream-K: one K range, a producer warpgroup
    _bad(persist=True, a_regs=1, block_m=128, x_stages=4, w_stages=8)
    _bad(tail=2, splits=2)
    _bad(tail=1, persist=True)
    _bad(tail=5)
    _bad(warpgroups=1, w_stages=8, a_regs=3, tail=1)  # the tail's stream-K needs a_regs 2
    WglConfig(warpgroups=1, w_stages=8, a_regs=3, tail=2).check()


def test_shared_memory_holds_the_inbox_of_two_k_ranges():
    """With 2 K ranges the block's memory after the main loop also holds the other rank's sums
    of its share of tokens (ceil(block_m / 2) token rows of 64 x warpgroups + 4 floats each)
    and their mbarrier; with 1, 3 or 4 only the partial tile."""
    tile = 256 * 132 * 4
    for splits in (1, 3, 4):
        assert WglConfig(x_stages=3, w_stages=2, splits=splits).shared_bytes == 1024 + tile
    assert WglConfig(x_stages=3, w_stages=2, splits=2).shared_bytes == (
        1024 + tile + 128 * 528 + 8)
    # the main loop's stages and barriers, where larger; stream-K adds its segment data
    main = WglConfig(x_stages=5, w_stages=5)
    assert main.shared_bytes == 1024 + 5 * 256 * 128 + 5 * 8 * 1536 + 16 * 10
    assert WglConfig(persist=True).shared_bytes == main.shared_bytes + 64 * 2 * 16 + 8 * 36 * 8 + 32


def test_threads_and_blocks_per_multiprocessor():
    assert WglConfig(a_regs=2).threads == 384 and WglConfig(a_regs=1).threads == 288
    assert WglConfig(warpgroups=1, a_regs=3).threads == 384
    assert WglConfig(warpgroups=1, a_regs=1).threads == 160
    # two blocks where the shared memory and the register cap of two allow (no producer
    # warpgroup: its register split is made for one block)
    assert WglConfig(block_m=128, warpgroups=1, x_stages=3, w_stages=2, a_regs=1).blocks_per_sm == 2
    assert WglConfig(block_m=64, warpgroups=1, x_stages=3, w_stages=2, a_regs=1).blocks_per_sm == 2
    assert WglConfig(block_m=64, x_stages=3, w_stages=2, a_regs=2).blocks_per_sm == 1
    assert WglConfig(block_m=128, x_stages=4, w_stages=8, a_regs=1).blocks_per_sm == 1
    src = large.source(WglConfig(block_m=128, warpgroups=1, x_stages=3, w_stages=2, a_regs=1))
    assert "__launch_bounds__(160, 2)" in src


def test_each_configuration_compiles_its_own_entry_point():
    cfg = WglConfig(x_stages=4, w_stages=3, splits=2)
    src = large.source(cfg)
    assert src.count('extern "C" __global__') == 2  # the image pass and this configuration
    assert cfg.kernel_name == "w12_wgl_256_2_4_3_2_rp" and "w12_wgl_256_2_4_3_2_rp(" in src
    assert "__cluster_dims__(1, 1, 2)" in src and "__launch_bounds__(384, 1)" in src
    assert "wgl_body<256, 2, 4, 3, 2, 2, 0, false, false, false>(" in src
    assert "__cluster_dims__" not in large._entry(WglConfig())
    assert '#include "common.cuh"' in src and '#include "wgmma.cuh"' in src
    names = {WglConfig(a_regs=1, block_m=128, x_stages=4, w_stages=8).kernel_name,
             WglConfig(warpgroups=1, w_stages=8, a_regs=3).kernel_name,
             WglConfig(persist=True).kernel_name, WglConfig(xorder=True).kernel_name,
             WglConfig(wreuse=True).kernel_name, WglConfig(l2hint=True).kernel_name}
    assert names == {"w12_wgl_128_2_4_8_1_r", "w12_wgl_256_1_5_8_1_ri", "w12_wgl_256_2_5_5_1_rp_ps",
                     "w12_wgl_256_2_5_5_1_rp_xo", "w12_wgl_256_2_5_5_1_rp_wr",
                     "w12_wgl_256_2_5_5_1_rp_l2"}
    flags = large._entry(WglConfig(persist=True, wreuse=True, l2hint=True))
    assert "wgl_body<256, 2, 5, 5, 1, 2, 1, false, true, true>(" in flags
    # the tail is a second launch of its own configuration, not a kernel of its own
    assert large.source(WglConfig(tail=2)) == large.source(WglConfig())
    assert WglConfig(tail=2).tail_config() == WglConfig(splits=2)
    assert WglConfig(tail=1).tail_config() == WglConfig(persist=True)


def test_tail_plan():
    """Where the tail launch starts: after the tile blocks of the whole waves, only where a
    partial wave is left and its blocks, split, still fit one wave."""
    tail_plan = large.tail_plan
    assert tail_plan(224, 1, 132, 2) is None  # 92 units left: 184 blocks split in two
    assert tail_plan(192, 1, 132, 2) == 132  # 60 left: 120 blocks
    assert tail_plan(224, 2, 132, 2) == 198  # 448 units: 3 waves, 52 left (26 tile blocks)
    assert tail_plan(80, 2, 132, 4) == 66 and tail_plan(80, 2, 132, 5) is None  # 140 > 132
    assert tail_plan(80, 2, 132, 3) == 66  # 28 units x 3 = 84 blocks
    assert tail_plan(32, 1, 132, 2) is None  # one partial wave only: no whole one
    assert tail_plan(264, 1, 132, 2) is None  # two whole waves, nothing left
    assert tail_plan(192, 1, 132, 0) is None
    assert tail_plan(224, 1, 132, 1) == 132  # stream-K over the 92 units left: any size
    assert tail_plan(100, 3, 132, 2) == 88  # 300 units: 2 waves = 88 tile blocks of 3
    # from a layer's 16-row tiles and rows (a 24576-row layer: 192 tile blocks of 8 tiles)
    cfg = WglConfig(tail=2)
    assert large.tail_start(1536, 256, cfg, 132) == 132
    assert large.tail_start(1536, 200, cfg, 132) == 132  # rows short of the block
    assert large.tail_start(1792, 512, cfg, 132) == 198
    assert large.tail_start(1792, 256, cfg, 132) is None
    assert large.tail_start(24, 129, cfg, 132, wave=2) == 2
    # 28672 rows at 256 tokens in blocks of 64 rows, one block a multiprocessor: the tail
    # starts after 3 waves of 132
    assert large.tail_start(1792, 256, WglConfig(warpgroups=1, w_stages=8, a_regs=3, tail=2),
                            132) == 396


@pytest.fixture
def launches(monkeypatch):
    """``gemm_wgl``'s launches (configuration, grid, threads, shared memory, PDL), the GPU
    calls stubbed."""
    launched = []
    monkeypatch.setattr(large, "permute_x", lambda x, nchunks, block_m: x)
    monkeypatch.setattr(large, "_function", lambda index, cfg: cfg)
    monkeypatch.setattr(large, "_weight_map", lambda chunks, tiles, swizzled=False: bytes(128))
    monkeypatch.setattr(large, "_x_map", lambda x, block_m: bytes(128))
    monkeypatch.setattr(large, "_stream_k_memory", lambda device, blocks, floats: (0, 0))
    monkeypatch.setattr(large.torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(large.runtime, "device_index", lambda d: 0)
    monkeypatch.setattr(large.runtime, "ptr", lambda t: 0)
    monkeypatch.setattr(large.runtime, "launch",
                        lambda func, grid, block, args, device, smem, pdl: launched.append(
                            (func, grid, block, smem, pdl, len(args))))

    def run(ntiles, m, cfg, **kw):
        launched.clear()
        large.gemm_wgl(torch.zeros(m, 64, dtype=torch.bfloat16),
                       torch.zeros(ntiles, 1, 384, dtype=torch.int32), *([None] * 7), None,
                       16 * ntiles, 64, cfg, **kw)
        return list(launched)

    return run


def test_grids_and_launch_options(launches):
    """3 tile blocks of 128 rows and 2 token blocks (300 rows): the grid's order, ``wreuse``
    swapping it (the kernel reads x and y swapped), K ranges as z, stream-K one block a
    multiprocessor at most, and the tail's second launch; programmatic dependent launch after
    the image pass, not with ``xorder`` (no pass before it)."""
    def grids(cfg, **kw):
        return [grid for _, grid, *_ in launches(24, 300, cfg, **kw)]

    assert grids(WglConfig()) == [(3, 2, 1)]
    assert grids(WglConfig(wreuse=True)) == [(2, 3, 1)]
    assert grids(WglConfig(wreuse=True, splits=2)) == [(2, 3, 2)]
    assert grids(WglConfig(persist=True)) == grids(WglConfig(persist=True, wreuse=True))
    assert grids(WglConfig(persist=True), grid_cap=5) == [(5, 1, 1)]
    # a tail: 140 tile blocks x 1 token block fill 1 wave of 132 and 8 more, those in 2 ranges
    got = launches(8 * 140, 200, WglConfig(tail=2))
    assert [g for _, g, *_ in got] == [(132, 1, 1), (8, 1, 2)]
    assert [c for c, *_ in got] == [WglConfig(), WglConfig(splits=2)]
    assert [g for _, g, *_ in launches(8 * 140, 200, WglConfig(tail=2, wreuse=True))] == [
        (1, 132, 1), (1, 8, 2)]
    stream_k_tail = launches(8 * 140, 200, WglConfig(tail=1))
    assert stream_k_tail[1][0] == WglConfig(persist=True) and stream_k_tail[1][1][1:] == (1, 1)
    # PDL, the threads and the shared memory of each launch's configuration; the stream-K
    # launch's parameters hold its cuts (one more argument)
    (cfg, _, block, smem, pdl, nargs), = launches(24, 300, WglConfig(persist=True))
    assert block == (384,) and smem == WglConfig(persist=True).shared_bytes and pdl
    assert nargs == 23 and launches(24, 300, WglConfig())[0][5] == 22
    assert [p for *_, p, _ in launches(24, 300, WglConfig(xorder=True))] == [False]
    assert launches(24, 300, WglConfig(xorder=True))[0][0].xorder


def test_xorder_falls_back_to_the_image_pass_where_x_cannot_be_read(launches, monkeypatch):
    monkeypatch.setattr(large, "xorder_applies", lambda x: False)
    (cfg, _, _, _, pdl, _), = launches(24, 300, WglConfig(xorder=True))
    assert not cfg.xorder and pdl


def test_stream_k_cuts_given_by_a_test_are_checked(launches):
    with pytest.raises(ValueError, match="do not cut"):
        launches(24, 300, WglConfig(persist=True), grid_cap=2, cuts=(0, 3, 2))
    launches(24, 300, WglConfig(persist=True), grid_cap=2, cuts=(0, 3, 6))  # 6 steps
