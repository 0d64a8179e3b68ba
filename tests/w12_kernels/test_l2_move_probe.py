"""benchmarks/l2_move_probe.py on the CPU: its reading of made-up stamps."""

import numpy as np
from gemm_helpers import benchmark_module


def test_rates_of_made_up_stamps():
    probe = benchmark_module("l2_move_probe")
    stamps = np.zeros((4, 8), dtype=np.uint64)
    # write start, stores issued, flagged, flag seen, read done (ns)
    stamps[0, :5] = [1000, 1500, 3000, 3100, 4100]    # write 2 us, read 1 us
    stamps[1, :5] = [1000, 1400, 5000, 5200, 9200]    # write 4 us, read 4 us
    stamps[2, :5] = [2000, 2600, 5000, 5000, 7000]    # write 3 us, read 2 us
    r = probe.rates(stamps, 3)
    assert r["pairs"] == 3
    assert r["write_us"] == 3.0 and r["write_us_max"] == 4.0
    assert r["issue_us"] == 0.5
    assert r["read_us"] == 2.0 and r["read_us_max"] == 4.0
    assert round(r["write_gbs"], 1) == round(128 * 1024 / 3000, 1)  # bytes per ns = GB/s
    assert round(r["read_gbs"], 1) == round(128 * 1024 / 2000, 1)
