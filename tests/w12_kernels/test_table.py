"""The tuned table (``table.py``, ``tuned.json``): its keys and fallback, the small-M
configuration (one K split per weight shape, layouts per row class) and the large-M one, and
the shipped table's consistency with the kernels."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from w12_kernels.gemm import table
from w12_kernels.gemm.large.launcher import WglConfig
from w12_kernels.gemm.small import launcher as small
from w12_kernels.gemm.wgmma import launcher as wgmma

H100 = table.GpuKey("sm90", 132, 79.2)  # "NVIDIA H100 80GB HBM3"
H200 = table.GpuKey("sm90", 132, 139.8)  # "NVIDIA H200"
FIXTURE = Path(__file__).with_name("fixtures") / "table_resolution_h100_h200.json"
WGMMA = {"kind": "wgmma", "block_m": 256, "warpgroups": 2, "x_stages": 5, "w_stages": 5,
         "splits": 1, "a_regs": 2, "persist": False, "tail": 0, "xorder": False,
         "wreuse": False, "l2hint": False}


# ------------------------------------------------------------------ keys and fallback

def test_gpu_keys():
    assert (H100.section, H100.exact) == ("sm90-132", "sm90-132-80gib")
    assert (H200.section, H200.exact) == ("sm90-132", "sm90-132-140gib")
    assert table.GpuKey("sm90", 114, 79.6).exact == "sm90-114-80gib"
    assert table.GpuKey("sm80", 108, 39.4).exact == "sm80-108-40gib"


def test_gpu_key_of_a_device(monkeypatch):
    import types

    import torch

    props = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132,
                                  total_memory=int(139.8 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    table._gpu_key.cache_clear()
    try:
        assert table.gpu_key(3) == table.GpuKey("sm90", 132, props.total_memory / 2**30)
        assert table.gpu_key(3).exact == "sm90-132-140gib"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert table.gpu_key() is None
    finally:
        table._gpu_key.cache_clear()


def test_fallback_order():
    """Exact key first, then the architecture and multiprocessor count (or, without that, the
    section of the architecture with the nearest count), then nothing: built-in defaults."""
    sections = {"sm90-132": {"name": "base"}, "sm90-132-140gib": {"name": "h200"},
                "sm90-114": {"name": "pcie"}, "sm90-78": {"name": "small"},
                "sm80-108": {"name": "a100"}}

    def names(key):
        return [s["name"] for s in table.sections_for(key, sections)]

    assert names(H200) == ["h200", "base"]
    assert names(H100) == ["base"]
    assert names(table.GpuKey("sm90", 114, 80)) == ["pcie"]
    assert names(table.GpuKey("sm90", 120, 80)) == ["pcie"]  # the nearest count
    assert names(table.GpuKey("sm90", 90, 80)) == ["small"]
    assert names(table.GpuKey("sm90", 96, 80)) == ["pcie"]  # a tie: the larger count
    assert names(table.GpuKey("sm100", 148, 180)) == []
    assert names(None) == []


def test_a_memory_section_overlays_entry_by_entry():
    base = {"small_m": {"warps_per_sm": 64, "min_chunks_per_warp": 2, "max_kw": 8,
                        "by_nt": {"1": {"depth": 1}},
                        "shapes": {"64x64": {"kw": 2}, "128x64": {"kw": 4}}},
            "large": {"default": WGMMA, "max_m": 1024,
                      "shapes": {"64x64": {"512": WGMMA, "1024": {"kind": "decode"}},
                                 "128x64": {"512": WGMMA}}}}
    over = {"small_m": {"max_kw": 4, "shapes": {"64x64": {"kw": 8}}},
            "large": {"shapes": {"64x64": {"512": {**WGMMA, "tail": 2}}}}}
    small_rule = table.small_rule_of([over, base])
    assert (small_rule["warps_per_sm"], small_rule["max_kw"]) == (64, 4)
    assert small_rule["by_nt"]["1"] == {"depth": 1}
    assert small_rule["by_nt"]["2"] == table.DEFAULT_SMALL["by_nt"]["2"]
    assert small_rule["shapes"] == {"64x64": {"kw": 8}, "128x64": {"kw": 4}}
    large_rule = table.large_rule_of([over, base])
    assert large_rule["max_m"] == 1024 and large_rule["default"] == WGMMA
    assert large_rule["shapes"]["64x64"] == {"512": {**WGMMA, "tail": 2},
                                             "1024": {"kind": "decode"}}
    assert table.large_config(64, 64, 400, large_rule) == WglConfig(tail=2)
    assert table.large_config(64, 64, 1000, large_rule) is None
    # without sections: the built-in defaults, decode + cuBLAS above the small-M rows
    empty = table.large_rule_of([])
    assert empty["default"] is None and table.large_config(64, 64, 100, empty) is None
    assert table.small_rule_of([])["warps_per_sm"] == table.DEFAULT_SMALL["warps_per_sm"]


def test_shipped_table_resolves_as_before_the_rekeying():
    """Every (shape, M) of the table before it was keyed by architecture, multiprocessors and
    memory (then by torch's device name, a shared part and an H100 and an H200 section) gets
    the same configuration on an H100 and an H200 now. The fixture is that table's resolution,
    computed with the former table module: per GPU, shape and M the large-M configuration
    ("block_m,warpgroups,x_stages,w_stages,splits,a_regs,persist,tail,xorder,wreuse,l2hint"
    or "decode"), and per shape the small-M kw, one-pass schedule and the layout at each M
    ("depth,tiles,min_blocks,x_stages,groups,w_stages,cluster[,wg...]")."""
    want = json.loads(FIXTURE.read_text())
    for gpu, key in (("h100", H100), ("h200", H200)):
        rule = table.large_rule(key)
        for shape, by_m in want["large"][gpu].items():
            n, k = map(int, shape.split("x"))
            for m, expected in by_m.items():
                cfg = table.large_config(n, k, int(m), rule)
                got = "decode" if cfg is None else ",".join(str(int(v)) for v in (
                    cfg.block_m, cfg.warpgroups, cfg.x_stages, cfg.w_stages, cfg.splits,
                    cfg.a_regs, cfg.persist, cfg.tail, cfg.xorder, cfg.wreuse, cfg.l2hint))
                assert got == expected, (gpu, shape, m)
        small_rule = table.small_rule(key)
        for shape, expected in want["small_m"].items():
            n, k = map(int, shape.split("x"))
            cfg = table.small_config(n, k, 132, small_rule)
            assert cfg.kw == expected["kw"], (gpu, shape)
            assert cfg.one_pass == (tuple(map(int, expected["one_pass"].split(",")))
                                    if expected["one_pass"] else None), (gpu, shape)
            for m, lay_text in expected["layouts"].items():
                lay = cfg.layout(int(m))
                got = ",".join(str(v) for v in (lay.depth, lay.tiles, lay.min_blocks,
                                                lay.x_stages, lay.groups, lay.w_stages,
                                                lay.cluster, *(lay.wg or ())))
                assert got == lay_text, (gpu, shape, m)


def test_the_table_is_keyed_by_gpu_sections():
    doc = json.loads(table.TUNED_PATH.read_text())
    assert set(doc) == {"about", "sections"} and "lab/tune_gemm.py" in doc["about"]
    for name, section in doc["sections"].items():
        assert table.re.fullmatch(r"sm\d+-\d+(-\d+gib)?", name), name
        assert set(section) <= {"measured_on", "small_m", "large"}, name


# ------------------------------------------------------------------ small-M

def test_pick_kw_fills_the_gpu_and_keeps_chunks_per_warp():
    assert table.pick_kw(256, 64, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 8
    assert table.pick_kw(8016, 64, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 1
    assert table.pick_kw(12, 9, 132, warps_per_sm=16, min_chunks_per_warp=2, max_kw=8) == 4


def test_shape_entry_overrides_the_rule_and_keeps_missing_classes():
    rule = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 2} for c in ("1", "2", "4", "8")},
            "shapes": {"4096x4096": {"kw": 2, "by_nt": {"1": {"depth": 4, "tiles": 2}}}}}
    tuned = table.small_config(4096, 4096, 132, rule)
    assert tuned.kw == 2
    assert tuned.layout(1) == table.Layout(depth=4, tiles=2)
    assert tuned.layout(64) == table.Layout(depth=2)
    other = table.small_config(4096, 4160, 132, rule)
    assert other.kw == 8 and other.layout(8) == table.Layout(depth=2)


def test_layout_classes_by_rows():
    cfg = table.SmallConfig(kw=4, by_nt=tuple((c, table.Layout(depth=c)) for c in (1, 2, 4, 8)))
    assert [cfg.layout(m).depth for m in (1, 8, 9, 16, 17, 32, 33, 64)] == [1, 1, 2, 2, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="65 rows"):
        cfg.layout(65)


def test_a_clustered_layout_runs_unclustered_where_the_cluster_does_not_divide_kw():
    lay = table.Layout(depth=1, tiles=2, min_blocks=4, cluster=2)
    cfg = table.SmallConfig(kw=1, by_nt=tuple((c, lay) for c in (1, 2, 4, 8)))
    assert cfg.layout(32) == table.Layout(depth=1, tiles=2, min_blocks=2, cluster=1)
    assert table.SmallConfig(kw=4, by_nt=cfg.by_nt).layout(32) == lay


def test_layout_reads_a_warpgroup_schedule_and_the_one_pass():
    rule = {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 1} for c in "1248"},
            "shapes": {"4096x4096": {"kw": 2, "one_pass": [4, 2, 1, 1],
                                     "by_nt": {"8": {"depth": 1, "wg": [4, 1, 1, 2]}}}}}
    cfg = table.small_config(4096, 4096, 132, rule)
    assert cfg.layout(64).wg == (4, 1, 1, 2) and cfg.layout(32).wg is None
    assert cfg.one_pass == (4, 2, 1, 1)
    assert table.small_config(4096, 4160, 132, rule).one_pass is None
    assert cfg.layout(64).schedule() == dict(depth=1, tiles=1, min_blocks=1, x_stages=0,
                                             groups=1, w_stages=0, cluster=1)


@pytest.mark.parametrize("key", [H100, H200], ids=["h100", "h200"])
def test_shipped_small_table_is_what_the_kernels_instantiate(key):
    rule = table.small_rule(key)
    assert rule["max_kw"] <= small.KW_MAX
    for shape, entry in rule["shapes"].items():
        n, k = map(int, shape.split("x"))
        cfg = table.small_config(n, k, 132, rule)
        # a swept shape's kw may pass the rule's cap for unswept shapes, not the kernel's
        assert 1 <= cfg.kw <= small.KW_MAX and cfg.kw == entry["kw"]
        for m in (1, 16, 32, 64):
            lay = cfg.layout(m)
            small.check_small(cfg.kw, **lay.schedule())
            assert small.small_shared_bytes(-(-m // 8), cfg.kw, lay.x_stages, lay.groups,
                                            lay.w_stages, lay.tiles, lay.cluster) <= 227 * 1024
            if lay.wg is not None:  # a warpgroup schedule the kernel has at this kw
                depth, warpgroups, row_groups, split = lay.wg
                wgmma.check(cfg.kw, depth, 16, warpgroups, row_groups, split)
                n_block = 16 * -(-m // 16)
                assert wgmma.shared_bytes(n_block, warpgroups, depth, row_groups) <= 227 * 1024
        if cfg.one_pass is not None:
            depth, warpgroups, row_groups, split = cfg.one_pass
            assert wgmma.check(cfg.kw, depth, 128, warpgroups, row_groups, split)
            assert wgmma.shared_bytes(128, warpgroups, depth, row_groups) <= 227 * 1024


@pytest.mark.parametrize("shape", ["10240x5120", "5120x8192", "51200x5120", "5120x25600"])
def test_the_shipped_32b_entries_at_17_32_rows_take_two_tiles(shape):
    """The four Qwen3-32B layers run two tiles a warp at 17-32 rows: chosen by sustained
    timing, where a burst sweep had picked one; ``sustained`` keeps them through burst
    sweeps."""
    n, k = map(int, shape.split("x"))
    rule = table.small_rule(H200)
    assert table.small_config(n, k, 132, rule).layout(32).tiles == 2
    assert "4" in rule["shapes"][shape]["sustained"]


# ------------------------------------------------------------------ large-M

def test_large_config_by_shape_and_m_class():
    rule = {"default": {**WGMMA, "persist": True}, "max_m": 256,
            "shapes": {"4096x4096": {"128": {"kind": "decode"},
                                     "256": {**WGMMA, "block_m": 128, "a_regs": 1}}}}
    assert table.large_config(4096, 4096, 100, rule) is None
    assert table.large_config(4096, 4096, 129, rule) == WglConfig(block_m=128, a_regs=1)
    assert table.large_config(4096, 4096, 256, rule) == WglConfig(block_m=128, a_regs=1)
    # beyond the measured rows: decode + cuBLAS, for a tuned shape and for the default
    assert table.large_config(4096, 4096, 257, rule) is None
    assert table.large_config(4096, 5120, 256, rule) == WglConfig(persist=True)
    assert table.large_config(4096, 5120, 4096, rule) is None
    with pytest.raises(ValueError, match="'wgmma' or 'decode'"):
        table.large_config(1, 1, 200, {"default": {**WGMMA, "kind": "fused"}, "max_m": 256,
                                       "shapes": {}})


@pytest.mark.parametrize("key", [H100, H200], ids=["h100", "h200"])
def test_shipped_large_table_is_what_the_kernel_instantiates(key):
    """Every entry is a configuration the kernel has (its tail's too), every entry names all
    of its fields, and a shape's entry covers the rows above the class below it; every shape
    has a 128-row entry, so that prefill rows of 65..128 stay on the table."""
    rule = table.large_rule(key)
    table.entry_config(rule["default"]).check()
    for shape, by_m in rule["shapes"].items():
        n, k = map(int, shape.split("x"))
        classes = sorted(map(int, by_m))
        assert 128 in classes
        for m in classes:
            entry = by_m[str(m)]
            assert entry["kind"] == "decode" or set(entry) == set(WGMMA), (shape, m)
            cfg = table.large_config(n, k, m, rule)
            if cfg is not None:
                cfg.check()
        for lower, upper in itertools.pairwise(classes):
            assert table.large_config(n, k, lower + 1, rule) == table.large_config(n, k, upper,
                                                                                    rule)
        assert table.large_config(n, k, classes[-1] + 1, rule) is None
