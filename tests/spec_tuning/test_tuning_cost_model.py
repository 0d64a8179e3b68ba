"""Cost model: exact factorisation of the ceiling, floors, trees, peaks, the explain output."""

import math

import numpy as np
import pytest
import torch

from spec_tuning.cost_model import (
    BANDWIDTH_EFFICIENCY,
    COMPUTE_EFFICIENCY,
    Peaks,
    best_tree_tau,
    decompose,
    explain,
    kernel_floor,
    measure_peaks,
    measurement_warnings,
    speedup,
    speedup_curve,
)
from spec_tuning.profiler import KernelCost, KernelTiming, StepProfile, profile_step
from w12.errors import W12Error

PEAKS = Peaks("test", bandwidth=4.0e12, bf16_flops=800e12)


def _profile(rng, kernels=6, overhead=1.3):
    timings = []
    for i in range(kernels):
        cost = None if i == 0 else KernelCost(bytes=rng.uniform(1e6, 1e9),
                                              flops=rng.uniform(1e6, 1e13))
        floor = 0.0 if cost is None else max(cost.bytes / (0.9 * PEAKS.bandwidth),
                                             cost.flops / (0.6 * PEAKS.bf16_flops))
        timings.append(KernelTiming(f"k{i}", seconds=floor * rng.uniform(1, 4) + 1e-6,
                                    calls=1, cost=cost))
    step = sum(k.seconds for k in timings) * overhead
    return StepProfile(step, timings, "test")


@pytest.mark.parametrize("seed", range(5))
def test_factors_multiply_to_the_ceiling(seed):
    rng = np.random.default_rng(seed)
    prof = _profile(rng, overhead=rng.uniform(1.0, 2.0))
    tau = rng.uniform(1.5, 4.0)
    tau_best = tau * rng.uniform(1.0, 1.5)
    t_ar = rng.uniform(1e-3, 1e-2)
    d = decompose(prof, tau=tau, tau_best=tau_best, t_ar=t_ar, peaks=PEAKS)
    floor = sum(kernel_floor(k, PEAKS) for k in prof.kernels)
    assert d.speedup == pytest.approx(tau * t_ar / prof.step_seconds, rel=1e-12)
    assert d.ceiling == pytest.approx(tau_best * t_ar / floor, rel=1e-12)
    product = math.prod(d.factors.values())
    assert d.speedup * product == pytest.approx(d.ceiling, rel=1e-12)
    assert d.factors["overhead"] == pytest.approx(prof.step_seconds / prof.kernel_seconds)


def test_largest_factor_names_the_direction():
    slow_kernel = KernelTiming("gemm", 10e-3, 1, KernelCost(bytes=4e9 * 0.9, flops=0))  # 10x
    prof = StepProfile(10.5e-3, [slow_kernel], "test")
    d = decompose(prof, tau=3.0, tau_best=3.3, t_ar=5e-3, peaks=PEAKS)
    assert d.factors["kernels"] == pytest.approx(10.0)
    assert d.next_direction == "kernels"
    at_floor = KernelTiming("gemm", 1e-3, 1, KernelCost(bytes=4e12 * 0.9 * 1e-3, flops=0))
    d = decompose(StepProfile(3e-3, [at_floor], "test"), tau=3.0, tau_best=3.3, t_ar=5e-3,
                  peaks=PEAKS)
    assert d.factors["kernels"] == pytest.approx(1.0)
    assert d.factors["overhead"] == pytest.approx(3.0) and d.next_direction == "overhead"
    d = decompose(prof, tau=1.2, tau_best=40.0, t_ar=5e-3, peaks=PEAKS)
    assert d.next_direction == "acceptance"


def test_kernel_floor_is_bytes_or_flops_bound():
    mem = KernelTiming("m", 1.0, 2, KernelCost(bytes=1e9, flops=1e9))
    assert kernel_floor(mem, PEAKS) == pytest.approx(2e9 / (BANDWIDTH_EFFICIENCY * 4e12))
    comp = KernelTiming("c", 1.0, 1, KernelCost(bytes=1e6, flops=1e14))
    assert kernel_floor(comp, PEAKS) == pytest.approx(1e14 / (COMPUTE_EFFICIENCY * 800e12))
    assert kernel_floor(KernelTiming("u", 0.25, 3), PEAKS) == 0.25  # no annotation


def test_decompose_rejects_nonsense():
    with pytest.raises(W12Error, match="tau=0"):
        decompose(_profile(np.random.default_rng(0)), tau=0, tau_best=1, t_ar=1, peaks=PEAKS)


def test_speedup_curve():
    curve = speedup_curve({4: 2.0, 8: 2.6, 16: 3.0}, {4: 1.1, 8: 1.2, 32: 2.0}, t_ar=1.0)
    assert curve == pytest.approx({4: 2.0 / 1.1, 8: 2.6 / 1.2})
    assert speedup(3.0, 2.0, 1.0) == 1.5
    with pytest.raises(W12Error):
        speedup_curve({4: 2.0}, {8: 1.0}, 1.0)


def test_best_tree_tau():
    assert best_tree_tau([0.8, 0.1], 0) == 1.0
    assert best_tree_tau([0.8], 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)  # a chain
    # With [0.6, 0.3]: nodes 0.6, 0.36 (child), 0.3 (sibling), 0.216, 0.18, 0.18 ...
    assert best_tree_tau([0.3, 0.6], 3) == pytest.approx(1 + 0.6 + 0.36 + 0.3)
    sizes = [best_tree_tau([0.7, 0.2, 0.05], n) for n in range(12)]
    assert all(b >= a for a, b in zip(sizes, sizes[1:], strict=False))
    with pytest.raises(W12Error):
        best_tree_tau([1.5], 2)


def test_measure_peaks_on_cpu():
    peaks = measure_peaks("cpu", copy_bytes=4 << 20, matmul_size=64, repeats=3)
    assert peaks.device == "cpu"
    assert peaks.bandwidth > 0 and peaks.bf16_flops > 0
    assert math.isfinite(peaks.bandwidth) and math.isfinite(peaks.bf16_flops)


def test_profile_step_on_cpu_with_annotations():
    a, b, c = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64)
    mm_cost = KernelCost(bytes=3 * 64 * 64 * 4, flops=2 * 64**3)
    prof = profile_step(lambda: torch.relu(a @ b + c), repeats=2,
                        annotations={"aten::mm": mm_cost, "no_such_kernel": KernelCost()})
    names = {k.name: k for k in prof.kernels}
    assert "aten::mm" in names and names["aten::mm"].cost == mm_cost
    assert names["aten::mm"].calls == 1 and names["aten::mm"].total_flops == 2 * 64**3
    assert prof.unmatched_annotations == ["no_such_kernel"]
    assert prof.step_seconds > 0 and prof.kernel_seconds > 0


def test_ambiguous_annotation_is_a_user_error():
    a = torch.randn(8, 8)
    with pytest.raises(W12Error, match="several annotations"):
        profile_step(lambda: a @ a, repeats=1,
                     annotations={"aten::m": KernelCost(), "mm": KernelCost()})


def test_explain_writes_table_and_png(tmp_path):
    prof = _profile(np.random.default_rng(3))
    png = tmp_path / "explain.png"
    table = explain(prof, tau=2.5, tau_best=3.0, t_ar=2e-3, peaks=PEAKS, tree_size=16,
                    png_path=png)
    assert "tree size N=16" in table and "T_prof/T_floor" in table and "next direction" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    d = decompose(prof, tau=2.5, tau_best=3.0, t_ar=2e-3, peaks=PEAKS)
    assert f"{d.factors['acceptance']:.3f}x" in table


def test_measurements_that_contradict_each_other_are_flagged():
    assert measurement_warnings(t_ar=1e-3, t_step=1.5e-3, tree_size=4, t_prof=1e-3,
                                t_floor=0.5e-3) == []
    cheap = measurement_warnings(t_ar=1e-3, t_step=0.8e-3, tree_size=4)
    assert len(cheap) == 1 and "c(4) = 0.800 < 1" in cheap[0]
    assert measurement_warnings(t_ar=1e-3, t_step=0.8e-3, tree_size=1) == []  # N = 1: T_AR
    long_kernels = measurement_warnings(t_ar=1e-3, t_step=1e-3, tree_size=1, t_prof=1.2e-3)
    assert len(long_kernels) == 1 and "overhead factor < 1" in long_kernels[0]
    below_floor = measurement_warnings(t_ar=1e-3, t_step=1e-3, tree_size=1, t_prof=0.5e-3,
                                       t_floor=0.6e-3)
    assert len(below_floor) == 1 and "faster than their floor" in below_floor[0]
