"""``w12 tune``: the tuning judges on the reference engine, as three commands.

* ``explain MODEL``: the cost-model decomposition of one decode step (profiled kernels, bytes
  and flops counted from the model, peaks measured on the device), as a table and a PNG.
* ``forcing MODEL_BF16 CANDIDATE``: the token-forcing verdict of a candidate against the stock
  BF16 system along greedy BF16 reference tokens.
* ``prove MODEL_BF16 CANDIDATE``: all three judges in one run on a sealed split of the prompt
  set: forcing verdict and paired-run decision on the tuning part, the candidate's cost-model
  decomposition, and, only for a candidate that passes both, the final numbers on the held-out
  part (opened once, logged).

Each command parses, calls one typed function below (``explain_model``, ``forcing_run``,
``prove``) and prints. tau(N), the accepted tokens per step of a tree of N tokens, cannot be
measured yet (the project has no drafter): plain decoding has tau(1) = 1, and measured values
for larger trees come in through ``--tau N=VALUE``. Run as ``w12 tune ...`` or
``python -m spec_tuning.cli ...``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import click

from engine.cli import default_device, positive_int_list
from w12.errors import W12Error

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# explain


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
                   png: Path | None = None, peaks=None, log: Log = _quiet) -> ExplainResult:
    """Profile the decode step of ``loaded`` at each tree size and decompose S*/S."""
    from spec_tuning.cost_model import decompose, format_table, measure_peaks, save_chart
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
        "tau(N): no drafter in the project yet, so tau(1) = 1 (plain decoding) and larger trees "
        "need measured values (--tau N=VALUE)",
    ]
    result = ExplainResult("", {"model": loaded.name, "mode": loaded.mode, "batch": batch,
                                "context": context, "peaks": peaks.to_dict(), "t_ar": t_ar,
                                "sizes": {}})
    for n, m in steps.items():
        lines += ["", *_floor_lines(m, peaks)]
        entry = {"t_step": m.profile.step_seconds, "c": m.profile.step_seconds / t_ar,
                 "costs": m.costs.to_dict(), "cuda_graph": m.cuda_graph}
        tau, tau_best = _tau_for(n, taus, rank_accept)
        if tau is None:
            lines.append(f"N={n}: T_step {1e3 * m.profile.step_seconds:.3f} ms, c(N) = "
                         f"T_step/T_AR = {entry['c']:.3f}; tau({n}) not measured, S(N) > 1 needs "
                         f"tau({n}) > {entry['c']:.3f}")
        else:
            d = decompose(m.grouped, tau=tau, tau_best=tau_best, t_ar=t_ar, peaks=peaks,
                          tree_size=n)
            product = d.factors["acceptance"] * d.factors["kernels"] * d.factors["overhead"]
            lines += [format_table(d),
                      f"check: acceptance x kernels x overhead = {product:.4f} = S*/S = "
                      f"{d.ceiling / d.speedup:.4f}"]
            path = _png_for(png, n, len(sizes) > 1)
            if path is not None:
                save_chart(d, path)
                lines.append(f"chart: {path}")
            entry["decomposition"] = d.to_dict()
            result.decompositions[n] = d
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


# ---------------------------------------------------------------------------------------------
# token forcing


@dataclass
class ForcingResult:
    verdict: object  # spec_tuning.forcing.ForcingVerdict
    prompts: int
    reference_tokens: int
    seconds: dict

    def to_dict(self) -> dict:
        return {"verdict": self.verdict.to_dict(), "prompts": self.prompts,
                "reference_tokens": self.reference_tokens, "seconds": self.seconds}


@dataclass
class StockBaseline:
    """The greedy BF16 reference and the stock system's forced trace along it."""

    reference: object  # spec_tuning.forcing.Reference
    trace: object  # spec_tuning.forcing.ForcedTrace
    seconds: dict


def stock_baseline(stock, requests: Sequence, *, tokens: int,
                   stop_ids: frozenset[int] = frozenset(), method: str = "forward",
                   batch: int = 8, log: Log = _quiet) -> StockBaseline:
    from spec_tuning.engine_adapter import greedy_reference

    start = time.perf_counter()
    log(f"reference: greedy decoding of {len(requests)} prompts x up to {tokens} tokens ...")
    reference = greedy_reference(stock.model, [r["ids"] for r in requests], tokens, batch=batch,
                                 stop_ids=stop_ids)
    seconds = {"reference": time.perf_counter() - start}
    start = time.perf_counter()
    log(f"forcing the stock: {stock.describe()} ({method}) ...")
    trace = stock.scorer(method=method, batch=batch).trace(reference)
    seconds["stock"] = time.perf_counter() - start
    return StockBaseline(reference, trace, seconds)


def forcing_verdict(stock, candidate, requests: Sequence, *, tokens: int,
                    stop_ids: frozenset[int] = frozenset(), method: str = "forward",
                    batch: int = 8, baseline: StockBaseline | None = None,
                    log: Log = _quiet) -> ForcingResult:
    """Greedy BF16 reference of ``stock`` on ``requests``, both systems forced along it.

    ``baseline`` reuses a reference and stock trace made by :func:`stock_baseline` with the
    same arguments (they are deterministic), when several candidates face one stock.
    """
    from spec_tuning.forcing import judge

    if stock.model.args.vocab_size != candidate.model.args.vocab_size:
        raise W12Error(f"{candidate.loaded.name}: vocabulary {candidate.model.args.vocab_size} "
                       f"differs from the stock's {stock.model.args.vocab_size}")
    if baseline is None:
        baseline = stock_baseline(stock, requests, tokens=tokens, stop_ids=stop_ids,
                                  method=method, batch=batch, log=log)
    start = time.perf_counter()
    log(f"forcing the candidate: {candidate.describe()} ({method}) ...")
    trace = candidate.scorer(method=method, batch=batch).trace(baseline.reference)
    seconds = {**baseline.seconds, "candidate": time.perf_counter() - start}
    verdict = judge(baseline.reference, baseline.trace, trace)
    return ForcingResult(verdict, len(baseline.reference.tokens),
                         int(sum(map(len, baseline.reference.tokens))), seconds)


def _load_pair(model_bf16: str, candidate: str, *, candidate_mode, planted_defect, device,
               seed, batch=1, candidate_batch=None, compile=False):
    from spec_tuning.engine_adapter import SystemSpec, load_system

    stock = load_system(SystemSpec(model_bf16, mode="bf16", batch=batch, compile=compile),
                        device=device, seed=seed)
    cand_spec = SystemSpec(candidate, mode=candidate_mode, planted_defect=planted_defect,
                           batch=candidate_batch or batch, compile=compile)
    return stock, load_system(cand_spec, device=device, seed=seed)


def forcing_run(model_bf16: str, candidate: str, *, candidate_mode: str | None = None,
                planted_defect: int | None = None, prompts: int = 32, tokens: int = 128,
                source: str = "auto", method: str = "forward", batch: int = 8,
                device: str = "cpu", seed: int = 0, log: Log = _quiet) -> ForcingResult:
    """The forcing verdict of ``candidate`` against ``model_bf16`` on the first prompts."""
    from spec_tuning.engine_adapter import prompt_requests

    stock, cand = _load_pair(model_bf16, candidate, candidate_mode=candidate_mode,
                             planted_defect=planted_defect, device=device, seed=seed)
    requests, stop_ids, _ = prompt_requests(stock.loaded, source=source,
                                            count=max(prompts, 1), seed=seed)
    if len(requests) < prompts:
        raise W12Error(f"the {source} prompt set has {len(requests)} prompts, {prompts} asked")
    return forcing_verdict(stock, cand, requests[:prompts], tokens=tokens, stop_ids=stop_ids,
                           method=method, batch=batch, log=log)


# ---------------------------------------------------------------------------------------------
# prove: all three judges


@dataclass
class ProveResult:
    text: str
    data: dict
    accepted: bool
    promoted: bool


def _judge_both(stock, cand, requests, run_requests, *, tokens, run_tokens, stop_ids, method,
                log_path: Path, log: Log):
    from spec_tuning.controller import Controller

    forcing = forcing_verdict(stock, cand, requests, tokens=tokens, stop_ids=stop_ids,
                              method=method, log=log)
    log(f"paired runs: {len(run_requests)} prompts x {run_tokens} tokens, rounds of A B A A ...")
    decision = Controller(log_path).compare(
        stock.runner(max_new=run_tokens), cand.runner(max_new=run_tokens), run_requests,
        candidate_config={"stock": stock.spec.to_dict(), "candidate": cand.spec.to_dict()})
    return forcing, decision


def _judged_lines(title: str, forcing: ForcingResult, decision) -> list[str]:
    return [f"== {title}: token forcing ({forcing.prompts} prompts, {forcing.reference_tokens} "
            f"reference tokens)", forcing.verdict.report(),
            f"== {title}: paired-run controller",
            f"{'PROMOTE' if decision.promote else 'KEEP STOCK'}: {decision.reason}",
            f"candidate/stock throughput {1 + decision.gain.gain:.4f}, A/A noise "
            f"{100 * decision.noise:.2f}%"]


def prove(model_bf16: str, candidate: str, *, out_dir: Path, candidate_mode: str | None = None,
          planted_defect: int | None = None, prompts: int = 64, tokens: int = 128,
          run_prompts: int = 4, run_tokens: int = 32, batch: int = 1,
          candidate_batch: int | None = None, source: str = "auto", method: str = "forward",
          context: int = 512, device: str = "cpu", compile: bool = False, seed: int = 0,
          force_final: bool = False, log: Log = _quiet) -> ProveResult:
    """Forcing verdict, paired-run decision and cost model of a candidate, on a sealed split."""
    from spec_tuning.engine_adapter import prompt_requests
    from spec_tuning.sealed import SealedSplit

    out_dir = Path(out_dir)
    stock, cand = _load_pair(model_bf16, candidate, candidate_mode=candidate_mode,
                             planted_defect=planted_defect, device=device, seed=seed,
                             batch=batch, candidate_batch=candidate_batch, compile=compile)
    needed = max(prompts, run_prompts)
    requests, stop_ids, used = prompt_requests(stock.loaded, source=source,
                                               count=max(256, 2 * needed), seed=seed)
    split = SealedSplit(requests, seed=seed, log_path=out_dir / "sealed.jsonl")
    if split.accesses() and not force_final:  # fail before the long runs, not after them
        raise W12Error(f"{split.log_path}: the final set of split {split.fingerprint} was "
                       f"already opened; pass --force-final, or use another --seed or --out")
    tuning = split.tuning
    if len(tuning) < needed:
        raise W12Error(f"the {used} prompt set leaves {len(tuning)} tuning prompts, {needed} "
                       f"asked (--prompts/--run-prompts)")
    judged = dict(tokens=tokens, run_tokens=run_tokens, stop_ids=stop_ids, method=method,
                  log_path=out_dir / "controller.jsonl", log=log)
    forcing, decision = _judge_both(stock, cand, tuning[:prompts], tuning[:run_prompts], **judged)
    log("cost model: profiling the candidate's decode step ...")
    explained = explain_loaded(cand.loaded, batch=cand.spec.batch, context=context,
                               compile=cand.spec.compile, seed=seed, log=log)
    lines = [f"stock {stock.describe()}; candidate {cand.describe()}",
             f"prompts: {used}, {len(requests)} in all; sealed split {split.fingerprint}: "
             f"{len(tuning)} tuning, {split.final_size} final (log {split.log_path})",
             *_judged_lines("tuning set", forcing, decision),
             "== cost model of the candidate", explained.text]
    data = {"stock": stock.spec.to_dict(), "candidate": cand.spec.to_dict(), "source": used,
            "split": split.fingerprint, "tuning": {"forcing": forcing.to_dict(),
                                                   "decision": decision.to_dict()},
            "cost_model": explained.data}
    passed = forcing.verdict.accepted and decision.promote
    if passed:
        final = split.open_final(reason=f"prove {cand.describe()}", force=force_final)
        f_forcing, f_decision = _judge_both(stock, cand, final[:prompts], final[:run_prompts],
                                            **judged)
        lines += _judged_lines("final (held-out) set", f_forcing, f_decision)
        data["final"] = {"forcing": f_forcing.to_dict(), "decision": f_decision.to_dict()}
    else:
        lines.append("== final set left sealed: the candidate did not pass both judges on the "
                     "tuning set")
    lines.append(f"result: forcing {'ACCEPT' if forcing.verdict.accepted else 'REJECT'}, "
                 f"controller {'PROMOTE' if decision.promote else 'KEEP STOCK'}, next direction "
                 f"{explained.decompositions[1].next_direction}")
    return ProveResult("\n".join(lines), data, forcing.verdict.accepted, decision.promote)


# ---------------------------------------------------------------------------------------------
# click commands


class _Group(click.Group):
    """User-caused errors from any command: one ``error:`` line and exit code 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except W12Error as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            ctx.exit(2)


def _taus(ctx, param, values: tuple[str, ...]) -> dict[int, float]:
    taus = {}
    for value in values:
        n, _, tau = value.partition("=")
        try:
            taus[int(n)] = float(tau)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not N=VALUE, like 4=2.3") from None
        if int(n) < 1 or not float(tau) > 0:
            raise click.BadParameter(f"{value!r}: N must be >= 1 and tau > 0")
    return taus


def _floats(ctx, param, value: str | None) -> tuple[float, ...]:
    if not value:
        return ()
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of probabilities") from None


def _progress(message: str) -> None:
    click.echo(message, err=True)


def _write_json(path: Path | None, data: dict) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2, default=str))


_device = click.option("--device", default=None,
                       help="cpu, cuda, cuda:1... (default: cuda if present).")
_compile = click.option("--compile/--no-compile", "compile_", default=None,
                        help="torch.compile the engine's elementwise ops (default: on for CUDA).")
_json = click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
                     help="Also write the results here.")
_seed = click.option("--seed", default=0, show_default=True,
                     help="Seed of synthetic weights, random prompts and the sealed split.")
_candidate_mode = click.option("--candidate-mode", type=click.Choice(["bf16", "w12"]),
                               default=None,
                               help="Candidate weights (default: W12 for a W12 folder, else "
                                    "BF16).")
_defect = click.option("--planted-defect", "planted_defect", type=click.IntRange(0),
                       default=None, metavar="P",
                       help="Add +2 to every 7th vocabulary id of the candidate's logits from "
                            "generated position P on (the judge must reject it).")
_source = click.option("--source", type=click.Choice(["auto", "humaneval", "builtin", "random"]),
                       default="auto", show_default=True,
                       help="Prompts: HumanEval if installed, else built-in instructions; "
                            "random token prompts for models without a tokenizer.")
_scoring = click.option("--scoring", type=click.Choice(["forward", "steps"]), default="forward",
                        show_default=True,
                        help="Teacher forcing in one causal forward, or token by token "
                             "through the engine's decode step.")


def _compile_default(compile_, device: str) -> bool:
    return device.startswith("cuda") if compile_ is None else compile_


@click.group("tune", cls=_Group)
def tune_group() -> None:
    """Prove speed-ups: token forcing, paired runs, cost model."""


@tune_group.command("explain")
@click.argument("model")
@click.option("--mode", type=click.Choice(["bf16", "w12"]), default=None,
              help="Weights (default: W12 for a W12 folder, else BF16).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1))
@click.option("--tree-sizes", default="1", show_default=True, callback=positive_int_list,
              help="Tokens per row of the verify step, comma-separated (1 = plain decoding).")
@click.option("--tau", "taus", multiple=True, callback=_taus, metavar="N=VALUE",
              help="Measured accepted tokens per step for tree size N; repeatable.")
@click.option("--rank-accept", default=None, callback=_floats, metavar="P1,P2,...",
              help="Drafter's per-rank acceptance probabilities: tau_best from the best tree.")
@click.option("--context", default=512, show_default=True, type=click.IntRange(1),
              help="Tokens already in the cache at the profiled step.")
@click.option("--png", type=click.Path(path_type=Path), default=None,
              help="Write the chart here (needs matplotlib).")
@_device
@_compile
@_seed
@_json
def explain_command(model, mode, batch, tree_sizes, taus, rank_accept, context, png, device,
                    compile_, seed, json_path):
    """Decompose the speed-up headroom of MODEL's decode step: acceptance x kernels x overhead.

    MODEL is a BF16 or W12 folder, or synthetic:PRESET (qwen3-8b, qwen3-32b, llama-3.1-8b,
    smollm2-135m, tiny-qwen3).
    """
    device = default_device(device)
    result = explain_model(model, mode=mode, device=device, seed=seed, batch=batch,
                           tree_sizes=tree_sizes, taus=taus, rank_accept=rank_accept,
                           context=context, compile=_compile_default(compile_, device), png=png,
                           log=_progress)
    click.echo(result.text)
    _write_json(json_path, result.data)


@tune_group.command("forcing")
@click.argument("model_bf16")
@click.argument("candidate")
@_candidate_mode
@_defect
@click.option("--prompts", default=32, show_default=True, type=click.IntRange(2))
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(1),
              help="Reference tokens per prompt (fewer when it stops).")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(1),
              help="Rows per engine batch for the reference and the scoring.")
@_source
@_scoring
@_device
@_seed
@_json
def forcing_command(model_bf16, candidate, candidate_mode, planted_defect, prompts, tokens,
                    batch, source, scoring, device, seed, json_path):
    """Is CANDIDATE lossless against MODEL_BF16? Token-forcing verdict on the prompt set.

    Reference tokens are greedy BF16 decoding of MODEL_BF16; stock (MODEL_BF16) and CANDIDATE
    are both run teacher-forced along them.
    """
    result = forcing_run(model_bf16, candidate, candidate_mode=candidate_mode,
                         planted_defect=planted_defect, prompts=prompts, tokens=tokens,
                         source=source, method=scoring, batch=batch,
                         device=default_device(device), seed=seed, log=_progress)
    click.echo(result.verdict.report())
    _write_json(json_path, result.to_dict())


@tune_group.command("prove")
@click.argument("model_bf16")
@click.argument("candidate")
@_candidate_mode
@_defect
@click.option("--prompts", default=64, show_default=True, type=click.IntRange(2),
              help="Prompts for token forcing.")
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--run-prompts", default=4, show_default=True, type=click.IntRange(1),
              help="Requests per timed run.")
@click.option("--run-tokens", default=32, show_default=True, type=click.IntRange(1),
              help="Tokens generated per request in a timed run.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1),
              help="Serving batch of the stock system.")
@click.option("--candidate-batch", default=None, type=click.IntRange(1),
              help="Serving batch of the candidate (default: --batch).")
@click.option("--context", default=512, show_default=True, type=click.IntRange(1),
              help="Cached tokens at the step the cost model profiles.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("w12-tune"),
              show_default=True, help="Folder for the controller and sealed-split logs.")
@click.option("--force-final", is_flag=True,
              help="Open the final set even if this split's final set was opened before.")
@_source
@_scoring
@_device
@_compile
@_seed
@_json
def prove_command(model_bf16, candidate, candidate_mode, planted_defect, prompts, tokens,
                  run_prompts, run_tokens, batch, candidate_batch, context, out_dir, force_final,
                  source, scoring, device, compile_, seed, json_path):
    """Run all three judges on CANDIDATE against MODEL_BF16 on a sealed prompt split.

    Token forcing and paired runs on the tuning part decide; the candidate's decode step is
    decomposed by the cost model; a candidate that passes both judges is measured once more
    on the held-out final part, whose opening is logged in --out.
    """
    device = default_device(device)
    result = prove(model_bf16, candidate, out_dir=out_dir, candidate_mode=candidate_mode,
                   planted_defect=planted_defect, prompts=prompts, tokens=tokens,
                   run_prompts=run_prompts, run_tokens=run_tokens, batch=batch,
                   candidate_batch=candidate_batch, source=source, method=scoring,
                   context=context, device=device, compile=_compile_default(compile_, device),
                   seed=seed, force_final=force_final, log=_progress)
    click.echo(result.text)
    _write_json(json_path, result.data)


if __name__ == "__main__":
    tune_group(prog_name=f"{Path(sys.executable).name} -m spec_tuning.cli")
