"""The judges run on engine systems: token-forcing verdicts and ``prove``.

* ``forcing_run``: the token-forcing verdict of a candidate against the stock BF16 system along
  greedy BF16 reference tokens (``stock_baseline`` makes the reference and the stock's trace
  once, ``forcing_verdict`` judges a candidate along them).
* ``prove``: all three judges in one run on a sealed split of the prompt set: forcing verdict
  and paired-run decision on the tuning part, the candidate's cost-model decomposition
  (``spec_tuning.explain``), and, only for a candidate that passes both, the final numbers on
  the held-out part (opened once, logged).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spec_tuning.explain import Log, explain_loaded, quiet
from w12.errors import W12Error


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
                   batch: int = 8, log: Log = quiet) -> StockBaseline:
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
                    log: Log = quiet) -> ForcingResult:
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
                device: str = "cpu", seed: int = 0, log: Log = quiet) -> ForcingResult:
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
          force_final: bool = False, log: Log = quiet) -> ProveResult:
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
