"""The small-M launch configuration: one K split per weight shape, layouts per M class."""

from __future__ import annotations

import itertools
import json

import pytest
from gemm_helpers import benchmark_module, gemm_benchmark

from w12_kernels.gemm import config as cfgs
from w12_kernels.gemm import cuda, wgmma


def test_pick_kw_fills_the_gpu_and_keeps_chunks_per_warp():
    assert cfgs.pick_kw(256, 64, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 8
    assert cfgs.pick_kw(8016, 64, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 1
    assert cfgs.pick_kw(12, 9, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 4


def test_shape_entry_overrides_the_rule_and_keeps_missing_classes():
    rule = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 2, "prefetch": False} for c in ("1", "2", "4", "8")},
            "shapes": {"4096x4096": {"kw": 2, "by_nt": {"1": {"depth": 4, "prefetch": True}}}}}
    tuned = cfgs.small_config(4096, 4096, 132, rule)
    assert tuned.kw == 2
    assert tuned.layout(1) == cfgs.Layout(depth=4, prefetch=True)
    assert tuned.layout(64) == cfgs.Layout(depth=2, prefetch=False)
    other = cfgs.small_config(4096, 4160, 132, rule)
    assert other.kw == 8 and other.layout(8) == cfgs.Layout(depth=2, prefetch=False)


def test_layout_classes_by_rows():
    cfg = cfgs.SmallConfig(kw=4, by_nt=tuple((c, cfgs.Layout(depth=c)) for c in (1, 2, 4, 8)))
    assert [cfg.layout(m).depth for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="65 rows"):
        cfg.layout(65)


def test_shipped_table_is_consistent():
    rule = cfgs.rule()
    for shape, entry in rule.get("shapes", {}).items():
        n, k = map(int, shape.split("x"))
        cfg = cfgs.small_config(n, k, 132)
        # a swept shape's kw may pass the rule's cap for unswept shapes, not the kernel's
        assert 1 <= cfg.kw <= cuda.KW_MAX
        assert cfg.kw == entry["kw"]
        assert rule["max_kw"] <= cuda.KW_MAX
        for m in (1, 16, 32, 64):
            lay = cfg.layout(m)
            assert lay.depth >= 1 and not (lay.prefetch and lay.depth % 2)
            # what gemm_small accepts: at most 32 warps a block, the shared memory of an H200
            assert lay.groups in cuda.GROUPS and cfg.kw * lay.groups <= 32
            nt = -(-m // 8)
            assert lay.w_stages in cuda.W_STAGES
            assert cuda.small_shared_bytes(nt, cfg.kw, lay.x_stages, lay.groups, lay.w_stages,
                                           lay.tiles, lay.cluster) <= 227 * 1024
            cuda.check_small(cfg.kw, lay.depth, lay.prefetch, lay.tiles, lay.min_blocks,
                             lay.x_stages, lay.groups, lay.w_stages, lay.cluster)
            if lay.wg is not None:  # a warpgroup schedule the kernel has at this kw
                depth, warpgroups, row_groups, split = lay.wg
                wgmma.check(cfg.kw, depth, 16, warpgroups, row_groups, split)
                n_block = 16 * -(-m // 16)
                assert wgmma.shared_bytes(n_block, warpgroups, depth, row_groups) <= 227 * 1024


def test_layout_reads_a_warpgroup_schedule():
    rule = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 1} for c in "1248"},
            "shapes": {"4096x4096": {"kw": 2, "by_nt": {"8": {"depth": 1, "wg": [4, 1, 1, 2]}}}}}
    cfg = cfgs.small_config(4096, 4096, 132, rule)
    assert cfg.layout(64).wg == (4, 1, 1, 2) and cfg.layout(32).wg is None
    assert wgmma.check(cfg.kw, 4, 64, 1, 1, 2) == 1
    with pytest.raises(ValueError, match="bad configuration"):
        wgmma.check(cfg.kw, 4, 64, 4, 1, 1)  # 4 warpgroups cannot share kw = 2 partial sums


def test_large_config_by_shape_and_m_class():
    rule = {"default": dict(cfgs.DEFAULT_LARGE), "max_m": 256,
            "shapes": {"4096x4096": {"128": {"kind": "decode"}, "256": {"block_m": 64}}}}
    assert cfgs.large_config(4096, 4096, 100, rule).kind == "decode"
    assert cfgs.large_config(4096, 4096, 129, rule) == cfgs.LargeConfig(block_m=64)
    assert cfgs.large_config(4096, 4096, 256, rule) == cfgs.LargeConfig(block_m=64)
    # beyond the measured rows: decode + cuBLAS, for a tuned shape and for the default
    assert cfgs.large_config(4096, 4096, 257, rule).kind == "decode"
    assert cfgs.large_config(4096, 5120, 256, rule) == cfgs.LargeConfig(**cfgs.DEFAULT_LARGE)
    assert cfgs.large_config(4096, 5120, 4096, rule).kind == "decode"
    with pytest.raises(ValueError, match="large-M kind"):
        cfgs.large_config(1, 1, 200, {"default": {**cfgs.DEFAULT_LARGE, "kind": "x"},
                                      "shapes": {}})


def test_large_entry_keys_are_not_inherited_and_round_trip_through_the_sweep():
    """``persist``, ``tail``, ``mcast``, ``xorder``, ``wreuse`` and ``l2hint`` hold for the
    entry that names them only (a default with them does not give them to a shape's entry),
    and every warpgroup candidate of the sweep is written as an entry that reads back as its
    own values under its own label (``_wr``: ``wreuse``)."""
    extra = {"persist": 1, "tail": 2, "mcast": 1, "xorder": 1, "wreuse": 1, "l2hint": 1}
    rule = {"default": {**cfgs.DEFAULT_LARGE, "kind": "wgmma", **extra}, "max_m": 1024,
            "shapes": {"4096x4096": {"512": {"kind": "wgmma", "wreuse": 1}}}}
    cfg = cfgs.large_config(4096, 4096, 512, rule)
    assert cfg.wreuse == 1 and not (cfg.persist or cfg.tail or cfg.mcast or cfg.xorder
                                    or cfg.l2hint)
    assert cfgs.large_config(4096, 4160, 512, rule).wreuse == 1  # (the default itself)
    gemm_bench = gemm_benchmark()
    labels = set()
    for cand in gemm_bench.WGMMA_CANDIDATES:
        cand = ("wgmma", *cand)
        entry = gemm_bench._large_entry(cand)
        got = cfgs.large_config(4096, 4096, 512, {"default": dict(cfgs.DEFAULT_LARGE),
                                                  "shapes": {"4096x4096": {"512": entry}}})
        args = dict(zip(gemm_bench.WGMMA_KEYS, gemm_bench._wgmma_args(cand), strict=True))
        assert (got.block_m, got.tiles // 4, got.num_stages, got.w_stages, got.splits,
                got.a_regs, got.persist, got.tail, got.mcast, got.xorder, got.wreuse,
                got.l2hint) == \
            tuple(args.values())
        label = gemm_bench._large_label(cand)
        assert ("_wr" in label) == bool(args["wreuse"]) and label not in labels
        labels.add(label)
    assert any("_wr" in label for label in labels)


def test_shipped_large_table_is_consistent():
    """Every entry of the shipped large-M table is a kind the launcher knows, and every
    warpgroup-MMA entry a configuration ``cuda_large`` instantiates (as the launcher passes it:
    4 tiles per warpgroup); a shape's entry covers the rows above the class below it."""
    from w12_kernels.gemm import cuda_large

    rule = cfgs.large_rule()
    for shape, by_m in rule["shapes"].items():
        n, k = map(int, shape.split("x"))
        classes = sorted(map(int, by_m))
        for m in classes:
            cfg = cfgs.large_config(n, k, m)
            assert cfg.kind in cfgs.LARGE_KINDS
            if cfg.kind == "wgmma":
                assert cfg.tiles % 4 == 0
                key = (cfg.block_m, cfg.tiles // 4, cfg.num_stages, cfg.w_stages, cfg.splits,
                       int(cfg.a_regs), int(cfg.persist))
                cuda_large.check_config(*key)
                if cfg.tail:  # (and the tail's)
                    cuda_large.check_config(*cuda_large.tail_config(key, cfg.tail))
                assert not cfg.tail or (cfg.splits == 1 and not cfg.persist)
                # (xorder: only where the kernel can take x straight, source() raising else)
                assert not cfg.xorder or (cfg.a_regs and not cfg.mcast)
        for lower, upper in itertools.pairwise(classes):
            assert cfgs.large_config(n, k, lower + 1) == cfgs.large_config(n, k, upper)
        assert cfgs.large_config(n, k, classes[-1] + 1).kind == "decode"


def test_tail_plan():
    """Where the tail launch starts: after the tile blocks of the whole waves, only where a
    partial wave is left and its blocks, split, still fit one wave."""
    from w12_kernels.gemm.cuda_large import tail_plan

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
    from w12_kernels.gemm.cuda_large import tail_start

    assert tail_start(1536, 256, 256, 2, 5, 5, 2, 2, 132) == 132
    assert tail_start(1536, 200, 256, 2, 5, 5, 2, 2, 132) == 132  # rows short of the block
    assert tail_start(1792, 512, 256, 2, 5, 5, 2, 2, 132) == 198
    assert tail_start(1792, 256, 256, 2, 5, 5, 2, 2, 132) is None
    assert tail_start(24, 129, 256, 2, 5, 5, 2, 2, 132, wave=2) == 2


def test_split_count_keeps_the_workspace_below_the_weight_bytes():
    from w12_kernels.gemm.launcher import split_count

    assert split_count(4, 256, 4096) == 4  # 4 x 256 x N x 4 B <= N x 4096 x 1.5 B
    assert split_count(4, 512, 4096) == 3
    assert split_count(4, 4096, 4096) == 1  # prefill: no split
    assert split_count(1, 1, 4096) == 1


def test_sweep_keeps_the_layouts_of_classes_it_did_not_time(monkeypatch):
    """A small-M sweep over some M classes only (here NT = 1) writes a table whose other
    classes keep the layouts of the table in use, globally and per shape."""
    gemm_bench = gemm_benchmark()
    in_use = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
              "by_nt": {c: {"depth": 1, "prefetch": False, "tiles": int(c) % 3 + 1}
                        for c in ("1", "2", "4", "8")},
              "shapes": {"4096x4096": {"kw": 8, "by_nt": {"8": {"depth": 3, "tiles": 2}}}}}
    monkeypatch.setattr(cfgs, "rule", lambda: in_use)
    rows = []
    for kw in gemm_bench.SWEEP_KW:
        for i, lay in enumerate(gemm_bench.SWEEP_LAYOUTS[1]):
            rows.append(dict(n=4096, k=4096, m=1, kw=kw, **gemm_bench._layout_dict(lay),
                             us=10.0 + i + kw, err_ratio=1.0, cublas_us=13.0))
    table, _ = gemm_bench.choose_rule(rows, 132)
    assert table["by_nt"]["1"] == gemm_bench._layout_dict(gemm_bench.SWEEP_LAYOUTS[1][0])
    for cls in ("2", "4", "8"):
        assert table["by_nt"][cls] == in_use["by_nt"][cls]
    shape = table["shapes"]["4096x4096"]
    assert shape["kw"] == min(gemm_bench.SWEEP_KW)
    assert shape["by_nt"]["8"] == {"depth": 3, "tiles": 2}
    assert shape["by_nt"]["1"] == gemm_bench._layout_dict(gemm_bench.SWEEP_LAYOUTS[1][0])


def _plain_table_in_use(monkeypatch) -> dict:
    """A table in use with one plain layout for every class and no per-shape entries."""
    in_use = {"warps_per_sm": 128, "min_chunks_per_warp": 2, "max_kw": 8,
              "by_nt": {c: {"depth": 1, "prefetch": False, "tiles": 1} for c in "1248"},
              "shapes": {}}
    monkeypatch.setattr(cfgs, "rule", lambda: in_use)
    return in_use


def test_sweep_at_the_tables_kw_scores_layouts_at_that_kw(monkeypatch):
    """A small-M sweep with ``--keep-kw`` times each shape at the kw of the table in use only:
    the layouts for unswept shapes are the best at those kws (not the first candidate, which
    is what scoring them under the kw rules, all -inf, once wrote) and the kw rule stays."""
    gemm_bench = gemm_benchmark()
    _plain_table_in_use(monkeypatch)
    layouts = gemm_bench.SWEEP_LAYOUTS[4]
    fastest = layouts[-1]  # neither the first nor a one-group register-ring layout
    rows = []
    for (n, k), kw in (((4096, 4096), 8), ((28672, 4096), 2)):
        for lay in layouts:
            rows.append(dict(n=n, k=k, m=32, kw=kw, **gemm_bench._layout_dict(lay),
                             us=9.0 if lay == fastest else 12.0, err_ratio=1.0, cublas_us=13.0))
    table, mean = gemm_bench.choose_rule(rows, 132, keep_kw=True)
    assert table["by_nt"]["4"] == gemm_bench._layout_dict(fastest)
    assert mean == pytest.approx(13.0 / 9.0)
    assert {key: table[key] for key in ("warps_per_sm", "min_chunks_per_warp", "max_kw")} == {
        "warps_per_sm": 128, "min_chunks_per_warp": 2, "max_kw": 8}
    assert table["shapes"]["28672x4096"]["kw"] == 2
    assert table["shapes"]["4096x4096"]["by_nt"]["4"] == gemm_bench._layout_dict(fastest)


def test_restricted_large_sweep_times_the_current_entry():
    """With ``--candidates`` the sweep also times each point's current table entry: the
    candidate whose entry is the table's at that M class exactly (none for other classes or
    entries no candidate matches), so that writing the table cannot replace an entry by a
    slower one that was merely the best of a few."""
    gemm_bench = gemm_benchmark()
    cand = gemm_bench.LARGE_CANDIDATES[3]
    rule = {"default": {"kind": "decode"}, "max_m": 512,
            "shapes": {"4096x4096": {"256": gemm_bench._large_entry(cand),
                                     "512": {"kind": "fused", "tiles": 3}}}}
    assert gemm_bench.current_candidate(4096, 4096, 256, rule) == cand
    assert gemm_bench.current_candidate(4096, 4096, 512, rule) is None
    assert gemm_bench.current_candidate(4096, 4096, 1024, rule) is None
    assert gemm_bench.current_candidate(8192, 8192, 256, rule) is None
    # a warpgroup entry with a key no candidate has (large_ab.py --write-table's l2hint) is
    # its own candidate, written back as the same entry
    wg = gemm_bench._large_entry(("wgmma", *gemm_bench.WGMMA_CANDIDATES[0]))
    rule["shapes"]["8192x8192"] = {"512": {**wg, "l2hint": 1}}
    own = gemm_bench.current_candidate(8192, 8192, 512, rule)
    assert own is not None and gemm_bench._large_entry(own) == {**wg, "l2hint": 1}
    assert gemm_bench._large_label(own).endswith("_l2")


def test_restricted_large_sweep_keeps_a_faster_current_entry(monkeypatch):
    gemm_bench = gemm_benchmark()
    current, other = gemm_bench.LARGE_CANDIDATES[3], gemm_bench.LARGE_CANDIDATES[0]
    rule = {"default": {"kind": "decode"}, "max_m": 256,
            "shapes": {"4096x4096": {"256": gemm_bench._large_entry(current)}}}
    monkeypatch.setattr(gemm_bench.cfgs, "large_rule", lambda *_: rule)
    monkeypatch.setattr(gemm_bench, "Layer", lambda n, k, seed: None)
    timed = []

    def measure(layer, m, runs):
        timed.append(sorted(runs))
        return 10.0, {label: (5.0 if label == gemm_bench._large_label(current) else 8.0, 1.0)
                      for label in runs}

    monkeypatch.setattr(gemm_bench, "_measure", measure)
    pattern = gemm_bench._large_label(other)
    _, table = gemm_bench.run_sweep_large([256], [(4096, 4096)], pattern)
    assert gemm_bench._large_label(current) in timed[0]
    assert table["shapes"]["4096x4096"]["256"] == gemm_bench._large_entry(current)


def test_restricted_large_sweep_times_each_current_entry_at_its_point_only(monkeypatch):
    """A point's current entry is not carried on to later points: there it would be timed
    against the candidates too, and its noise-level wins would reorder their entries."""
    gemm_bench = gemm_benchmark()
    first, second, other = (gemm_bench.LARGE_CANDIDATES[i] for i in (3, 4, 0))
    rule = {"default": {"kind": "decode"}, "max_m": 256,
            "shapes": {"4096x4096": {"256": gemm_bench._large_entry(first)},
                       "8192x8192": {"256": gemm_bench._large_entry(second)}}}
    monkeypatch.setattr(gemm_bench.cfgs, "large_rule", lambda *_: rule)
    monkeypatch.setattr(gemm_bench, "Layer", lambda n, k, seed: None)
    timed = {}

    def measure(layer, m, runs):
        timed[len(timed)] = set(runs)
        # the first point's entry would win everywhere it were timed
        us = {gemm_bench._large_label(first): 4.0, gemm_bench._large_label(second): 6.0}
        return 10.0, {label: (us.get(label, 8.0), 1.0) for label in runs}

    monkeypatch.setattr(gemm_bench, "_measure", measure)
    pattern = gemm_bench._large_label(other)
    _, table = gemm_bench.run_sweep_large([256], [(4096, 4096), (8192, 8192)], pattern)
    labels = [gemm_bench._large_label(c) for c in (first, second, other)]
    assert {labels[0], labels[2]} <= timed[0] and labels[1] not in timed[0]
    assert {labels[1], labels[2]} <= timed[1] and labels[0] not in timed[1]
    assert table["shapes"]["4096x4096"]["256"] == gemm_bench._large_entry(first)
    assert table["shapes"]["8192x8192"]["256"] == gemm_bench._large_entry(second)


def test_large_sweep_of_some_shapes_keeps_the_rest_of_the_table():
    """A large-M sweep of a few shapes (``--shapes``) replaces their entries only: the default,
    ``max_m`` and the other shapes' entries (other M classes of a swept shape too) stay."""
    merge_large = gemm_benchmark().merge_large
    current = {"default": {"kind": "wgmma", "block_m": 256}, "max_m": 256,
               "shapes": {"4096x4096": {"256": {"kind": "wgmma", "splits": 2},
                                        "1024": {"kind": "decode"}},
                          "8192x8192": {"256": {"kind": "wgmma", "splits": 2}}}}
    swept = {"default": {"kind": "decode"}, "max_m": 256,
             "shapes": {"4096x4096": {"256": {"kind": "wgmma", "splits": 3}}}}
    merged = merge_large(current, swept)
    assert merged["default"] == current["default"] and merged["max_m"] == 256
    assert merged["shapes"]["4096x4096"] == {"256": {"kind": "wgmma", "splits": 3},
                                             "1024": {"kind": "decode"}}
    assert merged["shapes"]["8192x8192"] == current["shapes"]["8192x8192"]
    assert current["shapes"]["4096x4096"]["256"]["splits"] == 2  # the input is not changed


def test_large_sweep_of_one_m_keeps_the_other_m_classes():
    """A sweep of every shape at one M (``--sweep-large --m 256``) replaces that class only;
    the 128- and 1024-row entries and ``max_m`` 1024 stay, and the default is the sweep's."""
    merge_large = gemm_benchmark().merge_large
    current = {"default": {"kind": "wgmma", "splits": 2}, "max_m": 1024,
               "shapes": {"4096x4096": {"128": {"kind": "wgmma", "block_m": 128},
                                        "256": {"kind": "wgmma", "splits": 2},
                                        "1024": {"kind": "decode"}}}}
    swept = {"default": {"kind": "wgmma", "splits": 3}, "max_m": 256,
             "shapes": {"4096x4096": {"256": {"kind": "wgmma", "splits": 3}}}}
    merged = merge_large(current, swept, keep_default=False)
    assert merged["max_m"] == 1024 and merged["default"] == swept["default"]
    assert merged["shapes"]["4096x4096"] == {"128": {"kind": "wgmma", "block_m": 128},
                                             "256": {"kind": "wgmma", "splits": 3},
                                             "1024": {"kind": "decode"}}
    assert merge_large(current, swept)["default"] == current["default"]


def test_small_sweep_of_some_shapes_keeps_the_rest_of_the_table():
    """A small-M sweep of a few shapes (``--sweep --shapes``) replaces only their entries: the
    kw rule for unlisted shapes, its default layouts and the other shapes' entries stay."""
    merge_small = gemm_benchmark().merge_small
    lay = {"depth": 1, "prefetch": False, "tiles": 1, "min_blocks": 1, "x_stages": 0,
           "groups": 1, "w_stages": 0}
    current = {"warps_per_sm": 128, "min_chunks_per_warp": 2, "max_kw": 8,
               "by_nt": {"2": lay},
               "shapes": {"4096x4096": {"kw": 8, "by_nt": {"2": lay}},
                          "8192x8192": {"kw": 8, "by_nt": {"2": lay}}}}
    swept = {"warps_per_sm": 16, "min_chunks_per_warp": 4, "max_kw": 4,
             "by_nt": {"2": {**lay, "depth": 2}},
             "shapes": {"4096x4096": {"kw": 16, "by_nt": {"2": {**lay, "tiles": 2}}}}}
    merged = merge_small(current, swept)
    assert {key: merged[key] for key in ("warps_per_sm", "min_chunks_per_warp", "max_kw",
                                         "by_nt")} == {
        key: current[key] for key in ("warps_per_sm", "min_chunks_per_warp", "max_kw", "by_nt")}
    assert merged["shapes"]["4096x4096"] == swept["shapes"]["4096x4096"]
    assert merged["shapes"]["8192x8192"] == current["shapes"]["8192x8192"]
    assert current["shapes"]["4096x4096"]["kw"] == 8  # the input is not changed


def test_shared_memory_opt_in_counts_static_bytes():
    """A kernel asks for more dynamic shared memory once dynamic + static bytes pass 48 KiB (a
    48 KiB request with 16 static bytes failed to launch on the H200 without it: the default
    limit is 48 KiB less the static bytes), and never lowers a larger limit it already has."""
    from types import SimpleNamespace

    from w12_kernels.gemm import cuda

    func = SimpleNamespace(shared_size_bytes=16, max_dynamic_shared_size_bytes=48 * 1024 - 16)
    cuda.allow_shared_memory(func, 48 * 1024 - 16)  # fits the default: nothing to ask
    assert func.max_dynamic_shared_size_bytes == 48 * 1024 - 16
    cuda.allow_shared_memory(func, 48 * 1024)
    assert func.max_dynamic_shared_size_bytes == 48 * 1024
    cuda.allow_shared_memory(func, 100 * 1024)
    assert func.max_dynamic_shared_size_bytes == 100 * 1024
    cuda.allow_shared_memory(func, 60 * 1024)
    assert func.max_dynamic_shared_size_bytes == 100 * 1024


def test_every_sweep_candidate_is_a_valid_schedule():
    """What the small-M sweep times is what ``gemm_small`` instantiates, and fits the shared
    memory of an H200 at kw <= 8 (at kw 16 the sweep skips the ones that do not fit: the
    launcher raises before launching)."""
    gemm_bench = gemm_benchmark()
    assert max(gemm_bench.SWEEP_KW) <= cuda.KW_MAX
    for cls, layouts in gemm_bench.SWEEP_LAYOUTS.items():
        assert len(set(layouts)) == len(layouts)
        for lay in layouts:
            d = gemm_bench._layout_dict(lay)
            for kw in gemm_bench.SWEEP_KW:
                if kw * d["groups"] > 32 or kw % d["cluster"]:
                    continue
                cuda.check_small(kw, **d)
                assert kw > 8 or cuda.small_shared_bytes(
                    cls, kw, d["x_stages"], d["groups"], d["w_stages"], d["tiles"],
                    d["cluster"]) <= 227 * 1024
    with pytest.raises(ValueError, match="bad configuration"):
        cuda.check_small(cuda.KW_MAX + 1, 1)


@pytest.mark.parametrize("bad", [dict(w_stages=5), dict(w_stages=3, depth=2),
                                 dict(w_stages=4, x_stages=3), dict(w_stages=2, depth=2,
                                                                    prefetch=True)])
def test_weight_stages_reject_schedules_without_an_instantiation(bad):
    """Weight stages come with depth 1, no prefetch and activation stages of the same count
    (one commit group per column) or none."""
    with pytest.raises(ValueError, match="bad configuration"):
        cuda.check_small(**{"kw": 4, "depth": 1, **bad})


@pytest.mark.parametrize("bad", [dict(cluster=3), dict(kw=6, cluster=4),
                                 dict(cluster=2, x_stages=3), dict(cluster=2, w_stages=3)])
def test_clusters_reject_schedules_without_an_instantiation(bad):
    """A cluster divides kw and takes no shared-memory stages."""
    with pytest.raises(ValueError, match="bad configuration"):
        cuda.check_small(**{"kw": 4, "depth": 1, **bad})


def test_cluster_names_shared_memory_and_fallback():
    # the bound of 8 warps over the cluster: blocks of kw / cluster warps
    assert cuda.kernel_name(4, 1, False, 2, 4, 0, 1, 8, 0, 2) == \
        "w12_gemm_small_cl<4, 1, false, 2, 4, 0, 1, 4, 0, 2>"
    assert cuda.kernel_name(4, 1, False, 2, 2, 0, 1, 8, 0, 1) == \
        "w12_gemm_small<4, 1, false, 2, 2, 0, 1, 8, 0>"
    # one block of a cluster of 2 at kw 8, NT 4, 2 tiles: the partials of all 8 warps of the
    # cluster, 2 KiB each per tile, then 8 words per output row
    assert cuda.small_shared_bytes(4, 8, 0, 1, 0, 2, 2) == 2 * (8 * 2048 + 512)
    # a clustered default layout on a shape whose kw it does not divide runs unclustered
    lay = cfgs.Layout(depth=1, tiles=2, min_blocks=4, cluster=2)
    cfg = cfgs.SmallConfig(kw=1, by_nt=tuple((c, lay) for c in (1, 2, 4, 8)))
    assert cfg.layout(32) == cfgs.Layout(depth=1, tiles=2, min_blocks=2, cluster=1)
    assert cfgs.SmallConfig(kw=4, by_nt=cfg.by_nt).layout(32) == lay


def test_weight_stages_shared_memory():
    # partials 4 x 512 B, 3 activation stages x 4 n-tiles x 1 KiB, 3 weight stages x 2 tiles x
    # 1.5 KiB, per warp; then 8 words per output row of the block for the epilogue
    assert cuda.small_shared_bytes(4, 4, 3, 1, 3, 2) == 4 * (2048 + 12288 + 9216) + 2 * 16 * 32
    assert cuda.small_shared_bytes(1, 8, 0, 2, 4, 1) == 16 * (512 + 6144) + 2 * 16 * 32


def test_sweep_picks_the_nt1_layout_on_every_timed_row_count(monkeypatch):
    """A layout that wins M = 1 by 1% but loses M = 8 by 10% is not the NT = 1 choice: the
    class's layout is scored over every M of the class the sweep timed (run 115 picked
    activations in registers on M = 1 alone; they ran up to 13% slower at M = 8)."""
    gemm_bench = gemm_benchmark()
    _plain_table_in_use(monkeypatch)
    layouts = gemm_bench.SWEEP_LAYOUTS[1]
    in_registers, staged = layouts[0], layouts[-1]
    assert 8 in gemm_bench.SCORED_M
    times = {(in_registers, 1): 9.9, (staged, 1): 10.0, (in_registers, 8): 11.0,
             (staged, 8): 10.0}
    rows = [dict(n=4096, k=4096, m=m, kw=8, **gemm_bench._layout_dict(lay),
                 us=times.get((lay, m), 20.0), err_ratio=1.0, cublas_us=13.0)
            for m in (1, 8) for lay in layouts]
    table, _ = gemm_bench.choose_rule(rows, 132, keep_kw=True)
    assert table["shapes"]["4096x4096"]["by_nt"]["1"] == gemm_bench._layout_dict(staged)


def test_invariant_rows_scopes_the_small_kernel_passes():
    """Batch invariance to 128 rows by default; ``invariant_rows(64)`` (prefill) sends 65..128
    rows to the large-M table for its block only, nesting and restoring on errors."""
    from w12_kernels.gemm import invariant_rows, launcher

    assert launcher.small_rows_limit() == 128
    with invariant_rows(64):
        assert launcher.small_rows_limit() == 64
        with invariant_rows(128):
            assert launcher.small_rows_limit() == 128
        assert launcher.small_rows_limit() == 64
    with pytest.raises(RuntimeError), invariant_rows(64):
        raise RuntimeError("inside")
    assert launcher.small_rows_limit() == 128
    with pytest.raises(ValueError, match="kept up to 64 or 128 rows"), invariant_rows(100):
        pass
    # what those rows run on the tuned shapes: the 128-row entries of the large-M table
    rule = cfgs.large_rule()
    for shape, by_m in rule["shapes"].items():
        n, k = map(int, shape.split("x"))
        assert "128" in by_m
        assert cfgs.large_config(n, k, 65) == cfgs.large_config(n, k, 128)


def test_invariant_rows_of_one_call_override_the_scope(monkeypatch):
    """``rows_kept`` (``w12_linear(..., invariant_rows=...)``) decides for its call alone which
    of 65..128 rows take the small-kernel passes, whatever the scope says (the dispatch, with
    the GPU parts stubbed)."""
    import torch

    from w12_kernels.gemm import invariant_rows, launcher

    weight = torch.randn(8, 64).to(torch.bfloat16)
    monkeypatch.setattr(launcher, "backend", lambda: "cuda")
    monkeypatch.setattr(launcher, "small_config", lambda n, k, device: None)
    monkeypatch.setattr(launcher, "_small_passes", lambda x, *rest: "small passes")
    monkeypatch.setattr(launcher, "_has_wgmma", lambda: False)
    monkeypatch.setattr(launcher, "decode", lambda *args: weight)
    x = torch.randn(100, 64).to(torch.bfloat16)

    def run(rows_kept):
        out = launcher.linear(x, *([None] * 12), 8, 64, rows_kept)
        return out if isinstance(out, str) else "large path"

    assert run(0) == "small passes" and run(128) == "small passes"
    assert run(64) == "large path"
    with invariant_rows(64):
        assert run(0) == "large path" and run(128) == "small passes"
    assert launcher.linear(x[:64], *([None] * 12), 8, 64, 64) == "small passes"


def test_w12_linear_checks_invariant_rows():
    import torch
    from gemm_helpers import encoded, make_weight

    from w12.errors import W12Error
    from w12_kernels.gemm import prepare_weight, w12_linear

    w = make_weight(24, 70, seed=1)
    pw = prepare_weight(encoded(w))
    x = torch.randn(3, 70).to(torch.bfloat16)
    same = w12_linear(x, pw, invariant_rows=64)
    assert torch.equal(same.view(torch.int16), w12_linear(x, pw).view(torch.int16))
    with pytest.raises(W12Error, match="w12_linear: 100 rows; batch invariance is kept up to"):
        w12_linear(x, pw, invariant_rows=100)


def test_sweep_keeps_a_warpgroup_choice_at_the_same_kw_only(monkeypatch):
    """A small-M sweep times mma.sync layouts only: a class's warpgroup schedule (written by
    benchmarks/wgmma_probe.py) stays while the shape keeps its kw and goes with another kw."""
    gemm_bench = gemm_benchmark()
    in_use = {"warps_per_sm": 128, "min_chunks_per_warp": 2, "max_kw": 8,
              "by_nt": {c: {"depth": 1, "prefetch": False, "tiles": 1} for c in "1248"},
              "shapes": {f"{n}x4096": {"kw": 2, "by_nt": {
                  "4": {"depth": 1, "wg": [4, 1, 1, 1]}, "8": {"depth": 1, "wg": [4, 1, 1, 2]}}}
                  for n in (4096, 28672)}}
    monkeypatch.setattr(cfgs, "rule", lambda: in_use)
    rows = []
    for n, kw in ((28672, 2), (4096, 8)):  # the first keeps its kw, the second moves to 8
        for lay in gemm_bench.SWEEP_LAYOUTS[4][:2]:
            rows.append(dict(n=n, k=4096, m=32, kw=kw, **gemm_bench._layout_dict(lay),
                             us=10.0, err_ratio=1.0, cublas_us=13.0))
    table, _ = gemm_bench.choose_rule(rows, 132, keep_kw=True)
    kept = table["shapes"]["28672x4096"]["by_nt"]
    assert kept["4"]["wg"] == [4, 1, 1, 1] and kept["8"]["wg"] == [4, 1, 1, 2]
    moved = table["shapes"]["4096x4096"]
    assert moved["kw"] == 8
    assert "wg" not in moved["by_nt"]["4"] and "wg" not in moved["by_nt"]["8"]


def test_sweep_keeps_the_sustained_classes_at_the_same_kw_only(monkeypatch):
    """Classes benchmarks/gemm_power.py chose by sustained timing (a shape's ``sustained``
    list) keep their layout through a burst sweep while the shape keeps its kw; the other
    classes, and every class of a shape whose kw moves, take the sweep's pick."""
    gemm_bench = gemm_benchmark()
    slow_burst = {"depth": 1, "prefetch": False, "tiles": 2, "min_blocks": 1, "x_stages": 0,
                  "groups": 1, "w_stages": 0, "cluster": 1}
    in_use = {"warps_per_sm": 128, "min_chunks_per_warp": 2, "max_kw": 8,
              "by_nt": {c: {"depth": 1, "prefetch": False, "tiles": 1} for c in "1248"},
              "shapes": {f"{n}x4096": {"kw": 2, "by_nt": {"2": dict(slow_burst),
                                                          "4": dict(slow_burst)},
                                       "sustained": ["4"]} for n in (4096, 28672)}}
    monkeypatch.setattr(cfgs, "rule", lambda: in_use)
    fast = gemm_bench.SWEEP_LAYOUTS[4][0]  # one tile: the burst winner below
    assert gemm_bench._layout_dict(fast)["tiles"] == 1
    rows = []
    for n, kw in ((28672, 2), (4096, 8)):  # the first keeps its kw, the second moves to 8
        for m in (16, 32):
            cls = 2 if m == 16 else 4
            for lay in gemm_bench.SWEEP_LAYOUTS[cls][:2]:
                rows.append(dict(n=n, k=4096, m=m, kw=kw, **gemm_bench._layout_dict(lay),
                                 us=9.0 if lay == gemm_bench.SWEEP_LAYOUTS[cls][0] else 10.0,
                                 err_ratio=1.0, cublas_us=13.0))
    table, _ = gemm_bench.choose_rule(rows, 132, keep_kw=True)
    kept = table["shapes"]["28672x4096"]
    assert kept["by_nt"]["4"] == slow_burst and kept["sustained"] == ["4"]
    assert kept["by_nt"]["2"] == gemm_bench._layout_dict(gemm_bench.SWEEP_LAYOUTS[2][0])
    moved = table["shapes"]["4096x4096"]
    assert moved["kw"] == 8 and "sustained" not in moved
    assert moved["by_nt"]["4"] == gemm_bench._layout_dict(fast)


def test_warpgroup_choice_needs_the_margin_on_every_measured_row_count():
    probe = benchmark_module("wgmma_probe")

    def row(m, mma, wg, bits=True):
        return {"n": 4096, "k": 4096, "m": m, "us": {"mma_sync": mma, **wg},
                "bits_equal_small": {lbl: bits for lbl in wg}}

    rows = [row(24, 10.0, {"wg_d4_g1_r1_s2": 9.0, "wg_d4_g2_r1_s1": 9.9}),
            row(32, 10.0, {"wg_d4_g1_r1_s2": 9.6, "wg_d4_g2_r1_s1": 9.0}),
            row(48, 10.0, {"wg_d4_g1_r1_s2": 9.0}),
            row(64, 10.0, {"wg_d4_g1_r1_s2": 9.9}),  # class 8: worst ratio 0.99 > 0.97
            row(16, 10.0, {"wg_d8_g1_r1_s2": 5.0}, bits=False)]  # faster, other bits
    chosen = probe.choose(rows)
    assert chosen[(4096, 4096, 4)] == [4, 1, 1, 2]  # worst 0.96 against 0.99
    assert chosen[(4096, 4096, 8)] is None
    assert chosen[(4096, 4096, 2)] is None


def test_time_with_cublas_builds_one_graph_per_run_then_cublas(monkeypatch):
    """Each run gets its own graph of calls cycling through the weight copies, in the order
    given, and cuBLAS the last one (the runs' closures bound to their own run)."""
    from types import SimpleNamespace

    bench = gemm_benchmark()
    seen = []

    def fake_time_graphs(graphs):
        for g in graphs:
            seen.append([call() for call in g])
        return [float(len(g)) for g in graphs]

    monkeypatch.setattr(bench, "time_graphs", fake_time_graphs)
    monkeypatch.setattr(bench.torch.nn.functional, "linear", lambda x, w: ("bf16", w))
    layer = SimpleNamespace(copies=2, w12=["w0", "w1"], bf16=["b0", "b1"])
    x = object()
    times = bench.time_with_cublas(layer, x, [lambda x_, w: ("a", w), lambda x_, w: ("b", w)])
    assert times == [8.0, 8.0, 8.0]
    assert seen[0] == [("a", "w0"), ("a", "w1")] * 4
    assert seen[1] == [("b", "w0"), ("b", "w1")] * 4
    assert seen[2] == [("bf16", "b0"), ("bf16", "b1")] * 4


def test_small_kernel_refuses_offsets_past_32_bits():
    """The kernel's streams are 32-bit offsets (a weight's 16-byte words, an activation row's
    elements, an output's elements): a weight past that is refused before anything is launched
    (no GPU needed; the chunk tensor is a broadcast view, so nothing that large is allocated)."""
    import torch

    chunks = torch.zeros(1, 1, 384, dtype=torch.int32).expand(2**16, 2**12, 384)
    x = torch.zeros(1, 2**12 * 64, dtype=torch.bfloat16)
    vec = torch.zeros(1)
    with pytest.raises(ValueError, match="32-bit offsets"):
        cuda.gemm_small(x, chunks, vec, vec, vec, vec, None, 2**20, 2**18, kw=8, depth=1)
    # the epilogue's output offsets (token x N + row) too: 2^26 output rows at up to 64 tokens,
    # refused before the 8 GiB output would be allocated
    chunks = torch.zeros(1, 1, 384, dtype=torch.int32).expand(2**22, 1, 384)
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output rows"):
        cuda.gemm_small(x, chunks, vec, vec, vec, vec, None, 2**26, 64, kw=1, depth=1)


def test_sweep_candidates_are_distinct_and_named_as_the_kernels_they_compile():
    """Every schedule the sweep times has its own label, and the instantiation its compile
    step ahead of the timing builds is the one ``gemm_small`` launches for that schedule (so
    that compile is not wasted)."""
    gemm_bench = gemm_benchmark()
    for m in (1, 16, 32, 64):
        cands = gemm_bench.sweep_candidates(4096, 4096, m, gemm_bench.SWEEP_KW)
        labels = [label for label, _, _ in cands]
        assert len(set(labels)) == len(labels) > 0
        assert all(kw in gemm_bench.SWEEP_KW for _, kw, _ in cands)
        for _, kw, lay in cands:
            d = gemm_bench._layout_dict(lay)
            assert cuda.kernel_name(-(-m // 8), *gemm_bench._small_schedule(kw, lay)) == \
                cuda.kernel_name(-(-m // 8), d["depth"], d["prefetch"], d["tiles"],
                                 d["min_blocks"], d["x_stages"], d["groups"], kw=kw,
                                 w_stages=d["w_stages"], cluster=d["cluster"])
    # a weight of 3 columns takes kw 1 only: every kw of the sweep (>= 2) is skipped
    assert gemm_bench.sweep_candidates(4096, 192, 16, gemm_bench.SWEEP_KW) == []


def test_128_row_blocks_keep_the_accumulators_in_registers():
    assert wgmma.check(2, 4, 128, 2, 2, 1) == 1  # 4 x 64 accumulator registers in 544 threads
    assert wgmma.check(8, 4, 128, 1, 1, 4) == 2
    for kw, depth, wgs, rg, split in ((8, 4, 2, 2, 2), (8, 4, 1, 1, 2), (8, 4, 4, 1, 1)):
        with pytest.raises(ValueError, match="bad configuration"):
            wgmma.check(kw, depth, 128, wgs, rg, split)  # 2 sets x 4 warpgroups; 4 sets
    assert wgmma.check(8, 4, 64, 2, 2, 2) == 2  # at 64 rows those are fine


def test_one_pass_schedule_comes_from_the_shape_entry():
    rule = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 2} for c in ("1", "2", "4", "8")},
            "shapes": {"4096x4096": {"kw": 8, "one_pass": [4, 2, 1, 1]}}}
    assert cfgs.small_config(4096, 4096, 132, rule).one_pass == (4, 2, 1, 1)
    assert cfgs.small_config(4096, 4160, 132, rule).one_pass is None
    # every one-pass schedule of the shipped table is one the kernel has at 128-row blocks
    for shape, entry in cfgs.rule()["shapes"].items():
        if "one_pass" in entry:
            depth, warpgroups, row_groups, split = entry["one_pass"]
            assert wgmma.check(entry["kw"], depth, 128, warpgroups, row_groups, split), shape
            assert wgmma.shared_bytes(128, warpgroups, depth, row_groups) <= 227 * 1024


def test_one_pass_dispatch(monkeypatch):
    """65..128 rows: one call of the warpgroup kernel with 128-row blocks where the shape has a
    ``one_pass`` schedule (and the GPU has the kernel), else passes of at most 64 rows (the
    GPU parts stubbed)."""
    import torch

    from w12_kernels.gemm import launcher

    calls = []
    monkeypatch.setattr(launcher, "backend", lambda: "cuda")
    monkeypatch.setattr(launcher, "_wg_fits", lambda kw, wg, rows: rows == 128)
    monkeypatch.setattr(wgmma, "gemm_wg", lambda x, *a, **kw: calls.append(
        ("one pass", x.shape[0], kw["n_block"], kw["kw"])))
    monkeypatch.setattr(cuda, "gemm_small", lambda x, *a, **kw: calls.append(
        ("pass", x.shape[0])))
    x = torch.randn(100, 64).to(torch.bfloat16)
    plain = tuple((c, cfgs.Layout()) for c in cfgs.NT_CLASSES)
    for one_pass, want in (((4, 2, 1, 1), [("one pass", 100, 128, 8)]),
                           (None, [("pass", 64), ("pass", 36)])):
        cfg = cfgs.SmallConfig(kw=8, by_nt=plain, one_pass=one_pass)
        monkeypatch.setattr(launcher, "small_config", lambda n, k, device, c=cfg: c)
        calls.clear()
        launcher.linear(x, *([None] * 12), 8, 64)
        assert calls == want
    calls.clear()
    launcher.linear(x[:64], *([None] * 12), 8, 64)
    assert calls == [("pass", 64)]


def test_large_dispatch_passes_the_entrys_launch_options(monkeypatch):
    """The launcher hands a warpgroup entry's ``xorder`` and ``wreuse`` to ``gemm_wgl``; an
    entry without ``wreuse`` leaves it to the module default (None)."""
    import torch

    from w12_kernels.gemm import cuda_large, launcher

    calls = []
    monkeypatch.setattr(launcher, "backend", lambda: "cuda")
    monkeypatch.setattr(launcher, "_has_wgmma", lambda: True)
    monkeypatch.setattr(cuda_large, "gemm_wgl", lambda x, *a, **kw: calls.append(kw))
    x = torch.randn(512, 64).to(torch.bfloat16)
    base = {"kind": "wgmma", "tiles": 8, "block_m": 256, "num_stages": 5, "w_stages": 5,
            "splits": 1, "a_regs": 2}
    for extra, want in (({"wreuse": 1, "persist": 1}, (True, False, 1)),
                        ({"xorder": 1}, (None, True, 0))):
        rule = {"default": dict(cfgs.DEFAULT_LARGE), "max_m": 1024,
                "shapes": {"8x64": {"512": {**base, **extra}}}}
        monkeypatch.setattr(cfgs, "large_rule", lambda *_, r=rule: r)
        calls.clear()
        launcher.linear(x, *([None] * 12), 8, 64)
        assert [(c["wreuse"], c["xorder"], c["persist"]) for c in calls] == [want]


def test_large_probe_reads_candidates_in_the_sweeps_form():
    """``benchmarks/large_probe.py``'s ``--configs``: each item a warpgroup candidate as the
    sweep writes them (trailing keys 0), labelled as the sweep labels them; bad items refused
    with the reason."""
    probe = benchmark_module("large_probe")
    gemm_bench = gemm_benchmark()
    cands = probe.parse_configs("256,2,5,5,1,2,1; 128,2,6,6,1,2,1,0,0,0,1;")
    assert cands == [("wgmma", 256, 2, 5, 5, 1, 2, 1), ("wgmma", 128, 2, 6, 6, 1, 2, 1, 0, 0, 0, 1)]
    assert [gemm_bench._large_label(c) for c in cands] == [
        "wgmma_m256_g2_x5_w5_k1_rp_ps", "wgmma_m128_g2_x6_w6_k1_rp_ps_wr"]
    for bad, why in (("256,2,5", "3 values"), ("256,2,5,5,1,x", "integers"), (" ; ", "empty"),
                     (",".join(["1"] * 13), "13 values")):
        with pytest.raises(SystemExit, match=why):
            probe.parse_configs(bad)


def test_every_shipped_large_entry_is_a_sweep_candidate(monkeypatch):
    """A restricted large-M sweep (``--candidates``) times each point's current entry beside
    its candidates only where the entry is a sweep candidate, or written back whole as its own
    (``current_candidate``); an entry that is neither would be replaced by the best of the few
    candidates timed, so every warpgroup entry of the shipped table, each GPU's view of it
    included, must be one."""
    from w12_kernels.gemm import cuda_large

    gemm_bench = gemm_benchmark()
    monkeypatch.setattr(cuda_large, "available", lambda: True)
    for gpu in (None, *json.loads(cfgs.TUNED_PATH.read_text())["large"].get("by_device", {})):
        rule = cfgs.large_rule(gpu)
        missing = [(shape, m) for shape, by_m in rule["shapes"].items() for m, e in by_m.items()
                   if e.get("kind") == "wgmma"
                   and gemm_bench.current_candidate(*map(int, shape.split("x")), int(m),
                                                    rule) is None]
        assert not missing, gpu


def test_large_sweep_keeps_the_current_entry_within_the_margin(monkeypatch):
    """A point's current entry stays where the fastest choice beat it by ``keep_margin`` or
    less (noise-level reorderings), and is replaced where it was beaten by more; with a margin
    of 0 the fastest always wins."""
    gemm_bench = gemm_benchmark()
    current, other = gemm_bench.LARGE_CANDIDATES[3], gemm_bench.LARGE_CANDIDATES[0]
    rule = {"default": {"kind": "decode"}, "max_m": 512,
            "shapes": {"4096x4096": {"256": gemm_bench._large_entry(current),
                                     "512": gemm_bench._large_entry(current)}}}
    monkeypatch.setattr(gemm_bench.cfgs, "large_rule", lambda *_: rule)
    monkeypatch.setattr(gemm_bench, "Layer", lambda n, k, seed: None)
    # the other candidate 1% faster at 256 rows, 5% faster at 512
    us = {256: 101.0, 512: 105.0}

    def measure(layer, m, runs):
        return 200.0, {label: (100.0 if label == gemm_bench._large_label(other)
                               else us[m] if label == gemm_bench._large_label(current)
                               else 300.0, 1.0) for label in runs}

    monkeypatch.setattr(gemm_bench, "_measure", measure)
    pattern = gemm_bench._large_label(other)
    for margin, at_256 in ((0.02, current), (0.0, other)):
        _, table = gemm_bench.run_sweep_large([256, 512], [(4096, 4096)], pattern, margin)
        assert table["shapes"]["4096x4096"]["256"] == gemm_bench._large_entry(at_256)
        assert table["shapes"]["4096x4096"]["512"] == gemm_bench._large_entry(other)


def _write_table(tmp_path, monkeypatch, large: dict):
    import json

    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"large": large}))
    monkeypatch.setattr(cfgs, "TUNED_PATH", path)
    cfgs.large_rule.cache_clear()
    return path


def test_a_gpus_section_overlays_the_shared_large_entries(tmp_path, monkeypatch):
    """``by_device``: on the GPU a section names, its entries replace the shared ones per shape
    and M class (the shape's other classes and the other shapes stay shared), its ``max_m``
    counts where larger; another GPU, or none, reads the shared entries only. ``large_config``
    without a rule reads the current GPU's view."""
    wg = {"kind": "wgmma", "tiles": 8, "block_m": 256, "num_stages": 5, "w_stages": 5,
          "splits": 1, "a_regs": 2}
    _write_table(tmp_path, monkeypatch, {
        "default": {"kind": "decode"}, "max_m": 1024,
        "shapes": {"64x64": {"512": {**wg, "persist": 1}, "1024": wg},
                   "128x64": {"512": wg}},
        "by_device": {"GPU A": {"max_m": 2048, "shapes": {
            "64x64": {"512": {**wg, "tail": 2}, "2048": {**wg, "wreuse": 1}}}}}})
    try:
        shared, a, b = cfgs.large_rule(), cfgs.large_rule("GPU A"), cfgs.large_rule("GPU B")
        assert shared == b and shared["max_m"] == 1024 and a["max_m"] == 2048
        assert a["shapes"]["64x64"] == {"512": {**wg, "tail": 2}, "1024": wg,
                                        "2048": {**wg, "wreuse": 1}}
        assert a["shapes"]["128x64"] == shared["shapes"]["128x64"]
        assert shared["shapes"]["64x64"]["512"]["persist"] == 1
        monkeypatch.setattr(cfgs, "current_gpu", lambda index=None: "GPU A")
        assert cfgs.large_config(64, 64, 400).tail == 2
        assert cfgs.large_config(64, 64, 1500).wreuse == 1
        monkeypatch.setattr(cfgs, "current_gpu", lambda index=None: None)
        assert cfgs.large_config(64, 64, 400).persist == 1
        assert cfgs.large_config(64, 64, 1500).kind == "decode"  # (past the shared classes)
        # the section of the GPU the launcher names (the tensors'), not of the current one
        monkeypatch.setattr(cfgs, "current_gpu", lambda index=None: {1: "GPU A"}.get(index))
        assert cfgs.large_config(64, 64, 400, device_index=1).tail == 2
        assert cfgs.large_config(64, 64, 400, device_index=0).persist == 1
        assert cfgs.large_config(64, 64, 400).persist == 1
    finally:
        cfgs.large_rule.cache_clear()


def test_a_device_table_sweep_writes_only_its_gpus_section():
    """``gemm.py --sweep-large --write-table --device-table``: the swept entries go into the
    GPU's section (merged per class with what it had, ``max_m`` the larger); the shared
    entries, the default and another GPU's section are left as they were."""
    gemm_bench = gemm_benchmark()
    current = {"default": {"kind": "decode"}, "max_m": 1024,
               "shapes": {"64x64": {"512": {"kind": "decode"}}},
               "by_device": {"GPU A": {"max_m": 512, "shapes": {"64x64": {"512": {"x": 1}},
                                                                "128x64": {"256": {"x": 2}}}},
                             "GPU B": {"max_m": 256, "shapes": {"64x64": {"256": {"x": 3}}}}}}
    swept = {"default": {"kind": "wgmma"}, "max_m": 2048,
             "shapes": {"64x64": {"2048": {"x": 4}}, "256x64": {"512": {"x": 5}}}}
    merged = gemm_bench.merge_device_large(current, swept, "GPU A")
    assert {k: merged[k] for k in ("default", "max_m", "shapes")} == {
        k: current[k] for k in ("default", "max_m", "shapes")}
    assert merged["by_device"]["GPU B"] == current["by_device"]["GPU B"]
    assert merged["by_device"]["GPU A"] == {
        "max_m": 2048, "shapes": {"64x64": {"512": {"x": 1}, "2048": {"x": 4}},
                                  "128x64": {"256": {"x": 2}}, "256x64": {"512": {"x": 5}}}}
    new = gemm_bench.merge_device_large({}, swept, "GPU C")
    assert new == {"by_device": {"GPU C": {"max_m": 2048, "shapes": swept["shapes"]}}}


def test_large_table_writes_into_the_file(tmp_path, monkeypatch):
    """``gemm.write_large_table`` (the sweep's and ``large_ab.py``'s --write-table): a change
    goes into the GPU's section or the shared entries of tuned.json, the file's other keys and
    entries staying; into a file without a large-M entry, the change whole."""
    gemm_bench = gemm_benchmark()
    path = tmp_path / "tuned.json"
    monkeypatch.setattr(cfgs, "TUNED_PATH", path)
    large = {"default": {"kind": "decode"}, "max_m": 1024,
             "shapes": {"64x64": {"512": {"x": 1}, "1024": {"x": 2}}}}
    path.write_text(json.dumps({"small": {"kw": 4}, "large": large}))
    change = {"max_m": 0, "shapes": {"64x64": {"512": {"x": 3}}}}
    got = gemm_bench.write_large_table(change, "GPU A")
    on_disk = json.loads(path.read_text())
    assert on_disk == {"small": {"kw": 4}, "large": got}
    assert got == {**large, "by_device": {"GPU A": {"max_m": 0, "shapes": change["shapes"]}}}
    got = gemm_bench.write_large_table(change)
    assert got["shapes"]["64x64"] == {"512": {"x": 3}, "1024": {"x": 2}}
    assert got["default"] == large["default"] and got["max_m"] == 1024
    assert json.loads(path.read_text())["small"] == {"kw": 4}
    path.write_text(json.dumps({"small": {"kw": 4}}))
    assert gemm_bench.write_large_table(large) == large
    assert json.loads(path.read_text()) == {"small": {"kw": 4}, "large": large}


def test_current_gpu_names_the_given_device(monkeypatch):
    """``config.current_gpu``: a given device index is named as it is (the launcher passes the
    tensors' GPU); without one, the current GPU, or None where torch has none."""
    import torch

    names = {0: "GPU A", 1: "GPU B"}
    monkeypatch.setattr(cfgs, "_gpu_name", lambda index: names[index])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cfgs.current_gpu(1) == "GPU B" and cfgs.current_gpu() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert cfgs.current_gpu() == "GPU A"


def test_large_ab_writes_a_key_only_where_every_round_agrees():
    """``large_ab.py --write-table``: a shape's entry for the M class that serves the rows gets
    the toggle's key where the option on beat off by more than the margin in every round, and
    loses it where off beat on so; a mixed or close result changes nothing."""
    ab = benchmark_module("large_ab")
    wg = {"kind": "wgmma", "tiles": 8, "block_m": 256}
    rule = {"shapes": {"64x64": {"512": wg, "1024": {**wg, "l2hint": 1}}}}
    assert ab.table_entry(64, 64, 300, rule) == ("512", wg)
    assert ab.table_entry(64, 64, 1000, rule) == ("1024", {**wg, "l2hint": 1})
    assert ab.table_entry(64, 64, 2000, rule) is None
    assert ab.table_entry(128, 64, 300, rule) is None
    win, lose = [(100.0, 95.0, 90.0), (102.0, 97.0, 91.0)], [(95.0, 100.0, 90.0)] * 2
    assert ab.table_change(wg, "l2hint", win, 0.01) == {**wg, "l2hint": 1}
    assert ab.table_change({**wg, "l2hint": 1}, "l2hint", win, 0.01) is None  # (has it)
    assert ab.table_change({**wg, "l2hint": 1}, "l2hint", lose, 0.01) == wg
    assert ab.table_change(wg, "l2hint", lose, 0.01) is None  # (nothing to clear)
    assert ab.table_change(wg, "l2hint", [win[0], lose[0]], 0.01) is None  # (rounds disagree)
    assert ab.table_change(wg, "l2hint", [(100.0, 99.5, 90.0)], 0.01) is None  # (in the margin)
    assert ab.table_change(wg, "l2hint", [], 0.01) is None
    assert "l2hint" in ab.SAME_BITS and "l2hint" in ab.TABLE_KEYS
