"""benchmarks/ncu_target.py on the CPU: every (shape, M) called twice, the launches numbered in
order (what an Nsight Compute filter on the GPU counts)."""

import sys

from gemm_helpers import benchmark_module


def test_ncu_target_numbers_two_calls_per_shape_and_row_count(monkeypatch, capsys):
    target = benchmark_module("ncu_target")
    monkeypatch.setattr(target, "DEVICE", "cpu")
    monkeypatch.setattr(sys, "argv", ["ncu_target.py", "--shapes", "40x70,16x64", "--m", "1,9"])
    target.main()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"launch {i}: {s} M={m} ({c})" for i, (s, m, c) in enumerate(
        (s, m, c) for s in ("40x70", "16x64") for m in (1, 9) for c in ("compile", "profile"))]
