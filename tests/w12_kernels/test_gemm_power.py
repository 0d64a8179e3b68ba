"""benchmarks/gemm_power.py's table logic on the CPU: which sustained winner replaces the
table's schedule, and how it is written into the table."""

import json
import sys

import pytest
from gemm_helpers import benchmark_module

from w12_kernels.gemm import config as cfgs

T2 = dict(depth=1, prefetch=False, tiles=2, min_blocks=1, x_stages=0, groups=1, w_stages=0,
          cluster=1)
T3 = {**T2, "tiles": 3}


def _row(shape, m, schedule, us, layout=None):
    return dict(shape=shape, m=m, schedule=schedule, us=us, layout=layout)


def test_choose_sustained_takes_the_fastest_past_the_margin():
    gp = benchmark_module("gemm_power")
    rows = [
        _row("10240x5120", 32, "cublas", 28.0),
        _row("10240x5120", 32, "table", 25.3),
        _row("10240x5120", 32, "t2", 24.6, T2),
        _row("10240x5120", 32, "t3", 24.9, T3),
        _row("5120x8192", 32, "table", 22.0),
        _row("5120x8192", 32, "t2", 21.9, T2),  # 0.5% faster: under the 1% margin
        _row("4096x4096", 16, "table", 10.0),
        _row("4096x4096", 16, "t3", 9.0, T3),
    ]
    choices = gp.choose_sustained(rows, 0.01)
    assert choices == {("10240x5120", "4"): T2, ("4096x4096", "2"): T3}
    # cuBLAS (no layout) is never a choice, however fast
    assert gp.choose_sustained([_row("a", 32, "table", 9.0), _row("a", 32, "cublas", 1.0)],
                               0.0) == {}


def test_apply_choices_changes_only_the_chosen_class():
    gp = benchmark_module("gemm_power")
    table = json.loads(cfgs.TUNED_PATH.read_text())
    shape = "10240x5120"
    before = table["small_m"]["shapes"][shape]
    new = gp.apply_choices(table, {(shape, "4"): T3, ("1x1", "4"): T3})
    after = new["small_m"]["shapes"][shape]
    assert after["kw"] == before["kw"]  # the split, so the sums, stay
    assert after["by_nt"]["4"] == T3
    assert after["sustained"] == sorted({*before.get("sustained", ()), "4"})
    assert {c: v for c, v in after["by_nt"].items() if c != "4"} == \
        {c: v for c, v in before["by_nt"].items() if c != "4"}
    assert "1x1" not in new["small_m"]["shapes"]  # no entry of its own: left to the rule
    assert table["small_m"]["shapes"][shape] == before  # the input is not modified
    # what it writes reads back as a configuration
    cfg = cfgs.small_config(10240, 5120, 132, {**cfgs.DEFAULT_RULE, **new["small_m"]})
    assert cfg.layout(32) == cfgs.Layout(**T3)


@pytest.mark.parametrize("shape", ["10240x5120", "5120x8192", "51200x5120", "5120x25600"])
def test_the_shipped_32b_entries_at_17_32_rows_take_two_tiles(shape):
    """The four Qwen3-32B layers run two tiles a warp at 17-32 rows: chosen by sustained
    timing (docs/PERF_GEMM.md #56), where the burst sweep had picked one."""
    n, k = map(int, shape.split("x"))
    assert cfgs.small_config(n, k, 132).layout(32).tiles == 2
    assert "4" in cfgs.rule()["shapes"][shape]["sustained"]  # kept by burst sweeps


def test_large_power_refuses_small_m_and_prints_energy_and_budget(monkeypatch, capsys):
    """``benchmarks/large_power.py``: rows of 64 or fewer are refused (not the large-M path),
    a machine without the warpgroup kernel is told so, and a row prints its ratio to cuBLAS,
    clock, power, energy and ERR where the error is over the budget."""
    lp = benchmark_module("large_power")
    monkeypatch.setattr(sys, "argv", ["large_power.py", "--shapes", "64x64", "--m", "64,512"])
    with pytest.raises(SystemExit, match="rows above 64"):
        lp.main()
    from w12_kernels.gemm import cuda_large

    monkeypatch.setattr(cuda_large, "available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["large_power.py", "--shapes", "64x64", "--m", "512",
                                      "--configs", "256,2,5,5,1,2"])
    with pytest.raises(SystemExit, match="compute-capability 9.0"):
        lp.main()
    row = dict(n=5120, k=25600, m=512, label="table", us=271.2, ratio=0.766, sm_mhz=1410.0,
               watts=681.0, uj=184687.0, power_capped=0.9, err_ratio=2.5)
    lp.print_row(row)
    out = capsys.readouterr().out
    assert "5120x25600 M=512" in out and "x0.766" in out and "1410 MHz" in out
    assert "681 W" in out and "184687 uJ/call" in out and "capped 90%" in out
    assert "ERR x2.5" in out
    lp.print_row({**row, "err_ratio": 1.0, "power_capped": None, "sm_mhz": None})
    out = capsys.readouterr().out
    assert "ERR" not in out and "capped" not in out and "  - MHz" in out
