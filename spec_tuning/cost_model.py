"""Cost model of speculative decoding and the decomposition of its remaining headroom.

For a draft tree of N nodes, the speed-up over plain autoregressive decoding is
S(N) = tau(N) / c(N) with c(N) = T_step(N) / T_AR: tokens accepted per step over the step's
cost in AR steps. The ceiling S* = tau_best * T_AR / T_floor is what the step would give with
the best tree of that size (tau_best) and every kernel at its byte/flop floor (T_floor).
S* / S factorises exactly into three named factors:

    (tau_best / tau)      acceptance: the tree or drafter leaves accepted tokens behind
    (T_prof / T_floor)    kernels: the profiled kernels' distance from their floor
    (T_step / T_prof)     overhead: step time outside the profiled kernels

and the largest factor names the next direction. A kernel's floor is
max(bytes / (0.9 x peak bandwidth), flops / (0.6 x peak dense BF16 throughput)), with the
peaks measured on the device by ``measure_peaks``; an unannotated kernel is its own floor (no
headroom is claimed for what was not described).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spec_tuning.profiler import KernelTiming, StepProfile
from w12.errors import W12Error

BANDWIDTH_EFFICIENCY = 0.9  # share of measured copy bandwidth a kernel can reach
COMPUTE_EFFICIENCY = 0.6  # share of measured BF16 matmul throughput a kernel can reach

DIRECTIONS = {
    "acceptance": "raise acceptance: a better tree shape or drafter (tau_best / tau)",
    "kernels": "bring kernels to their byte/flop floor (T_prof / T_floor)",
    "overhead": "cut step time outside the kernels: launches, host work, syncs "
                "(T_step / T_prof)",
}


@dataclass(frozen=True)
class Peaks:
    device: str
    bandwidth: float  # bytes/s, device memory copy (read + write)
    bf16_flops: float  # flop/s, dense BF16 matmul

    def to_dict(self) -> dict:
        return asdict(self)


def _best_seconds(fn, device, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls (the peak, not the typical, is wanted)."""
    import torch

    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def measure_peaks(device="cuda", *, copy_bytes: int | None = None, matmul_size: int | None = None,
                  repeats: int = 10) -> Peaks:
    """Measure copy bandwidth and BF16 matmul throughput on ``device`` with torch.

    Defaults: 1 GiB copies and 8192^3 matmuls on a GPU; 32 MiB and 256^3 on the CPU, where
    the numbers are only indicative.
    """
    import torch

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    copy_bytes = copy_bytes or (1 << 30 if on_gpu else 32 << 20)
    n = matmul_size or (8192 if on_gpu else 256)
    src = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    for _ in range(2):  # warm-up: allocation, library init, clocks
        dst.copy_(src)
        torch.mm(a, b)
    copy_s = _best_seconds(lambda: dst.copy_(src), device, repeats)
    mm_s = _best_seconds(lambda: torch.mm(a, b), device, repeats)
    name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    return Peaks(name, 2 * src.numel() * src.element_size() / copy_s, 2 * n**3 / mm_s)


def kernel_floor(kernel: KernelTiming, peaks: Peaks) -> float:
    """Seconds the kernel needs at least; its measured time when it has no annotation."""
    if kernel.cost is None:
        return kernel.seconds
    by_bytes = kernel.total_bytes / (BANDWIDTH_EFFICIENCY * peaks.bandwidth)
    by_flops = kernel.total_flops / (COMPUTE_EFFICIENCY * peaks.bf16_flops)
    return max(by_bytes, by_flops)


def speedup(tau: float, t_step: float, t_ar: float) -> float:
    """S = tau / c with c = T_step / T_AR."""
    return tau / (t_step / t_ar)


def speedup_curve(taus: Mapping[int, float], step_seconds: Mapping[int, float],
                  t_ar: float) -> dict[int, float]:
    """S(N) for every tree size measured in both maps."""
    sizes = sorted(set(taus) & set(step_seconds))
    if not sizes:
        raise W12Error("speedup_curve: no tree size has both tau and a step time")
    return {n: speedup(taus[n], step_seconds[n], t_ar) for n in sizes}


def best_tree_tau(rank_accept: Sequence[float], n_nodes: int) -> float:
    """Expected tokens per step of the best tree of ``n_nodes`` draft nodes.

    ``rank_accept[k]`` is the probability that the drafter's k-th ranked child is the target's
    token. A node's value is the probability its whole path is accepted (the product along the
    path); each accepted node adds one token, plus the bonus token. A child is never worth
    more than its parent, and with ranks sorted by probability no sibling is worth more than
    the one before it, so growing the tree best-first yields the best tree of every size.
    """
    if n_nodes < 0 or any(not 0.0 <= p <= 1.0 for p in rank_accept):
        raise W12Error(f"best_tree_tau: bad inputs n_nodes={n_nodes}, rank_accept={rank_accept}")
    rank_accept = sorted(rank_accept, reverse=True)
    tau, frontier = 1.0, [(-rank_accept[0], 1.0, 0)] if rank_accept else []
    for _ in range(n_nodes):
        if not frontier:
            break
        neg_value, parent_value, rank = heapq.heappop(frontier)
        tau -= neg_value
        value = -neg_value
        if rank + 1 < len(rank_accept):  # next sibling
            heapq.heappush(frontier, (-parent_value * rank_accept[rank + 1], parent_value,
                                      rank + 1))
        heapq.heappush(frontier, (-value * rank_accept[0], value, 0))  # first child
    return tau


@dataclass
class Decomposition:
    tau: float
    tau_best: float
    t_ar: float
    t_step: float
    t_prof: float
    t_floor: float
    speedup: float
    ceiling: float
    factors: dict[str, float]
    next_direction: str
    kernels: list[dict] = field(default_factory=list)
    tree_size: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def decompose(profile: StepProfile, *, tau: float, tau_best: float, t_ar: float,
              peaks: Peaks, tree_size: int | None = None) -> Decomposition:
    """S, its ceiling and the three factors for one measured speculative step."""
    if not (tau > 0 and tau_best > 0 and t_ar > 0 and profile.step_seconds > 0):
        raise W12Error(f"decompose: tau={tau}, tau_best={tau_best}, t_ar={t_ar}, "
                       f"t_step={profile.step_seconds} must all be positive")
    floors = [kernel_floor(k, peaks) for k in profile.kernels]
    t_prof, t_floor, t_step = profile.kernel_seconds, sum(floors), profile.step_seconds
    factors = {"acceptance": tau_best / tau, "kernels": t_prof / t_floor,
               "overhead": t_step / t_prof}
    rows = [{"name": k.name, "calls": k.calls, "seconds": k.seconds, "floor": f,
             "bytes": k.total_bytes, "flops": k.total_flops}
            for k, f in zip(profile.kernels, floors, strict=True)]
    return Decomposition(
        tau=tau, tau_best=tau_best, t_ar=t_ar, t_step=t_step, t_prof=t_prof, t_floor=t_floor,
        speedup=speedup(tau, t_step, t_ar), ceiling=tau_best * t_ar / t_floor,
        factors=factors, next_direction=max(factors, key=factors.get), kernels=rows,
        tree_size=tree_size,
    )


def measurement_warnings(*, t_ar: float, t_step: float, tree_size: int,
                         t_prof: float | None = None, t_floor: float | None = None) -> list[str]:
    """What the measured times contradict: each is a measurement to distrust, not a speed-up.

    T_floor <= T_prof <= T_step must hold (kernels cannot beat their floor, and cannot take
    longer than the step that runs them), and a step of N > 1 tokens cannot cost less than a
    step of one (c(N) >= 1), since it does the one-token step's work and more."""
    out = []
    if tree_size > 1 and t_step < t_ar:
        out.append(f"c({tree_size}) = {t_step / t_ar:.3f} < 1: the {tree_size}-token step timed "
                   f"faster than the 1-token step; T_AR or T_step is not measured like the other")
    if t_prof is not None and t_prof > t_step:
        out.append(f"T_prof {1e3 * t_prof:.3f} ms > T_step {1e3 * t_step:.3f} ms: the profiled "
                   f"kernels took longer than the step (overhead factor < 1)")
    if t_floor is not None and t_prof is not None and t_floor > t_prof:
        out.append(f"T_floor {1e3 * t_floor:.3f} ms > T_prof {1e3 * t_prof:.3f} ms: kernels ran "
                   f"faster than their floor (a peak or a byte count is wrong)")
    return out


def _fmt_count(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


def format_table(d: Decomposition, max_kernels: int = 15) -> str:
    size = "" if d.tree_size is None else f"tree size N={d.tree_size}: "
    lines = [
        f"{size}tau {d.tau:.3f}, T_step {1e3 * d.t_step:.3f} ms, T_AR {1e3 * d.t_ar:.3f} ms "
        f"-> S = {d.speedup:.3f}x, ceiling S* = {d.ceiling:.3f}x",
        f"{'factor':<12}{'ratio':<18}{'value':>9}",
        f"{'acceptance':<12}{'tau_best/tau':<18}{d.factors['acceptance']:>8.3f}x",
        f"{'kernels':<12}{'T_prof/T_floor':<18}{d.factors['kernels']:>8.3f}x",
        f"{'overhead':<12}{'T_step/T_prof':<18}{d.factors['overhead']:>8.3f}x",
        f"{'product':<12}{'S*/S':<18}{d.ceiling / d.speedup:>8.3f}x",
        f"next direction: {d.next_direction}: {DIRECTIONS[d.next_direction]}",
        "",
        f"{'kernel':<44}{'calls':>6}{'time us':>11}{'floor us':>11}{'x floor':>9}"
        f"{'bytes':>10}{'flops':>10}",
    ]
    for k in d.kernels[:max_kernels]:
        mark = " <floor?" if k["seconds"] < k["floor"] else ""
        lines.append(
            f"{k['name'][:43]:<44}{k['calls']:>6}{1e6 * k['seconds']:>11.1f}"
            f"{1e6 * k['floor']:>11.1f}{k['seconds'] / k['floor']:>9.2f}"
            f"{_fmt_count(k['bytes']):>10}{_fmt_count(k['flops']):>10}{mark}"
        )
    if len(d.kernels) > max_kernels:
        lines.append(f"... {len(d.kernels) - max_kernels} more kernels")
    return "\n".join(lines)


def _waterfall(ax, d: Decomposition) -> None:
    """S, then each factor as a step up (or down), then the ceiling, on a log axis."""
    base = 0.9 * min(1.0, d.speedup, d.ceiling)
    steps = [("S", base, d.speedup, "tab:gray", f"{d.speedup:.2f}x")]
    level = d.speedup
    for name in ("acceptance", "kernels", "overhead"):
        new = level * d.factors[name]
        steps.append((f"x {name}", level, new, "tab:blue", f"x{d.factors[name]:.2f}"))
        level = new
    steps.append(("S* ceiling", base, d.ceiling, "tab:green", f"{d.ceiling:.2f}x"))
    for name, lo, hi, color, label in steps:
        ax.bar(name, hi - lo, bottom=lo, color=color)
        ax.annotate(label, (name, max(lo, hi)), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(base, 1.2 * max(d.speedup, d.ceiling, level))
    ax.set_ylabel("speed-up over AR")
    ax.set_title(f"S = {d.speedup:.2f}x, ceiling {d.ceiling:.2f}x; next: {d.next_direction}")


def save_chart(d: Decomposition, path: str | Path, max_kernels: int = 12) -> Path:
    """PNG: the S -> S* waterfall on a log axis, and the slowest kernels against their floor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise W12Error(f"save_chart: matplotlib is needed for {path} ({exc})") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    _waterfall(ax1, d)
    top = d.kernels[:max_kernels][::-1]
    ys = range(len(top))
    ax2.barh([y + 0.2 for y in ys], [1e6 * k["seconds"] for k in top], 0.4, label="measured")
    ax2.barh([y - 0.2 for y in ys], [1e6 * k["floor"] for k in top], 0.4, label="floor")
    ax2.set_yticks(list(ys), [k["name"][:32] for k in top], fontsize=7)
    ax2.set_xlabel("us per step")
    ax2.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def explain(profile: StepProfile, *, tau: float, tau_best: float, t_ar: float, peaks: Peaks,
            tree_size: int | None = None, png_path: str | Path | None = None) -> str:
    """The decomposition as a text table; also a PNG chart when ``png_path`` is given."""
    d = decompose(profile, tau=tau, tau_best=tau_best, t_ar=t_ar, peaks=peaks,
                  tree_size=tree_size)
    if png_path is not None:
        save_chart(d, png_path)
    return format_table(d)
