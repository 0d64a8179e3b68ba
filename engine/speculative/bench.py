"""Timing speculative decoding against plain decoding, in the same run, on one engine.

Definitions (docs/ARCHITECTURE.md): tau = tokens committed per verify step, bonus included;
T_AR = one plain decode step; T_step(N) = one speculative iteration at node budget N
(drafting, the verify forward over N nodes, acceptance and the cache compaction); both are
replays of the engine's own steps (CUDA graphs on a GPU), timed at the same context position
with the same method, and c(N) = T_step(N) / T_AR. T_verify(N) times the same step with the
drafter's tree given (its drafting left out), c_verify = T_verify / T_AR. S = tau / c is the
speed-up those predict; the measured speed-up is the tokens/s of speculative over plain
generation of the same prompts, timed in the same run.

On a model with real weights tau comes from generation. With ``forced_accept`` K (synthetic
presets, whose random weights accept nothing meaningful) each step accepts K drafted tokens
whatever the target picks, so tau = K + 1 by construction and only c(N) is a measurement;
S = tau / c is then a projection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from engine.generate import GREEDY, Engine, generate
from engine.sampling import Sampling
from engine.speculative.api import load_target, read_prompts
from engine.speculative.decode import SpecRunner, speculative_generate
from engine.speculative.drafters import Drafter, make_drafter
from engine.speculative.tree import DraftTree
from engine.speculative.two_level import TwoLevel
from engine.weights import SYNTHETIC_PREFIX, LoadedModel, load_model
from w12.errors import W12Error

TIMED_STEPS = 30


@dataclass
class SpecRow:
    mode: str  # "plain", "chain" or "tree"
    budget: int
    drafter: str
    tau: float  # tokens committed per step (plain: 1)
    t_step_ms: float  # one step (plain: T_AR)
    c: float  # T_step / T_AR
    projected: float  # tau / c
    t_verify_ms: float  # the verify part of a step alone (the drafter's tree given)
    c_verify: float  # T_verify / T_AR
    tokens_per_s: float | None  # generation of the prompt set (None with forced acceptance)
    speedup: float | None  # tokens/s over plain decoding's, same run
    forced_accept: int | None = None
    two_level: int | None = None  # the Q tree's nodes of two-level verification
    q_tau: float | None = None  # two-level: the Q path's tokens per step, bonus included
    head: str = "exact"  # "int8": the certified INT8 LM head picks
    candidates: float | None = None  # INT8 head: candidate entries per chosen token

    @property
    def label(self) -> str:
        label = self.mode if self.two_level is None else f"{self.mode}+Q{self.two_level}"
        return label if self.head == "exact" else f"{label}+int8"


def _timer(device: torch.device) -> Callable[[Callable[[], object], Callable[[], object]], float]:
    """Median ms of ``work()`` over TIMED_STEPS runs, ``reset()`` before each (untimed)."""

    def run(work, reset) -> float:
        times = []
        for _ in range(TIMED_STEPS + 3):
            reset()
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                work()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                work()
                times.append(1e3 * (time.perf_counter() - began))
        times = sorted(times[3:])
        return times[len(times) // 2]

    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _generate_timed(device, fn) -> tuple[object, float]:
    _sync(device)
    began = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - began


def bench_spec(
    loaded: LoadedModel, prompts: list[list[int]], *, drafter: str, budgets: list[int],
    modes: tuple[str, ...] = ("chain", "tree"), max_new_tokens: int = 128,
    forced_accept: int | None = None, sampling: Sampling = GREEDY,
    stop_ids: frozenset[int] = frozenset(), compile: bool = False,
    two_level: int | None = None, int8_head: bool = False, log=print, seed: int = 0,
) -> list[SpecRow]:
    """Plain decoding, then every (mode, budget), on one engine of batch 1; with
    ``two_level`` Q, every (mode, budget > Q) again with two-level verification (the Q pass on
    the 8-bit view of the model's weights; a synthetic preset's drawn with ``seed``, as the
    model's were; with ``forced_accept`` both passes accept that many, ``two_level_step``);
    with ``int8_head``, plain decoding and every (mode, budget) again on an engine whose
    certified INT8 head picks (``_int8_rows``). Every c is over the same T_AR (the exact
    head's plain step)."""
    if not prompts:
        raise W12Error("bench spec: no prompts")
    if max(budgets) < 1 or min(budgets) < 1:
        raise W12Error(f"node budgets {budgets}: each must be at least 1")
    model, device = loaded.model, loaded.model.device
    longest = max(map(len, prompts))
    engine = Engine(model, batch=1, max_seq_len=longest + max_new_tokens + max(budgets) + 1,
                    compile=compile)
    timer = _timer(device)
    context = len(prompts[0])

    def rewind() -> None:
        engine.cache.rollback([context])
        engine.next_slot = context

    first = _first_token(engine, prompts[0])
    t_ar = timer(lambda: engine.step(first), rewind)
    plain_tps = None
    if forced_accept is None:
        outs, seconds = _generate_timed(device, lambda: [
            generate(engine, [p], max_new_tokens=max_new_tokens, sampling=sampling,
                     stop_ids=stop_ids)[0] for p in prompts])
        plain_tps = sum(map(len, outs)) / seconds
    rows = [SpecRow("plain", 1, "-", 1.0, t_ar, 1.0, 1.0, t_ar, 1.0, plain_tps,
                    1.0 if plain_tps else None, forced_accept)]
    log(format_row(rows[0]))
    for mode in modes:
        for budget in budgets:
            rows.append(_bench_one(engine, loaded, prompts, drafter, mode, budget,
                                   forced_accept, max_new_tokens, sampling, stop_ids, t_ar,
                                   plain_tps, timer, context))
            log(format_row(rows[-1]))
    if int8_head:
        rows += _int8_rows(engine, loaded, prompts, drafter, budgets, modes, forced_accept,
                           max_new_tokens, sampling, stop_ids, t_ar, plain_tps, timer, context,
                           compile, log)
    if two_level is None:
        return rows
    setting = TwoLevel(_view_model(loaded, seed), two_level)
    for mode in modes:
        for budget in (b for b in budgets if b > two_level):
            rows.append(_bench_one(engine, loaded, prompts, drafter, mode, budget,
                                   forced_accept, max_new_tokens, sampling, stop_ids, t_ar,
                                   plain_tps, timer, context, setting))
            log(format_row(rows[-1]))
    return rows


def _first_token(engine: Engine, prompt: list[int]) -> torch.Tensor:
    """The greedy first token [1] after ``prompt`` (prefilled into row 0)."""
    device = engine.model.device
    return engine.choose(engine.prefill([prompt]), GREEDY, torch.zeros(1, dtype=torch.long,
                                                                       device=device),
                         torch.tensor([len(prompt)], device=device))


def _int8_rows(exact, loaded, prompts, drafter, budgets, modes, forced_accept, max_new_tokens,
               sampling, stop_ids, t_ar, plain_tps, timer, context, compile, log
               ) -> list[SpecRow]:
    """Plain decoding and every (mode, budget) with the certified INT8 head. The plain row's
    c compares step + pick with each head (the exact head's pick is an argmax, the INT8 head's
    its certification and recompute); the speculative rows' c is over ``t_ar`` as every row's,
    their picks inside the step with either head."""
    model, device = loaded.model, loaded.model.device
    engine = Engine(model, batch=1, max_seq_len=exact.max_seq_len, compile=compile,
                    head="int8")
    req = torch.zeros(1, dtype=torch.long, device=device)
    pos = torch.tensor([context], device=device)

    def rewind(e: Engine):
        return lambda: (e.cache.rollback([context]), setattr(e, "next_slot", context))

    first = _first_token(engine, prompts[0])
    t_exact = timer(lambda: exact.choose(exact.step(first), GREEDY, req, pos), rewind(exact))
    t_int8 = timer(lambda: engine.choose(engine.step(first), GREEDY, req, pos), rewind(engine))
    tps = speedup = None
    if forced_accept is None:
        outs, seconds = _generate_timed(device, lambda: [
            generate(engine, [p], max_new_tokens=max_new_tokens, sampling=sampling,
                     stop_ids=stop_ids)[0] for p in prompts])
        tps = sum(map(len, outs)) / seconds
        speedup = tps / plain_tps
    c = t_int8 / t_exact
    rows = [SpecRow("plain", 1, "-", 1.0, t_int8, c, 1 / c, t_int8, c, tps, speedup,
                    forced_accept, head="int8",
                    candidates=engine.head.stats.mean_candidates)]
    log(format_row(rows[0]))
    for mode in modes:
        for budget in budgets:
            engine.head.reset_stats()
            row = _bench_one(engine, loaded, prompts, drafter, mode, budget, forced_accept,
                             max_new_tokens, sampling, stop_ids, t_ar, plain_tps, timer,
                             context)
            row.head, row.candidates = "int8", engine.head.stats.mean_candidates
            rows.append(row)
            log(format_row(row))
    return rows


def _view_model(loaded: LoadedModel, seed: int = 0):
    """The Q pass's model: the 8-bit view of the folder's weights in W12 (encoded on load
    from a BF16 folder), or of a synthetic preset's random weights drawn with ``seed``."""
    spec = loaded.folder if loaded.folder is not None else loaded.name
    return load_model(spec, mode="view8", device=loaded.model.device, dtype=loaded.model.dtype,
                      seed=seed).model


def _bench_one(engine, loaded, prompts, drafter_name, mode, budget, forced_accept,
               max_new_tokens, sampling, stop_ids, t_ar, plain_tps, timer, context,
               setting: TwoLevel | None = None) -> SpecRow:
    device = loaded.model.device
    drafter = make_drafter(drafter_name, loaded.model)
    runner = SpecRunner(engine, drafter, budget=budget, tree=mode == "tree", sampling=sampling,
                        forced_accept=forced_accept, two_level=setting)
    tps = speedup = q_tau = None
    if forced_accept is None:
        results, seconds = _generate_timed(device, lambda: [
            speculative_generate(engine, drafter, [p], max_new_tokens=max_new_tokens,
                                 budget=budget, tree=mode == "tree", sampling=sampling,
                                 stop_ids=stop_ids, runner=runner) for p in prompts])
        committed = [c for _, stats in results for c in stats.committed]
        tau = sum(committed) / len(committed)
        if setting is not None:
            q_committed = [c for _, stats in results for c in stats.q_committed]
            q_tau = sum(q_committed) / len(q_committed)
        tps = sum(len(out[0]) for out, _ in results) / seconds
        speedup = tps / plain_tps
    # T_step at the first prompt's context, the drafter primed with that prompt
    root = _first_token(engine, prompts[0])
    drafter.start([prompts[0]], root.tolist())

    def rewind() -> None:
        engine.cache.rollback([context])

    t_step = timer(lambda: runner.step(root), rewind)
    if forced_accept is not None:
        tau = float(runner.step(root).accepted.float().mean() + 1)
    rewind()
    given = GivenTree(drafter.propose(root, engine.cache, budget, mode == "tree"))
    verifier = SpecRunner(engine, given, budget=budget, tree=mode == "tree", sampling=sampling,
                          forced_accept=forced_accept)
    t_verify = timer(lambda: verifier.step(root), rewind)
    c = t_step / t_ar
    return SpecRow(mode, budget, drafter_name, tau, t_step, c, tau / c, t_verify,
                   t_verify / t_ar, tps, speedup, forced_accept,
                   None if setting is None else setting.q_budget, q_tau)


class GivenTree(Drafter):
    """Proposes one fixed tree: verification timed without the drafter's work."""

    def __init__(self, tree: DraftTree) -> None:
        self.tree = DraftTree(*(t.clone() for t in (tree.tokens, tree.parents, tree.depth,
                                                      tree.valid)), levels=tree.levels)

    def propose(self, roots, cache, budget, tree):
        return self.tree


def load_for_bench(spec: str, prompts_path: str | None, *, limit: int | None, mode: str | None,
                   device: str, forced_accept: int | None, context: int, seed: int = 0
                   ) -> tuple[LoadedModel, list[list[int]], frozenset[int]]:
    """The model and its prompts: text prompts through its tokenizer, or (synthetic presets,
    which need ``forced_accept``) ``limit`` (default 2) random prompts of ``context`` tokens."""
    if not str(spec).startswith(SYNTHETIC_PREFIX):
        if prompts_path is None:
            raise W12Error("bench spec: --prompts is needed for a model with a tokenizer")
        target = load_target(spec, read_prompts(prompts_path, limit), mode=mode, device=device)
        return target.loaded, target.prompts, target.stop_ids
    if forced_accept is None:
        raise W12Error(f"{spec}: random weights accept nothing meaningful; time them with "
                       "--forced-accept K")
    loaded = load_model(spec, mode=mode, device=device, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, loaded.args.vocab_size, (limit or 2, context), generator=gen)
    return loaded, prompts.tolist(), frozenset()


def format_row(r: SpecRow) -> str:
    rate = "" if r.tokens_per_s is None else f"  {r.tokens_per_s:9.1f} tok/s"
    gain = "" if r.speedup is None else f"  x{r.speedup:.3f} measured"
    q = "" if r.q_tau is None else f"  Q path tau {r.q_tau:6.3f}"
    cand = "" if r.candidates is None else f"  candidates {r.candidates:.2f}"
    return (f"{r.label:<10} N={r.budget:<4} {r.drafter:<14} tau {r.tau:6.3f}  "
            f"step {r.t_step_ms:8.3f} ms  c {r.c:6.3f}  verify {r.t_verify_ms:8.3f} ms  "
            f"c_verify {r.c_verify:6.3f}  tau/c {r.projected:6.3f}{rate}{gain}{q}{cand}")


def summary(rows: list[SpecRow]) -> list[str]:
    """The last lines: the best measured (or projected) speed-up per mode (two-level rows
    apart)."""
    lines = []
    forced = rows[0].forced_accept is not None
    for mode in dict.fromkeys(r.label for r in rows if r.label != "plain"):
        mine = [r for r in rows if r.label == mode]
        if forced:
            best = max(mine, key=lambda r: r.projected)
            lines.append(f"{mode}: projected S = tau/c = {best.projected:.3f} at N={best.budget} "
                         f"(tau forced to {best.tau:.2f}; a projection, not a measurement)")
        else:
            best = max(mine, key=lambda r: r.speedup)
            lines.append(f"{mode}: {best.speedup:.3f}x plain decoding at N={best.budget} "
                         f"(tau {best.tau:.2f}, c {best.c:.3f}; measured in this run)")
    for r in rows:
        if r.c < 1.0 and r.mode != "plain":
            lines.append(f"warning: c({r.budget}) = {r.c:.3f} < 1 for {r.label}: a step over "
                         f"{r.budget} nodes timed faster than a plain step")
    return lines


def as_dicts(rows: list[SpecRow]) -> list[dict]:
    return [asdict(r) for r in rows]
