"""CPU checks of the large-M warpgroup-MMA kernel (kernels_large.cu): its NumPy statement
(stage_image.py: activation images, swizzled A buffers, descriptors, K split folded in rank
order) against float64 on the exact weights, that a wrong layout is caught, and the
configuration plumbing (shared-memory budget, the large-M table, the sweep's entries)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import stage_image
import torch
from gemm_helpers import assert_within_budget, encoded, gemm_benchmark, make_weight

from w12_kernels.gemm import config as cfgs
from w12_kernels.gemm import cuda_large, prepare_weight
from w12_kernels.gemm.reference import reference_linear

CASES = [  # (m, n, k, block_m, warpgroups, splits)
    (1, 70, 300, 64, 1, 1),
    (70, 130, 200, 64, 2, 2),  # two token blocks, a partial row block, K split in two
    (130, 300, 700, 128, 1, 4),  # K ranges of 3, 3, 3 and 2 chunks
    (5, 20, 64, 64, 1, 4),  # one chunk: three ranks with nothing to add
    (9, 1, 128, 192, 2, 2),
    (200, 90, 640, 64, 1, 3),  # K ranges of 4, 4 and 2 chunks
]


@pytest.mark.parametrize("m,n,k,block_m,warpgroups,splits", CASES,
                         ids=[f"m{m}_n{n}_k{k}_bm{b}_g{g}_k{s}" for m, n, k, b, g, s in CASES])
def test_emulated_large_kernel_within_budget(m, n, k, block_m, warpgroups, splits):
    w = make_weight(n, k, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    y = stage_image.gemm_wgl(x, prepare_weight(encoded(w)), bias, block_m=block_m,
                             warpgroups=warpgroups, splits=splits)
    assert_within_budget(y, x, w, reference_linear(x, encoded(w), bias), bias)


def test_every_split_within_budget_on_the_same_inputs():
    """A K split changes only the order of the float32 adds of the partial tiles."""
    w = make_weight(64, 640, seed=3)
    x = torch.randn(16, 640, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    pw = prepare_weight(encoded(w))
    ref = reference_linear(x, encoded(w))
    for splits in (1, 2, 3, 4):
        y = stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=splits)
        assert_within_budget(y, x, w, ref)


def test_stage_images_hold_every_column_once_and_zeros_past_the_ends():
    x = torch.arange(1, 1 + 3 * 150, dtype=torch.float32).reshape(3, 150).to(torch.bfloat16)
    img = stage_image.stage_images(x, 3, 64).float().reshape(3, 64, 64)  # [chunk, token, 64]
    for c in range(3):
        for n in range(3):
            got = sorted(v for v in img[c, n].tolist() if v != 0)
            want = sorted(x[n, c * 64 : c * 64 + 64].float().tolist())
            assert got == want
    assert not img[:, 3:].any()  # tokens past M


def test_a_wrong_swizzle_is_caught(monkeypatch):
    """The within-budget check fails when the activation images are written without the
    swizzle the descriptor reads with."""
    w = make_weight(40, 256, seed=1)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    pw = prepare_weight(encoded(w))
    ref = reference_linear(x, encoded(w))
    assert_within_budget(stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=1),
                         x, w, ref)
    def unswizzled(image, start, rows):  # reads rows as if stored without the XOR
        r = np.arange(rows)[:, None]
        kk = np.arange(16)[None, :]
        linear = start + (r // 8) * stage_image.SBO + (r % 8) * 128 + 2 * kk
        bits = image[linear // 2].astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(np.float64)

    monkeypatch.setattr(stage_image, "_read", unswizzled)
    bad = stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=1)
    with pytest.raises(AssertionError):
        assert_within_budget(bad, x, w, ref)


def test_configurations_fit_the_shared_memory():
    for cand in (*gemm_benchmark().WGMMA_CANDIDATES, (64, 1, 3, 2, 1), (192, 2, 3, 3, 4)):
        # (a tail's launch: the same configuration with K in that many ranges; the
        # candidates' fields in the benchmark's order: ..., persist, tail, mcast)
        config = (*cand[:7], *cand[8:9])
        tail = cand[7] if len(cand) > 7 else 0
        tails = (config, cuda_large.tail_config(config, tail)) if tail else (config,)
        for c in tails:
            cuda_large.check_config(*c)
            assert cuda_large.shared_bytes(*c[:4], *c[5:7], splits=c[4]) <= 227 * 1024
    for bad in ((96, 2, 4, 3, 1), (256, 3, 4, 3, 1), (256, 2, 4, 3, 5), (256, 2, 4, 5, 1),
                (128, 2, 2, 8, 1)):
        with pytest.raises(ValueError, match="bad configuration"):
            cuda_large.check_config(*bad)


def test_shared_memory_holds_the_inbox_of_two_k_ranges():
    """With 2 K ranges the block's memory after the main loop also holds the other rank's sums
    of its share of tokens (ceil(block_m / 2) token rows of 64 x warpgroups + 4 floats each)
    and their mbarrier; with 1, 3 or 4 only the partial tile."""
    tile = 256 * 132 * 4
    for splits in (1, 3, 4):
        assert cuda_large.shared_bytes(256, 2, 3, 2, 2, splits=splits) == 1024 + tile
    assert cuda_large.shared_bytes(256, 2, 3, 2, 2, splits=2) == 1024 + tile + 128 * 528 + 8
    assert cuda_large.shared_bytes(64, 1, 3, 2, 0, splits=2) == max(
        cuda_large.shared_bytes(64, 1, 3, 2, 0), 1024 + 64 * 68 * 4 + 32 * 68 * 4 + 8)


def test_two_blocks_per_multiprocessor_only_where_their_shared_memory_fits():
    assert cuda_large.blocks_per_sm(128, 1, 3, 2) == 2
    assert "__launch_bounds__(160, 2)" in cuda_large.source(128, 1, 3, 2, 1)
    for cand in ((256, 2, 4, 3), (128, 2, 4, 8), (128, 2, 3, 2)):
        assert cuda_large.blocks_per_sm(*cand) == 1
        assert "__launch_bounds__(288, 1)" in cuda_large.source(*cand, 2)


def test_source_has_one_entry_point_per_configuration():
    src = cuda_large.source(256, 2, 4, 3, 2)
    assert src.count('extern "C" __global__') == 2  # the permute and this configuration
    assert "w12_wgl_256_2_4_3_2(" in src and "__cluster_dims__(1, 1, 2)" in src
    assert "__cluster_dims__(1, 1, " not in cuda_large.source(128, 2, 4, 8, 1)
    assert "m64n256k16" in src


def test_large_table_entry_for_the_warpgroup_kernel():
    bench = gemm_benchmark()
    cand = ("wgmma", 256, 2, 4, 3, 2, 0)
    entry = bench._large_entry(cand)
    cfg = cfgs.large_config(4096, 4096, 256, {"default": {"kind": "decode"}, "max_m": 256,
                                              "shapes": {"4096x4096": {"256": entry}}})
    assert cfg.kind == "wgmma" and cfg.tiles // 4 == 2 and cfg.block_m == 256
    assert (cfg.num_stages, cfg.w_stages, cfg.splits) == (4, 3, 2)
    rows = [dict(n=4096, k=4096, m=256, label=bench._large_label(c), us=us, err_ratio=1.0,
                 cublas_us=10.0) for c, us in ((None, 30.0), (cand, 20.0))]
    table = bench.choose_large(rows, (None, cand))
    assert table["shapes"]["4096x4096"]["256"] == entry
    assert table["default"] == entry


def test_escape_order_walks_each_tile_by_chunk():
    """``esc_order`` is, within each 16-row tile's range of the escape list, a stable reorder by
    64-column chunk: every escape once, chunks non-decreasing, list order kept within a chunk."""
    w = make_weight(50, 300, seed=5)
    pw = prepare_weight(encoded(w))
    order = pw.esc_order.numpy()
    rows, cols = pw.esc_row.numpy(), pw.esc_col.numpy()
    rowptr = pw.esc_rowptr.numpy()
    assert pw.num_escapes > 100 and sorted(order.tolist()) == list(range(pw.num_escapes))
    for tile in range(int(pw.chunks.shape[0])):
        a, b = rowptr[16 * tile], rowptr[16 * tile + 16]
        part = order[a:b]
        assert ((a <= part) & (part < b)).all() and (rows[part] // 16 == tile).all()
        key = (cols[part] // 64) * 10**6 + part  # chunk, then list position
        assert (np.diff(key) > 0).all()


def test_patched_escapes_are_the_exact_finite_ones():
    """The kernel writes zeros and most escapes into its tiles; inf and NaN stay in the
    epilogue, and every patched value times the row's scale gives the escape back."""
    w = make_weight(40, 256, seed=6)
    pw = prepare_weight(encoded(w))
    ok, bits = stage_image.patchable(pw)
    vals = pw.esc_val.view(torch.bfloat16).float().numpy()
    assert ok[vals == 0].all() and not ok[~np.isfinite(vals)].any()
    back = stage_image._bits_f32(bits[ok]) * pw.scale.numpy()[pw.esc_row.numpy()[ok]]
    assert np.array_equal(back, vals[ok])


def test_register_operand_configuration():
    """``a_regs``: its own entry point and wrapper, no A buffers in shared memory, and a table
    entry that carries it to the launcher."""
    src = cuda_large.source(128, 2, 4, 8, 2, 1)
    assert "w12_wgl_128_2_4_8_2_r(" in src and "2, 1, 0, 1>(" in src
    assert "struct WgmmaRS<128>" in src and "w12_wgl_128_2_4_8_2(" not in src
    assert (cuda_large.shared_bytes(128, 2, 4, 8) - cuda_large.shared_bytes(128, 2, 4, 8, 1)
            == 3 * 2 * 8192)
    bench = gemm_benchmark()
    cand = ("wgmma", 256, 2, 4, 6, 1, 1)
    assert bench._large_label(cand) == "wgmma_m256_g2_x4_w6_k1_r"
    entry = bench._large_entry(cand)
    cfg = cfgs.large_config(4096, 4096, 256, {"default": {"kind": "decode"}, "max_m": 256,
                                              "shapes": {"4096x4096": {"256": entry}}})
    assert cfg.a_regs and cfg.kind == "wgmma" and cfg.w_stages == 6
    assert "a_regs" not in bench._large_entry(("wgmma", 256, 2, 4, 3, 1, 0))


def test_producer_warpgroup_configuration():
    """``a_regs`` 2: a producer warpgroup (384 threads for two MMA warpgroups) that hands its
    registers over with setmaxnreg, one block per multiprocessor, its own entry point."""
    src = cuda_large.source(256, 2, 4, 6, 1, 2)
    assert "w12_wgl_256_2_4_6_1_rp(" in src and "__launch_bounds__(384, 1)" in src
    assert "setmaxnreg.dec" in src and "1, 2, 0, 1>(" in src
    assert cuda_large.threads(2, 2) == 384 and cuda_large.threads(2, 1) == 288
    assert cuda_large.blocks_per_sm(64, 2, 3, 2, 2) == 1
    assert cuda_large.blocks_per_sm(64, 1, 3, 2, 1) == 2
    with pytest.raises(ValueError, match="bad configuration"):
        cuda_large.check_config(128, 1, 4, 8, 1, 2)
    bench = gemm_benchmark()
    entry = bench._large_entry(("wgmma", 256, 2, 4, 6, 1, 2))
    assert entry["a_regs"] == 2 and bench._large_label(("wgmma", 256, 2, 4, 6, 1, 2)).endswith(
        "_k1_rp")
    assert cfgs.LargeConfig(**entry).a_regs == 2


def test_multicast_pairs_configuration(monkeypatch):
    """``mcast`` 1: clusters of (2, 1, splits), MC 2 in the kernel, its own entry point and
    label; only with a producer warpgroup (``a_regs`` 2 or 3), not with stream-K or a tail;
    the grid gets an even number of tile blocks; never inherited from the table's default."""
    src = cuda_large.source(256, 1, 5, 8, 2, 3, 0, 1)
    assert "w12_wgl_256_1_5_8_2_ri_mc(" in src and "__cluster_dims__(2, 1, 2)" in src
    assert "wgl_body<256, 1, 5, 8, 2, 3, 0, 2>(" in src
    assert "__cluster_dims__(2, 1, 1)" in cuda_large._entry(256, 2, 5, 5, 1, 2, 0, 1)
    assert "__cluster_dims__" not in cuda_large._entry(256, 2, 5, 5, 1, 2, 0, 0)
    for bad in ((256, 2, 5, 5, 1, 1, 0, 1), (256, 2, 5, 5, 1, 2, 1, 1), (256, 2, 5, 5, 1, 0, 0, 1),
                (256, 2, 5, 5, 1, 2, 0, 2)):
        with pytest.raises(ValueError, match="bad configuration"):
            cuda_large.check_config(*bad)
    cuda_large.check_config(256, 2, 5, 5, 4, 2, 0, 1)  # a cluster of 8
    with pytest.raises(ValueError, match="tail"):
        cuda_large.gemm_wgl(torch.zeros(1, 64), torch.zeros(1, 1, 384, dtype=torch.int32),
                            *([None] * 9), None, 16, 64, block_m=256, warpgroups=2, x_stages=5,
                            w_stages=5, a_regs=2, tail=2, mcast=1)
    bench = gemm_benchmark()
    cand = ("wgmma", 256, 1, 5, 8, 2, 3, 0, 0, 1)
    assert bench._large_label(cand) == "wgmma_m256_g1_x5_w8_k2_ri_mc"
    entry = bench._large_entry(cand)
    assert entry["mcast"] == 1 and "mcast" not in bench._large_entry(cand[:7])
    rule = {"default": {**entry}, "max_m": 256,
            "shapes": {"4096x4096": {"256": bench._large_entry(cand[:7])}}}
    assert cfgs.large_config(4096, 4096, 256, rule).mcast == 0
    assert cfgs.large_config(8192, 4096, 256, rule).mcast == 1
    # the grid: 3 tile blocks of 128 rows -> 4 (the partner of the last stores nothing)
    launched = []
    monkeypatch.setattr(cuda_large, "permute_x", lambda x, nchunks, block_m: x)
    monkeypatch.setattr(cuda_large, "_function", lambda index, cfg, xorder=False, wreuse=None,
                        l2hint=None, escnext=False: cfg)
    monkeypatch.setattr(cuda_large, "_weight_map", lambda chunks, tiles, swizzled=False: bytes(128))
    monkeypatch.setattr(cuda_large.cuda, "_index", lambda d: 0)
    monkeypatch.setattr(cuda_large.cuda, "_ptr", lambda t: 0)
    monkeypatch.setattr(cuda_large.cuda, "launch",
                        lambda func, grid, block, args, device, smem, pdl: launched.append(
                            (func, grid, block)))
    for mcast, tiles in ((1, 4), (0, 3)):
        launched.clear()
        cuda_large.gemm_wgl(torch.zeros(300, 64), torch.zeros(24, 1, 384, dtype=torch.int32),
                            *([None] * 9), None, 384, 64, block_m=256, warpgroups=2,
                            x_stages=5, w_stages=5, a_regs=2, mcast=mcast)
        assert launched == [((256, 2, 5, 5, 1, 2, 0, mcast), (tiles, 2, 1), (384,))]


def test_wreuse_launch_order(monkeypatch):
    """``wreuse``: the grid launched with the token blocks as x (the kernel reads x and y
    swapped: W12_WREUSE's SWAP), the tail launch too; not with multicast (its pairs are
    neighbouring tile blocks: the grid and the kernel as without) and not with stream-K (one
    dimension; the kernel orders its units token block outermost instead); off, the grid's
    order as before."""
    from w12_kernels.gemm import cuda_large

    launched = []
    monkeypatch.setattr(cuda_large, "permute_x", lambda x, nchunks, block_m: x)
    monkeypatch.setattr(cuda_large, "_function", lambda index, cfg, xorder=False, wreuse=None,
                        l2hint=None, escnext=False: cfg)
    monkeypatch.setattr(cuda_large, "_weight_map", lambda chunks, tiles, swizzled=False: bytes(128))
    monkeypatch.setattr(cuda_large, "_stream_k_memory", lambda device, blocks, floats: (0, 0))
    monkeypatch.setattr(cuda_large.torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(cuda_large.cuda, "_index", lambda d: 0)
    monkeypatch.setattr(cuda_large.cuda, "_ptr", lambda t: 0)
    monkeypatch.setattr(cuda_large.cuda, "launch",
                        lambda func, grid, block, args, device, smem, pdl: launched.append(grid))

    def grids(ntiles, m, wreuse, **kw):
        launched.clear()
        cuda_large.gemm_wgl(torch.zeros(m, 64), torch.zeros(ntiles, 1, 384, dtype=torch.int32),
                            *([None] * 9), None, 16 * ntiles, 64, block_m=256, warpgroups=2,
                            x_stages=5, w_stages=5, a_regs=2, wreuse=wreuse, **kw)
        return list(launched)

    # 3 tile blocks of 128 rows, 2 token blocks (300 rows)
    assert grids(24, 300, False) == [(3, 2, 1)]
    assert grids(24, 300, True) == [(2, 3, 1)]
    assert grids(24, 300, True, splits=2) == [(2, 3, 2)]
    assert grids(24, 300, True, mcast=1) == grids(24, 300, False, mcast=1) == [(4, 2, 1)]
    assert grids(24, 300, True, persist=1) == grids(24, 300, False, persist=1)
    assert len(grids(24, 300, True, persist=1)[0]) == 3
    # a tail: 140 tile blocks x 1 token block fill 1 wave of 132 and 8 more, those in 2 ranges
    assert grids(8 * 140, 200, False, tail=2) == [(132, 1, 1), (8, 1, 2)]
    assert grids(8 * 140, 200, True, tail=2) == [(1, 132, 1), (1, 8, 2)]
    src = cuda_large.source(256, 2, 5, 5, 1, 2, 1, wreuse=True)
    assert "#define W12_WREUSE 1" in src
    assert "W12_WREUSE 1" not in cuda_large.source(256, 2, 5, 5, 1, 2, 1, wreuse=False)


def test_l2hint_source():
    """``l2hint``: the kernel's source defines W12_L2HINT (the copies' L2 eviction hints) only
    when asked; the module default ``L2HINT`` is off."""
    from w12_kernels.gemm import cuda_large

    assert cuda_large.L2HINT is False
    assert "#define W12_L2HINT 1" in cuda_large.source(256, 2, 5, 5, 1, 2, 1, l2hint=True)
    assert "#define W12_L2HINT 1" in cuda_large.source(256, 2, 5, 5, 1, 2, xorder=True,
                                                      l2hint=True)
    assert "W12_L2HINT 1" not in cuda_large.source(256, 2, 5, 5, 1, 2, 1)


def test_interleaved_warpgroups_configuration():
    """``a_regs`` 3: two MMA warpgroups on one group of 64 weight rows (so ``warpgroups`` 1:
    the block's rows, tiles and weight stages are those of one), a producer warpgroup, its own
    entry point; not with stream-K or a stream-K tail; the launcher gets it from a table
    entry of 4 tiles, and the tail plan counts blocks of 64 rows."""
    src = cuda_large.source(256, 1, 5, 8, 2, 3)
    assert "w12_wgl_256_1_5_8_2_ri(" in src and "__launch_bounds__(384, 1)" in src
    assert "wgl_body<256, 1, 5, 8, 2, 3, 0, 1>(" in src
    assert cuda_large.threads(1, 3) == 384 and cuda_large.blocks_per_sm(256, 1, 5, 8, 3) == 1
    # the shared memory of one group of rows: 4 tiles a weight stage, a 64-row partial tile
    assert (cuda_large.shared_bytes(256, 1, 5, 8, 3, splits=2)
            == cuda_large.shared_bytes(256, 1, 5, 8, 1, splits=2))
    for bad in ((256, 2, 5, 5, 1, 3, 0), (256, 1, 5, 8, 1, 3, 1), (256, 1, 5, 8, 1, 4, 0)):
        with pytest.raises(ValueError, match="bad configuration"):
            cuda_large.check_config(*bad)
    with pytest.raises(ValueError, match="bad configuration"):  # the stream-K tail
        cuda_large.check_config(*cuda_large.tail_config((256, 1, 5, 8, 1, 3, 0), 1))
    cuda_large.check_config(*cuda_large.tail_config((256, 1, 5, 8, 1, 3, 0), 2))
    bench = gemm_benchmark()
    cand = ("wgmma", 256, 1, 5, 8, 2, 3)
    assert bench._large_label(cand) == "wgmma_m256_g1_x5_w8_k2_ri"
    entry = bench._large_entry(cand)
    assert entry["tiles"] == 4 and entry["a_regs"] == 3
    cfg = cfgs.large_config(4096, 4096, 256, {"default": {"kind": "decode"}, "max_m": 256,
                                              "shapes": {"4096x4096": {"256": entry}}})
    assert (cfg.tiles // 4, cfg.a_regs, cfg.splits) == (1, 3, 2)
    # 28672 rows at 256 tokens: 448 blocks of 64 rows, one block a multiprocessor: the tail
    # starts after 3 waves of 132
    assert cuda_large.tail_start(1792, 256, 256, 1, 5, 8, 3, 2, 132) == 396


def test_persistent_configuration_and_its_table_entry():
    """``persist``: only with the producer warpgroup and one K range; its own entry point; a
    table entry names it, and a shape's entry without it is not persistent even where the
    default is (the default's K split may not allow it)."""
    bench = gemm_benchmark()
    cuda_large.check_config(256, 2, 5, 5, 1, 2, 1)
    for bad in ((256, 2, 5, 5, 2, 2, 1), (128, 2, 4, 8, 1, 1, 1), (256, 2, 5, 5, 1, 2, 2)):
        with pytest.raises(ValueError, match="bad configuration"):
            cuda_large.check_config(*bad)
    src = cuda_large.source(256, 2, 5, 5, 1, 2, 1)
    assert "w12_wgl_256_2_5_5_1_rp_ps(" in src and "wgl_body<256, 2, 5, 5, 1, 2, 1, 1>(" in src
    assert "wgl_body<256, 2, 5, 5, 1, 2, 0, 1>(" in cuda_large.source(256, 2, 5, 5, 1, 2)
    cand = ("wgmma", 256, 2, 5, 5, 1, 2, 1)
    entry = bench._large_entry(cand)
    assert entry["persist"] == 1 and bench._large_label(cand).endswith("_k1_rp_ps")
    assert "persist" not in bench._large_entry(("wgmma", 256, 2, 5, 5, 2, 2))
    rule = {"default": entry, "max_m": 256,
            "shapes": {"4096x4096": {"256": {**entry, "splits": 2}},
                       "8192x8192": {"256": {"kind": "wgmma", "splits": 2}}}}
    assert cfgs.large_config(8192, 8192, 256, rule).persist == 0
    assert cfgs.large_config(4096, 4096, 256, rule).persist == 1  # (its own, as written)
    assert cfgs.large_config(5120, 5120, 256, rule).persist == 1  # the default itself


def test_escape_slot_follows_the_chunk_layout():
    """``layout.escape_slot``: the lane, register and half that hold weight (row, col) of a
    16-row tile, from the layout's own statement (lane 4 g + t holds, for step j, weight i at
    row g + 8 ((i >> 1) & 1), column 16 t + 4 j + 2 (i >> 2) + (i & 1); register r of a step is
    weights 2 r and 2 r + 1)."""
    from w12_kernels.gemm.layout import escape_slot

    rows, cols, want = [], [], []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for j in range(4):
            for i in range(8):
                rows.append(16 * 3 + g + 8 * ((i >> 1) & 1))  # (any tile: only row % 16 counts)
                cols.append(64 * 5 + 16 * t + 4 * j + 2 * (i >> 2) + (i & 1))
                want.append(lane << 8 | (4 * j + (i >> 1)) << 1 | (i & 1))
    got = escape_slot(torch.tensor(rows), torch.tensor(cols))
    assert got.tolist() == want
    assert len(set(want)) == 32 * 32  # each of a tile column's 1024 weights has its own slot


def test_escape_entries_are_what_the_kernel_used_to_compute():
    """``esc_entry`` (per place of ``esc_order``: chunk column, patch flag, register slot,
    patched value) and ``esc_fix`` (each row's first escape the tiles cannot hold) against the
    NumPy reference of the kernels' patch rule, on a weight with every kind of escape."""
    from w12_kernels.gemm.layout import escape_slot

    w = make_weight(50, 300, seed=5)
    pw = prepare_weight(encoded(w))
    ok, bits = stage_image.patchable(pw)
    order = pw.esc_order.numpy()
    cols = pw.esc_col.numpy()
    slots = escape_slot(pw.esc_row, pw.esc_col).numpy()
    entry = pw.esc_entry.numpy().view(np.uint32)
    assert entry.shape == (pw.num_escapes, 2) and pw.num_escapes > 100
    assert not ok.all() and ok.any()  # both kinds present
    for i, o in enumerate(order):
        assert entry[i, 0] == cols[o] >> 6
        value = int(bits[o]) & 0xFFFF if ok[o] else 0
        assert entry[i, 1] == (int(ok[o]) << 31 | int(slots[o]) << 16 | value)
    rowptr = pw.esc_rowptr.numpy()
    np_ = int(pw.chunks.shape[0]) * 16
    assert pw.esc_fix.shape == (np_,)
    for r in range(np_):
        a, b = rowptr[r], rowptr[r + 1]
        bad = [e for e in range(a, b) if not ok[e]]
        assert pw.esc_fix[r] == (bad[0] if bad else b)


def test_escape_entries_of_a_weight_without_escapes():
    pw = prepare_weight(encoded(make_weight(20, 70, seed=2, escapes=False)))
    if pw.num_escapes == 0:
        assert pw.esc_entry.shape == (0, 2)
    assert (pw.esc_fix == pw.esc_rowptr[1:]).all() or pw.num_escapes > 0


def test_patch_rule_in_integers_is_the_float32_rule_on_every_bf16_value():
    """``layout.patchable`` (integer arithmetic) against the kernels' float32 rule without
    flushing subnormals (NumPy's IEEE float32: ``v * (1 / 2^k)`` rounded to BF16, a zero or
    normal, times ``2^k`` equal to ``v``), for all 65,536 BF16 values and scales 2^k from
    2^-112 to 2^127 (every ``e0``)."""
    from w12_kernels.gemm.layout import patchable

    v = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    vf = stage_image._bits_f32(v)
    for k in range(-112, 128, 3):
        sc = np.float32(2.0) ** np.float32(k)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            a = stage_image.f32_to_bf16_bits(vf * (np.float32(1.0) / sc))
            back = stage_image._bits_f32(a) * sc
        mag, expo = a & 0x7FFF, a & 0x7F80
        want = ((mag == 0) | ((expo != 0) & (expo != 0x7F80))) & (back == vf)
        ok, bits = patchable(torch.from_numpy(v.view(np.int16).copy()), torch.full((65536,), k))
        assert np.array_equal(ok.numpy(), want), k
        assert np.array_equal(bits.numpy()[want], a[want].astype(np.int32)), k
        assert (bits.numpy()[~want] == 0).all()
