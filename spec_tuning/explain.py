"""``w12 tune explain``: the cost-model decomposition of one decode step.

``explain_loaded`` profiles the engine's step of a loaded model at each tree size N (the
decode step for N = 1, the verify step for N > 1, both graphed on a GPU; profiled kernels;
bytes and flops counted from the model; copy bandwidth and BF16 matmul throughput measured on
the device) and, where tau(N) is known, splits the remaining speed-up S*/S into acceptance x
kernels x overhead, as a text table, a JSON-ready dict and optional PNG charts. Measured times
that contradict each other (c(N) < 1, kernels longer than the step or faster than their floor)
are printed as warnings. Plain decoding has tau(1) = 1; tau(N) of a drafter comes in through
``taus`` (``w12 bench spec`` measures it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from w12.errors import W12Error

Log = Callable[[str], None]


def quiet(_message: str) -> None:
    """The default ``log``: progress messages go nowhere."""


@dataclass
class ExplainResult:
    text: str
    data: dict
    decompositions: dict = field(default_factory=dict)  # tree size -> Decomposition


def _fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _floor_lines(m, peaks) -> list[str]:
    from spec_tuning.cost_model import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, kernel_floor

    c = m.costs
    t_floor = sum(kernel_floor(k, peaks) for k in m.grouped.kernels)
    return [
        f"floor of the step (N={m.n_tokens}, batch {m.batch}, {m.context} tokens cached): bytes "
        f"{_fmt_bytes(c.weight_bytes)} weights + {_fmt_bytes(c.kv_bytes)} KV cache + "
        f"{_fmt_bytes(c.matmul_activation_bytes + c.other_bytes)} activations; "
        f"{(c.linear_flops + c.attention_flops) / 1e9:.2f} GFLOP",
        f"  at {BANDWIDTH_EFFICIENCY:g} x {peaks.bandwidth / 1e12:.3f} TB/s and "
        f"{COMPUTE_EFFICIENCY:g} x {peaks.bf16_flops / 1e12:.2f} TFLOP/s measured: "
        f"T_floor = {1e3 * t_floor:.4f} ms",
    ]


def _kernel_lines(m, limit: int = 10) -> list[str]:
    from spec_tuning.engine_adapter import is_matmul

    lines = [f"profiled kernels of the step (top {min(limit, len(m.profile.kernels))} of "
             f"{len(m.profile.kernels)}):"]
    for k in m.profile.kernels[:limit]:
        group = "matmul" if is_matmul(k.name) else "other"
        lines.append(f"  {k.name[:60]:<62}{group:<8}{k.calls:>5} calls {1e6 * k.seconds:>10.1f} us")
    return lines


def _tau_for(n: int, taus: dict, rank_accept: Sequence[float]):
    from spec_tuning.cost_model import best_tree_tau

    tau = 1.0 if n == 1 else taus.get(n)
    if tau is None:
        return None, None
    best = best_tree_tau(list(rank_accept), n - 1) if rank_accept else tau
    return tau, best


def _png_for(png: Path | None, n: int, many: bool) -> Path | None:
    if png is None:
        return None
    return png.with_name(f"{png.stem}-N{n}{png.suffix}") if many else png


def explain_loaded(loaded, *, batch: int = 1, tree_sizes: Sequence[int] = (1,),
                   taus: dict | None = None, rank_accept: Sequence[float] = (),
                   context: int = 512, compile: bool = False, seed: int = 0,
                   png: Path | None = None, peaks=None, log: Log = quiet) -> ExplainResult:
    """Profile the decode step of ``loaded`` at each tree size and decompose S*/S."""
    from spec_tuning.cost_model import (
        decompose,
        format_table,
        kernel_floor,
        measure_peaks,
        measurement_warnings,
        save_chart,
    )
    from spec_tuning.engine_adapter import profile_decode_step

    taus, sizes = dict(taus or {}), sorted(set(tree_sizes) | {1})
    unknown = sorted(set(taus) - set(sizes))
    if unknown:
        raise W12Error(f"--tau given for tree sizes {unknown} that are not in --tree-sizes")
    device = loaded.model.device
    if peaks is None:
        log(f"measuring copy bandwidth and BF16 matmul throughput on {device} ...")
        peaks = measure_peaks(device)
    steps = {}
    for n in sizes:
        log(f"profiling a decode step of {n} token(s) per row, batch {batch} ...")
        steps[n] = profile_decode_step(loaded.model, batch=batch, n_tokens=n, context=context,
                                       compile=compile, seed=seed)
    t_ar = steps[1].profile.step_seconds
    lines = [
        f"model {loaded.name} ({loaded.mode}), batch {batch}, {context} tokens cached, device "
        f"{peaks.device}, CUDA graph {'on' if steps[1].cuda_graph else 'off'}, compiled ops "
        f"{'on' if compile else 'off'}",
        f"measured peaks: copy bandwidth {peaks.bandwidth / 1e12:.3f} TB/s (read + write), "
        f"BF16 matmul {peaks.bf16_flops / 1e12:.2f} TFLOP/s",
        "tau(1) = 1 (plain decoding); larger trees need a drafter's measured tau (--tau "
        "N=VALUE, from w12 bench spec)",
    ]
    result = ExplainResult("", {"model": loaded.name, "mode": loaded.mode, "batch": batch,
                                "context": context, "peaks": peaks.to_dict(), "t_ar": t_ar,
                                "sizes": {}})
    for n, m in steps.items():
        lines += ["", *_floor_lines(m, peaks)]
        entry = {"t_step": m.profile.step_seconds, "c": m.profile.step_seconds / t_ar,
                 "costs": m.costs.to_dict(), "cuda_graph": m.cuda_graph}
        tau, tau_best = _tau_for(n, taus, rank_accept)
        warnings = measurement_warnings(t_ar=t_ar, t_step=m.profile.step_seconds, tree_size=n,
                                        t_prof=m.grouped.kernel_seconds,
                                        t_floor=sum(kernel_floor(k, peaks)
                                                    for k in m.grouped.kernels))
        entry["warnings"] = warnings
        if tau is None:
            lines.append(f"N={n}: T_step {1e3 * m.profile.step_seconds:.3f} ms, c(N) = "
                         f"T_step/T_AR = {entry['c']:.3f}; tau({n}) not measured, S(N) > 1 needs "
                         f"tau({n}) > {entry['c']:.3f}")
        else:
            d = decompose(m.grouped, tau=tau, tau_best=tau_best, t_ar=t_ar, peaks=peaks,
                          tree_size=n)
            lines.append(format_table(d))
            path = _png_for(png, n, len(sizes) > 1)
            if path is not None:
                save_chart(d, path)
                lines.append(f"chart: {path}")
            entry["decomposition"] = d.to_dict()
            result.decompositions[n] = d
        lines += [f"warning: {w}" for w in warnings] or [
            f"checks (N={n}): T_floor <= T_prof <= T_step" + (", c(N) >= 1" if n > 1 else "")
            + " hold"]
        lines += _kernel_lines(m)
        result.data["sizes"][n] = entry
    result.text = "\n".join(lines)
    return result


def explain_model(spec: str, *, mode: str | None = None, device: str = "cpu", seed: int = 0,
                  **options) -> ExplainResult:
    """Load ``spec`` (folder or ``synthetic:<preset>``) and run :func:`explain_loaded`."""
    from engine.weights import load_model

    return explain_loaded(load_model(spec, mode=mode, device=device, seed=seed), seed=seed,
                          **options)
