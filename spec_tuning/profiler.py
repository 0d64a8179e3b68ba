"""Per-kernel times of one step of any callable, with bytes/flops annotations for the floor.

``profile_step`` times the callable on the wall clock (synchronising the device around it),
then runs it a few times under ``torch.profiler``, groups the events by kernel name and
divides by the number of calls: device kernels on CUDA, operator self-times on the CPU
(self-time, so nested operators are not counted twice). CPU operator times include the
profiler's own per-operator cost, so on the CPU T_prof can exceed the step's wall time.
Annotations map a kernel name, or a substring of it, to the bytes and flops one call moves
and computes; the cost model turns them into a floor time per kernel.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from w12.errors import W12Error

# Profiler bookkeeping rows that are not work of the profiled callable.
_IGNORED_PREFIXES = ("ProfilerStep", "[memory]", "cudaDeviceSynchronize", "Activity Buffer")


@dataclass(frozen=True)
class KernelCost:
    """What one call of a kernel must move and compute, at minimum."""

    bytes: float = 0.0
    flops: float = 0.0


@dataclass(frozen=True)
class KernelTiming:
    """A kernel's total time in one step, its call count and (if annotated) its cost."""

    name: str
    seconds: float
    calls: int = 1
    cost: KernelCost | None = None  # per call

    @property
    def total_bytes(self) -> float | None:
        return None if self.cost is None else self.cost.bytes * self.calls

    @property
    def total_flops(self) -> float | None:
        return None if self.cost is None else self.cost.flops * self.calls


@dataclass
class StepProfile:
    step_seconds: float  # wall time of one step, median of the timed calls
    kernels: list[KernelTiming]
    device: str
    unmatched_annotations: list[str] = field(default_factory=list)

    @property
    def kernel_seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _wall_time(fn: Callable[[], object], device: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _match_cost(name: str, annotations: Mapping[str, KernelCost], used: set) -> KernelCost | None:
    if name in annotations:
        used.add(name)
        return annotations[name]
    hits = [key for key in annotations if key in name]
    if len(hits) > 1:
        raise W12Error(f"kernel {name!r} matches several annotations: {sorted(hits)}")
    if hits:
        used.add(hits[0])
        return annotations[hits[0]]
    return None


def _event_seconds(event, on_device: bool) -> float:
    if on_device:
        micros = getattr(event, "self_device_time_total", None)
        if micros is None:  # older torch
            micros = event.self_cuda_time_total
        return micros * 1e-6
    return event.self_cpu_time_total * 1e-6


def _kernel_events(prof, on_device: bool, steps: int):
    from torch.autograd import DeviceType

    for event in prof.key_averages():
        if event.key.startswith(_IGNORED_PREFIXES):
            continue
        if on_device and event.device_type != DeviceType.CUDA:
            continue
        seconds = _event_seconds(event, on_device) / steps
        if seconds > 0:
            yield event.key, seconds, max(1, round(event.count / steps))


def profile_step(fn: Callable[[], object], *, device: str = "cpu",
                 annotations: Mapping[str, KernelCost] | None = None, warmup: int = 2,
                 repeats: int = 5) -> StepProfile:
    """Wall time and per-kernel times of one call of ``fn`` on ``device`` ("cpu" or "cuda").

    ``fn`` runs ``warmup`` times unmeasured, ``repeats`` times on the wall clock (the median
    is the step time) and ``repeats`` times under the profiler (kernel times are averages).
    """
    from torch.profiler import ProfilerActivity, profile

    annotations = dict(annotations or {})
    on_device = device.startswith("cuda")
    for _ in range(warmup):
        fn()
    step_seconds = _wall_time(fn, device, repeats)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    with warnings.catch_warnings():
        # Some torch versions warn that events are cleared per cycle; one cycle is all we use.
        warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
        with profile(activities=activities) as prof:
            for _ in range(repeats):
                fn()
            _sync(device)
    used: set[str] = set()
    kernels = [KernelTiming(name, seconds, calls, _match_cost(name, annotations, used))
               for name, seconds, calls in _kernel_events(prof, on_device, repeats)]
    if not kernels:
        raise W12Error(f"profile_step: no kernels recorded on {device}")
    kernels.sort(key=lambda k: -k.seconds)
    unmatched = sorted(set(annotations) - used)
    return StepProfile(step_seconds, kernels, device, unmatched)
