"""The judges run on engine systems: token-forcing verdicts and ``prove``.

* ``forcing_run``: the token-forcing verdict of a candidate against the stock BF16 system.
  ``stock_baseline`` makes, once, the reference (plain decoding of the BF16 model at batch 1)
  on the judged prompts and on a disjoint calibration set, the stock forced along both through
  its own path, and delta from the calibration set; ``forcing_verdict`` forces a candidate
  through its own path along the judged reference and judges it.
* ``prove``: all three judges in one run on a sealed split of the prompt set: forcing verdict
  and paired-run decision on the tuning part, the candidate's cost-model decomposition
  (``spec_tuning.explain``), and, only for a candidate that passes both, the final numbers on
  the held-out part (opened once, logged).

A planted defect that cannot fire in the tokens scored (a logit bias from a position no
reference reaches, a cache slot no sequence reaches) is refused: a verdict on it would say
nothing.
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
    """References on the judged and the calibration prompts, the stock's trace on the judged
    ones, and delta from the calibration ones."""

    reference: object  # spec_tuning.forcing.Reference
    trace: object  # spec_tuning.forcing.ForcedTrace
    calibration: object  # spec_tuning.forcing.Calibration
    seconds: dict


def stock_baseline(stock, requests: Sequence, calibration_requests: Sequence, *, tokens: int,
                   stop_ids: frozenset[int] = frozenset(), sampling=None,
                   log: Log = quiet) -> StockBaseline:
    from spec_tuning.engine_forcing import reference_decode
    from spec_tuning.forcing import calibrate

    if {tuple(r["ids"]) for r in requests} & {tuple(r["ids"]) for r in calibration_requests}:
        raise W12Error("the calibration prompts overlap the judged prompts")
    start = time.perf_counter()
    n, c = len(requests), len(calibration_requests)
    log(f"reference: plain decoding of {n} + {c} calibration prompts x up to {tokens} tokens "
        f"...")
    ids = [r["ids"] for r in list(requests) + list(calibration_requests)]
    both = reference_decode(stock.model, ids, tokens, sampling=sampling, stop_ids=stop_ids)
    reference, cal_reference = (_subset(both, slice(0, n)), _subset(both, slice(n, n + c)))
    seconds = {"reference": time.perf_counter() - start}
    start = time.perf_counter()
    log(f"forcing the stock: {stock.describe()} ...")
    scorer = stock.scorer(sampling)
    calibration = calibrate(cal_reference, scorer.trace(cal_reference))
    trace = scorer.trace(reference)
    seconds["stock"] = time.perf_counter() - start
    return StockBaseline(reference, trace, calibration, seconds)


def baseline_key(stock, requests, calibration_requests, *, tokens, stop_ids, sampling) -> str:
    """What a stored baseline must have been made from to be reused."""
    import hashlib
    import json

    text = json.dumps({"stock": stock.spec.to_dict(), "model": stock.loaded.name,
                       "judged": [list(r["ids"]) for r in requests],
                       "calibration": [list(r["ids"]) for r in calibration_requests],
                       "tokens": tokens, "stop_ids": sorted(stop_ids),
                       "sampling": None if sampling is None else repr(sampling)},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def save_baseline(path: Path, key: str, baseline: StockBaseline) -> None:
    import json

    def rows(arrays):
        return [a.tolist() for a in arrays]

    r, t = baseline.reference, baseline.trace
    Path(path).write_text(json.dumps({
        "key": key, "prompts": rows(r.prompts), "tokens": rows(r.tokens),
        "margins": rows(r.margins), "top1": rows(t.top1), "stock_margins": rows(t.margins),
        "calibration": baseline.calibration.to_dict(), "seconds": baseline.seconds}))


def load_baseline(path: Path, key: str) -> StockBaseline | None:
    """The stored baseline at ``path`` if it was made for ``key``, else None."""
    import json

    import numpy as np

    from spec_tuning.forcing import Calibration, ForcedTrace, Reference

    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise W12Error(f"{path}: not a stored baseline ({exc.msg})") from None
    if data.get("key") != key:
        return None

    def arrays(name, dtype):
        return [np.asarray(x, dtype=dtype) for x in data[name]]

    reference = Reference(arrays("prompts", np.int64), arrays("tokens", np.int64),
                          arrays("margins", np.float64))
    trace = ForcedTrace(arrays("top1", np.int64), arrays("stock_margins", np.float64))
    return StockBaseline(reference, trace, Calibration(**data["calibration"]),
                         {k: 0.0 for k in data["seconds"]})


def _subset(reference, rows: slice):
    from spec_tuning.forcing import Reference

    return Reference(reference.prompts[rows], reference.tokens[rows], reference.margins[rows])


def check_defect_fires(system, reference=None, *, tokens: int | None = None) -> None:
    """Refuse a planted defect that cannot change anything in the positions scored."""
    from spec_tuning.engine_forcing import KVShift
    from spec_tuning.forcing import PlantedDefect

    defect = system.defect
    if reference is not None:
        lengths = [len(t) for t in reference.tokens]
        ends = [len(p) + len(t) for p, t in zip(reference.prompts, reference.tokens,
                                                strict=True)]
    else:
        lengths, ends = [tokens], None
    if isinstance(defect, PlantedDefect) and not defect.fires_within(max(lengths)):
        raise W12Error(f"planted defect {system.spec.defect} cannot fire: it starts at "
                       f"generated position {defect.start}, the references hold at most "
                       f"{max(lengths)} tokens (raise --tokens or lower the position)")
    if isinstance(defect, KVShift) and ends is not None and max(ends) - 1 <= defect.start:
        raise W12Error(f"planted defect {system.spec.defect} cannot fire: no sequence reaches "
                       f"cache slot {defect.start + 1} (longest {max(ends)})")


def forcing_verdict(stock, candidate, requests: Sequence, calibration_requests: Sequence, *,
                    tokens: int, stop_ids: frozenset[int] = frozenset(), sampling=None,
                    baseline: StockBaseline | None = None, log: Log = quiet) -> ForcingResult:
    """The candidate forced through its own path along the stock's reference, judged.

    ``baseline`` reuses a reference, stock trace and calibration made by
    :func:`stock_baseline` with the same arguments (they are deterministic), when several
    candidates face one stock.
    """
    from spec_tuning.forcing import judge

    if stock.model.args.vocab_size != candidate.model.args.vocab_size:
        raise W12Error(f"{candidate.loaded.name}: vocabulary {candidate.model.args.vocab_size} "
                       f"differs from the stock's {stock.model.args.vocab_size}")
    check_defect_fires(candidate, tokens=tokens)
    if baseline is None:
        baseline = stock_baseline(stock, requests, calibration_requests, tokens=tokens,
                                  stop_ids=stop_ids, sampling=sampling, log=log)
    check_defect_fires(candidate, baseline.reference)
    start = time.perf_counter()
    log(f"forcing the candidate: {candidate.describe()} ...")
    trace = candidate.scorer(sampling).trace(baseline.reference)
    seconds = {**baseline.seconds, "candidate": time.perf_counter() - start}
    verdict = judge(baseline.reference, baseline.trace, trace, baseline.calibration)
    return ForcingResult(verdict, len(baseline.reference.tokens),
                         int(sum(map(len, baseline.reference.tokens))), seconds)


def _load_pair(model_bf16: str, candidate: str, *, candidate_mode, defect, device, seed,
               batch=1, candidate_batch=None, compile=False, path="decode"):
    from spec_tuning.engine_adapter import SystemSpec, load_system

    stock = load_system(SystemSpec(model_bf16, mode="bf16", batch=batch, compile=compile),
                        device=device, seed=seed)
    cand_spec = SystemSpec(candidate, mode=candidate_mode, defect=defect,
                           batch=candidate_batch or batch, compile=compile, path=path)
    return stock, load_system(cand_spec, device=device, seed=seed)


def split_prompts(requests: Sequence, prompts: int, calibration: int, source: str):
    """The first ``prompts`` requests to judge and the last ``calibration`` to calibrate on."""
    if len(requests) < prompts + calibration:
        raise W12Error(f"the {source} prompt set has {len(requests)} prompts, {prompts} judged "
                       f"+ {calibration} calibration asked")
    return list(requests[:prompts]), list(requests[len(requests) - calibration:])


def forcing_run(model_bf16: str, candidate: str, *, candidate_mode: str | None = None,
                defect: str | None = None, prompts: int = 32, tokens: int = 128,
                calibration_prompts: int = 8, source: str = "auto", batch: int = 8,
                candidate_batch: int | None = None, path: str = "decode", sampling=None,
                device: str = "cpu", seed: int = 0, baseline_path: Path | None = None,
                log: Log = quiet) -> ForcingResult:
    """The forcing verdict of ``candidate`` against ``model_bf16``: the first prompts judged,
    the last ``calibration_prompts`` of the set calibrate delta. ``baseline_path``: reuse the
    reference, stock trace and delta stored there if they were made from the same stock,
    prompts and settings, else make and store them."""
    from spec_tuning.engine_adapter import prompt_requests

    stock, cand = _load_pair(model_bf16, candidate, candidate_mode=candidate_mode,
                             defect=defect, device=device, seed=seed, batch=batch,
                             candidate_batch=candidate_batch, path=path)
    check_defect_fires(cand, tokens=tokens)
    requests, stop_ids, used = prompt_requests(stock.loaded, source=source,
                                               count=prompts + calibration_prompts, seed=seed)
    judged, calibration = split_prompts(requests, prompts, calibration_prompts, used)
    baseline = None
    if baseline_path is not None:
        key = baseline_key(stock, judged, calibration, tokens=tokens, stop_ids=stop_ids,
                           sampling=sampling)
        baseline = load_baseline(baseline_path, key)
        if baseline is None:
            baseline = stock_baseline(stock, judged, calibration, tokens=tokens,
                                      stop_ids=stop_ids, sampling=sampling, log=log)
            save_baseline(baseline_path, key, baseline)
        else:
            log(f"reference and stock trace from {baseline_path}")
    return forcing_verdict(stock, cand, judged, calibration, tokens=tokens, stop_ids=stop_ids,
                           sampling=sampling, baseline=baseline, log=log)


# ---------------------------------------------------------------------------------------------
# prove: all three judges


@dataclass
class ProveResult:
    text: str
    data: dict
    accepted: bool
    promoted: bool


def _judge_both(stock, cand, requests, calibration, run_requests, *, tokens, run_tokens,
                stop_ids, log_path: Path, log: Log):
    from spec_tuning.controller import Controller

    forcing = forcing_verdict(stock, cand, requests, calibration, tokens=tokens,
                              stop_ids=stop_ids, log=log)
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
            f"candidate/stock throughput {1 + decision.gain.gain:.4f}, run-to-run noise "
            f"{100 * decision.noise:.2f}%"]


def prove(model_bf16: str, candidate: str, *, out_dir: Path, candidate_mode: str | None = None,
          defect: str | None = None, prompts: int = 64, tokens: int = 128,
          calibration_prompts: int = 8, run_prompts: int = 4, run_tokens: int = 32,
          batch: int = 1, candidate_batch: int | None = None, path: str = "decode",
          source: str = "auto", context: int = 512, device: str = "cpu", compile: bool = False,
          seed: int = 0, force_final: bool = False, log: Log = quiet) -> ProveResult:
    """Forcing verdict, paired-run decision and cost model of a candidate, on a sealed split."""
    from spec_tuning.engine_adapter import prompt_requests
    from spec_tuning.sealed import SealedSplit

    out_dir = Path(out_dir)
    stock, cand = _load_pair(model_bf16, candidate, candidate_mode=candidate_mode,
                             defect=defect, device=device, seed=seed, batch=batch,
                             candidate_batch=candidate_batch, compile=compile, path=path)
    check_defect_fires(cand, tokens=tokens)
    needed = max(prompts, run_prompts) + calibration_prompts
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
    judged = dict(tokens=tokens, run_tokens=run_tokens, stop_ids=stop_ids,
                  log_path=out_dir / "controller.jsonl", log=log)
    forced, calibration = split_prompts(tuning, prompts, calibration_prompts, used)
    forcing, decision = _judge_both(stock, cand, forced, calibration, tuning[:run_prompts],
                                    **judged)
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
        # delta stays calibrated on tuning prompts: the final set is only ever judged
        f_forcing, f_decision = _judge_both(stock, cand, final[:prompts], calibration,
                                            final[:run_prompts], **judged)
        lines += _judged_lines("final (held-out) set", f_forcing, f_decision)
        data["final"] = {"forcing": f_forcing.to_dict(), "decision": f_decision.to_dict()}
    else:
        lines.append("== final set left sealed: the candidate did not pass both judges on the "
                     "tuning set")
    lines.append(f"result: forcing {'ACCEPT' if forcing.verdict.accepted else 'REJECT'}, "
                 f"controller {'PROMOTE' if decision.promote else 'KEEP STOCK'}, next direction "
                 f"{explained.decompositions[1].next_direction}")
    return ProveResult("\n".join(lines), data, forcing.verdict.accepted, decision.promote)
