"""The table logic of ``tune_gemm.py``'s steps, on made-up timings: what each step writes."""

from __future__ import annotations

import json

import pytest
from gemm_tuning import large, power, small, table_io, toggle, wgmma

from w12_kernels.gemm import table
from w12_kernels.gemm.large.launcher import WglConfig


def _in_use(by_nt_tiles=None, shapes=None) -> dict:
    return {"warps_per_sm": 16, "min_chunks_per_warp": 2, "max_kw": 8,
            "by_nt": {c: {"depth": 1, "tiles": (by_nt_tiles or {}).get(c, 1)} for c in "1248"},
            "shapes": shapes or {}}


def test_every_small_candidate_is_a_valid_schedule():
    from w12_kernels.gemm.small import launcher as kernel

    assert max(small.SWEEP_KW) <= kernel.KW_MAX
    for cls, layouts in small.SWEEP_LAYOUTS.items():
        assert len(set(layouts)) == len(layouts)
        for lay in layouts:
            d = small.layout_dict(lay)
            for kw in small.SWEEP_KW:
                if kw * d["groups"] > 32 or kw % d["cluster"]:
                    continue
                kernel.check_small(kw, **d)
                assert kw > 8 or kernel.small_shared_bytes(
                    cls, kw, d["x_stages"], d["groups"], d["w_stages"], d["tiles"],
                    d["cluster"]) <= 227 * 1024


def test_small_candidates_are_distinct_and_named_as_the_kernels_they_compile():
    for m in (1, 16, 32, 64):
        cands = small.sweep_candidates(4096, 4096, m, small.SWEEP_KW)
        labels = [label for label, _, _ in cands]
        assert len(set(labels)) == len(labels) > 0
        for _, kw, lay in cands:
            d = small.layout_dict(lay)
            assert small.kernel_of(m, kw, lay).startswith("w12_gemm_small")
            assert f"{-(-m // 8)}, {d['depth']}, {d['tiles']}" in small.kernel_of(m, kw, lay)
    assert small.sweep_candidates(4096, 192, 16, small.SWEEP_KW) == []  # 3 columns: kw 1 only


def test_sweep_keeps_the_layouts_of_classes_it_did_not_time():
    in_use = _in_use({"8": 2}, {"4096x4096": {"kw": 8, "by_nt": {"8": {"depth": 3, "tiles": 2}}}})
    rows = [dict(n=4096, k=4096, m=1, kw=kw, **small.layout_dict(lay), us=10.0 + i + kw,
                 err_ratio=1.0, cublas_us=13.0)
            for kw in small.SWEEP_KW for i, lay in enumerate(small.SWEEP_LAYOUTS[1])]
    part, _ = small.choose_rule(rows, 132, in_use)
    assert part["by_nt"]["1"] == small.layout_dict(small.SWEEP_LAYOUTS[1][0])
    for cls in ("2", "4", "8"):
        assert part["by_nt"][cls] == in_use["by_nt"][cls]
    shape = part["shapes"]["4096x4096"]
    assert shape["kw"] == min(small.SWEEP_KW)
    assert shape["by_nt"]["8"] == {"depth": 3, "tiles": 2}


def test_sweep_at_the_tables_kw_scores_layouts_at_that_kw():
    layouts = small.SWEEP_LAYOUTS[4]
    fastest = layouts[-1]
    rows = [dict(n=n, k=k, m=32, kw=kw, **small.layout_dict(lay),
                 us=9.0 if lay == fastest else 12.0, err_ratio=1.0, cublas_us=13.0)
            for (n, k), kw in (((4096, 4096), 8), ((28672, 4096), 2)) for lay in layouts]
    part, mean = small.choose_rule(rows, 132, _in_use(), keep_kw=True)
    assert part["by_nt"]["4"] == small.layout_dict(fastest)
    assert mean == pytest.approx(13.0 / 9.0)
    assert part["warps_per_sm"] == 16 and part["shapes"]["28672x4096"]["kw"] == 2


def test_sweep_keeps_warpgroup_sustained_and_one_pass_choices_at_the_same_kw_only():
    entry = {"kw": 2, "one_pass": [4, 2, 2, 1], "sustained": ["4"],
             "by_nt": {"4": {"depth": 1, "tiles": 2}, "8": {"depth": 1, "wg": [4, 1, 1, 2]}}}
    in_use = _in_use(shapes={f"{n}x4096": entry for n in (4096, 28672)})
    rows = [dict(n=n, k=4096, m=m, kw=kw, **small.layout_dict(lay), us=10.0, err_ratio=1.0,
                 cublas_us=13.0)
            for n, kw in ((28672, 2), (4096, 8)) for m in (32, 64)
            for lay in small.SWEEP_LAYOUTS[small.nt_class(m)][:2]]
    part, _ = small.choose_rule(rows, 132, in_use, keep_kw=True)
    kept = part["shapes"]["28672x4096"]
    assert kept["by_nt"]["8"]["wg"] == [4, 1, 1, 2] and kept["one_pass"] == [4, 2, 2, 1]
    assert kept["by_nt"]["4"] == {"depth": 1, "tiles": 2} and kept["sustained"] == ["4"]
    moved = part["shapes"]["4096x4096"]
    assert moved["kw"] == 8 and "wg" not in moved["by_nt"]["8"]
    assert "one_pass" not in moved and "sustained" not in moved


def test_sweep_picks_the_nt1_layout_on_every_timed_row_count():
    """A layout that wins M = 1 by 1% but loses M = 8 by 10% is not the NT = 1 choice."""
    layouts = small.SWEEP_LAYOUTS[1]
    in_registers, staged = layouts[0], layouts[-1]
    times = {(in_registers, 1): 9.9, (staged, 1): 10.0, (in_registers, 8): 11.0,
             (staged, 8): 10.0}
    rows = [dict(n=4096, k=4096, m=m, kw=8, **small.layout_dict(lay),
                 us=times.get((lay, m), 20.0), err_ratio=1.0, cublas_us=13.0)
            for m in (1, 8) for lay in layouts]
    part, _ = small.choose_rule(rows, 132, _in_use(), keep_kw=True)
    assert part["shapes"]["4096x4096"]["by_nt"]["1"] == small.layout_dict(staged)


def test_a_sweep_of_some_shapes_keeps_the_rest():
    lay = {"depth": 1, "tiles": 1}
    current = {**_in_use(), "shapes": {"4096x4096": {"kw": 8, "by_nt": {"2": lay}},
                                       "8192x8192": {"kw": 8, "by_nt": {"2": lay}}}}
    swept = {**_in_use(), "warps_per_sm": 64,
             "shapes": {"4096x4096": {"kw": 16, "by_nt": {"2": {**lay, "tiles": 2}}}}}
    merged = small.partial_update(current, swept, every_shape=False)
    assert merged["warps_per_sm"] == 16 and merged["shapes"]["8192x8192"]["kw"] == 8
    assert merged["shapes"]["4096x4096"]["kw"] == 16
    assert small.partial_update(current, swept, every_shape=True) == swept


def test_large_candidates_and_their_entries():
    labels = [large.label(c) for c in large.CANDIDATES]
    assert len(set(labels)) == len(labels) == len(set(large.CANDIDATES))
    for cand in large.CANDIDATES:
        cand.check()
        assert table.entry_config(large.entry(cand)) == cand
    assert large.label(None) == "decode" and large.entry(None) == {"kind": "decode"}
    assert large.label(WglConfig(persist=True, wreuse=True)) == "wgmma_m256_g2_x5_w5_k1_rp_ps_wr"


def test_large_choice_keeps_the_current_entry_within_the_margin():
    current, other = large.CANDIDATES[3], large.CANDIDATES[0]
    rows = [dict(n=4096, k=4096, m=m, label=large.label(c), us=us, err_ratio=1.0,
                 cublas_us=200.0)
            for m, times in ((256, (101.0, 100.0)), (512, (105.0, 100.0)))
            for c, us in zip((current, other), times, strict=True)]
    cur = {(4096, 4096, m): large.label(current) for m in (256, 512)}
    part = large.choose(rows, (None, current, other), cur, keep_margin=0.02)
    assert part["shapes"]["4096x4096"]["256"] == large.entry(current)
    assert part["shapes"]["4096x4096"]["512"] == large.entry(other)
    part = large.choose(rows, (None, current, other), cur, keep_margin=0.0)
    assert part["shapes"]["4096x4096"]["256"] == large.entry(other)
    assert part["max_m"] == 512 and part["default"] == large.entry(other)


def test_large_current_candidate_reads_the_table():
    rule = {"shapes": {"64x64": {"256": large.entry(large.CANDIDATES[2]),
                                 "512": {"kind": "decode"}}}}
    assert large.current_candidate(64, 64, 256, rule) == large.CANDIDATES[2]
    assert large.current_candidate(64, 64, 512, rule) is None  # decode + cuBLAS
    assert large.current_candidate(64, 64, 1024, rule) is False  # no entry


def test_large_merges_keep_the_rest_of_a_section():
    wg = large.entry(WglConfig())
    current = {"default": wg, "max_m": 1024,
               "shapes": {"64x64": {"256": wg, "1024": {"kind": "decode"}}, "128x64": {"256": wg}}}
    swept = {"default": {"kind": "decode"}, "max_m": 2048,
             "shapes": {"64x64": {"256": {"kind": "decode"}}}}
    merged = table_io.merge_large(current, swept)
    assert merged["default"] == wg and merged["max_m"] == 2048
    assert merged["shapes"]["64x64"] == {"256": {"kind": "decode"}, "1024": {"kind": "decode"}}
    assert merged["shapes"]["128x64"] == {"256": wg}
    assert table_io.merge_large(current, swept, keep_default=False)["default"] == swept["default"]
    # a memory section has no default nor max_m: a partial write adds neither
    over = table_io.merge_large({"shapes": {}}, swept)
    assert set(over) == {"shapes"}
    assert current["shapes"]["64x64"]["256"] == wg  # the input is not changed


def test_the_one_writer_keeps_every_other_part(tmp_path, monkeypatch):
    path = tmp_path / "tuned.json"
    monkeypatch.setattr(table, "TUNED_PATH", path)
    table_io.write_table("sm90-132", "small_m", {"max_kw": 4}, "GPU A")
    table_io.write_table("sm90-132", "large", {"shapes": {}}, "GPU B")
    table_io.write_table("sm90-132-140gib", "large", {"shapes": {"1x1": {"128": {"kind":
                                                                                "decode"}}}})
    doc = json.loads(path.read_text())
    assert doc["about"] == table_io.ABOUT
    assert doc["sections"]["sm90-132"] == {"measured_on": ["GPU A", "GPU B"],
                                           "small_m": {"max_kw": 4}, "large": {"shapes": {}}}
    assert table.load() == doc["sections"]  # (the caches cleared)
    assert table_io.read_section("sm90-132-140gib")["large"]["shapes"]["1x1"]
    assert path.read_text().count("\n") > 5  # one line per entry, not one long line
    with pytest.raises(ValueError, match="part"):
        table_io.write_table("sm90-132", "other", {})
    table.load.cache_clear()


def test_sections_written_are_this_gpus():
    key = table.GpuKey("sm90", 132, 139.8)
    assert table_io.section_key("base", key) == "sm90-132"
    assert table_io.section_key("exact", key) == "sm90-132-140gib"
    with pytest.raises(SystemExit, match="base or exact"):
        table_io.section_key("other", key)


def test_the_shipped_file_is_written_as_the_writer_writes_it():
    text = table.TUNED_PATH.read_text()
    assert table_io.format_table(json.loads(text)) + "\n" == text


def test_wgmma_choice_needs_the_margin_on_every_measured_row_count():
    def row(m, mma, wg, bits=True):
        return {"n": 4096, "k": 4096, "m": m, "us": {"mma_sync": mma, **wg},
                "bits_equal_small": dict.fromkeys(wg, bits)}

    rows = [row(17, 10.0, {"wg_d4_g1_r1_s2": 9.0, "wg_d8_g1_r1_s1": 9.9}),
            row(32, 10.0, {"wg_d4_g1_r1_s2": 9.6, "wg_d8_g1_r1_s1": 9.5}),
            row(48, 10.0, {"wg_d4_g1_r1_s2": 9.0}),
            row(64, 10.0, {"wg_d4_g1_r1_s2": 9.9}),  # class 8: worst ratio 0.99 > 0.97
            row(16, 10.0, {"wg_d8_g1_r1_s2": 5.0}, bits=False),  # faster, other bits
            row(100, 10.0, {"wg_d4_g2_r2_s1": 8.0})]  # 65..128 rows: the one pass
    chosen = wgmma.choose(rows)
    assert chosen[(4096, 4096, 4)] == [4, 1, 1, 2]  # worst 0.96 against 0.99
    assert chosen[(4096, 4096, 8)] is None and chosen[(4096, 4096, 2)] is None
    assert chosen[(4096, 4096, wgmma.ONE_PASS)] == [4, 2, 2, 1]
    part = {"by_nt": {"4": {"depth": 1}, "8": {"depth": 1}},
            "shapes": {"4096x4096": {"kw": 8, "by_nt": {"8": {"depth": 1, "wg": [4, 2, 1, 1]}}},
                       "8192x8192": {"kw": 8}}}
    got = wgmma.apply_choices(part, {**chosen, (1, 1, 4): [4, 1, 1, 1]})
    entry = got["shapes"]["4096x4096"]
    assert entry["by_nt"]["4"] == {"depth": 1, "wg": [4, 1, 1, 2]}
    assert entry["by_nt"]["8"] == {"depth": 1} and entry["one_pass"] == [4, 2, 2, 1]
    assert "1x1" not in got["shapes"] and part["shapes"]["4096x4096"]["by_nt"]["8"]["wg"]


def test_toggle_writes_an_option_only_where_every_round_agrees():
    wg = large.entry(WglConfig())
    rule = {"shapes": {"64x64": {"512": wg, "1024": {**wg, "l2hint": True}}}}
    assert toggle.table_entry(64, 64, 300, rule) == ("512", wg)
    assert toggle.table_entry(64, 64, 1000, rule) == ("1024", {**wg, "l2hint": True})
    assert toggle.table_entry(64, 64, 2000, rule) is None
    win, lose = [(100.0, 95.0, 90.0), (102.0, 97.0, 91.0)], [(95.0, 100.0, 90.0)] * 2
    assert toggle.table_change(wg, "l2hint", win, 0.01) == {**wg, "l2hint": True}
    assert toggle.table_change({**wg, "l2hint": True}, "l2hint", win, 0.01) is None
    assert toggle.table_change({**wg, "l2hint": True}, "l2hint", lose, 0.01) == wg
    assert toggle.table_change(wg, "l2hint", lose, 0.01) is None
    assert toggle.table_change(wg, "l2hint", [win[0], lose[0]], 0.01) is None
    assert toggle.table_change(wg, "l2hint", [(100.0, 99.5, 90.0)], 0.01) is None
    assert toggle.same_bits("l2hint", WglConfig(persist=True))
    assert toggle.same_bits("wreuse", WglConfig()) and not toggle.same_bits(
        "wreuse", WglConfig(persist=True))
    assert not toggle.same_bits("xorder", WglConfig())


def test_power_choice_takes_the_fastest_past_the_margin():
    def r(sched, m, us, layout=None):
        return dict(shape="64x64", m=m, schedule=sched, us=us, layout=layout)

    lay_a, lay_b = {"depth": 1, "tiles": 2}, {"depth": 1, "tiles": 3}
    rows = [r("cublas", 32, 5.0), r("table", 32, 10.0), r("a", 32, 9.0, lay_a),
            r("b", 32, 8.5, lay_b), r("table", 8, 10.0), r("a", 8, 9.95, lay_a)]
    assert power.choose(rows, 0.01) == {("64x64", "4"): lay_b}
    part = {"shapes": {"64x64": {"kw": 2, "by_nt": {"4": lay_a}, "sustained": ["2"]}}}
    got = power.apply_choices(part, {("64x64", "4"): lay_b, ("9x9", "1"): lay_a})
    assert got["shapes"]["64x64"] == {"kw": 2, "by_nt": {"4": lay_b}, "sustained": ["2", "4"]}
    assert "9x9" not in got["shapes"]
