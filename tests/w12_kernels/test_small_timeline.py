"""benchmarks/small_timeline.py's reading of the stamps on the CPU: a made-up timeline of four
warps (two blocks of kw 2 on a 32x256 weight) turned into the report's phases."""

from types import SimpleNamespace

import numpy as np
from gemm_helpers import benchmark_module

from w12_kernels.gemm import config as cfgs


def _warp(entry, first, mid, loop_end, barrier, end, sm):
    """One warp's eight words, in ns (the kernel's globaltimer is a ns counter)."""
    return [entry, first, mid, loop_end, barrier, end, 0, sm]


def test_stats_of_a_made_up_timeline():
    tl = benchmark_module("small_timeline")
    base = 5_000_000  # the counter does not start at 0
    warps = [  # (entry, first column, middle column, loop end, barrier, last store) in ns
        _warp(0, 2000, 3000, 4000, 4500, 5000, 3),
        _warp(100, 2100, 3100, 4100, 4500, 5200, 3),
        _warp(200, 1900, 2900, 3900, 4400, 4600, 7),
        _warp(300, 2300, 3300, 4300, 4800, 6000, 7),
    ]
    words = np.zeros(64, dtype=np.uint64)
    for i, w in enumerate(warps):
        words[8 * i: 8 * i + 8] = [v + base if j < 6 else v for j, v in enumerate(w)]
    layer = SimpleNamespace(n=32, k=256)  # 2 tiles x 4 chunk columns
    s = tl._stats(words, layer, 2, cfgs.Layout(depth=1, tiles=1))
    assert s["warps"] == 4 and s["cols"] == 2 and s["sms"] == 2
    assert s["warps_per_sm"] == "2-2"
    assert s["span"] == 6.0  # the first entry to the last store
    assert s["entry_spread"] == 0.3
    assert s["first_col"] == 2.0 and s["first_col_max"] == 2.0  # each warp's own
    assert s["loop"] == 2.0  # first column -> loop end, median
    assert s["loop_end_max"] == 4.3 and s["end_max"] == 6.0
    assert s["to_barrier"] == 0.5
    assert abs(s["stores"] - 0.6) < 1e-9  # medians of 0.5, 0.7, 0.2, 1.2
    assert abs(s["epilogue_max"] - 1.7) < 1e-9


def test_stats_skip_warps_that_never_ran():
    """A slot left at zero (a warp past the grid, or a launch cut short) is not a warp."""
    tl = benchmark_module("small_timeline")
    words = np.zeros(64, dtype=np.uint64)
    words[0:8] = [10_000, 12_000, 13_000, 14_000, 14_500, 15_000, 0, 1]
    s = tl._stats(words, SimpleNamespace(n=32, k=256), 2, cfgs.Layout(depth=1, tiles=1))
    assert s["warps"] == 1 and s["span"] == 5.0 and s["first_col"] == 2.0


def test_without_a_gpu_it_says_so(capsys, monkeypatch):
    tl = benchmark_module("small_timeline")
    monkeypatch.setattr(tl.cuda, "available", lambda: False)
    assert tl.main(["--shapes", "64x64", "--m", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
