"""Continuous batching: requests join and leave an engine's rows between steps.

``Server`` holds a queue of requests and an ``Engine`` whose ``batch`` rows are slots. Between
steps it admits waiting requests into free rows, each prompt prefilled alone into its row
(``Engine.prefill_row``: the bits of a batch-1 prefill), then every row takes one step
together: a plain decode step, or with a drafter a speculative step (``SpecRunner``: draft,
verify, commit). A request leaves its row at its first stop token or at its
``max_new_tokens``; the row is parked at length 0 (its later steps write scratch slots at the
start of the row) until the next request takes it.

Every op on the step's path keeps each row's bits whatever the other rows hold (W12 GEMMs and
tree attention on a GPU, the CPU paths), and sampling draws with noise keyed by (seed, request
id, position), so a request's tokens are those of its own plain decoding at batch 1
(``generate(..., request_ids=[id])``), whichever requests share its steps and whenever it
arrived. ``arrival`` (a step number) simulates requests that arrive while others run.

Admission: by default every free row takes the next waiting request before each step (eager).
``admission=N`` caps the prompt tokens prefilled between two steps at N while other requests
are running (always at least one prompt when a row is free, so a long prompt still gets in):
newcomers wait a step or more for their first token, and the running requests' steps are not
held up by a burst of prefills.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.generate import GREEDY, Engine
from engine.sampling import Sampling
from engine.speculative.decode import SpecRunner
from engine.speculative.drafters import Drafter
from engine.speculative.two_level import TwoLevel
from w12.errors import W12Error


@dataclass
class Request:
    id: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # the first step at which it may be admitted
    output: list[int] = field(default_factory=list)
    done: bool = False


@dataclass
class ServeStats:
    steps: int = 0  # engine steps (decode or verify) run
    committed: list[int] = field(default_factory=list)  # tokens per active row and step
    admitted_at: dict[int, int] = field(default_factory=dict)  # request id -> step
    finished_at: dict[int, int] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)  # request id -> run start to done
    width_steps: dict[int, int] = field(default_factory=dict)  # per-row width -> row-steps
    first_token_s: dict[int, float] = field(default_factory=dict)  # request id -> run start to
    # its first token (its prefill's pick)
    prefill_tokens: dict[int, int] = field(default_factory=dict)  # step -> prompt tokens
    # prefilled just before it

    @property
    def tau(self) -> float:
        return sum(self.committed) / len(self.committed) if self.committed else 0.0


class Server:
    """Continuous batching over ``engine``'s rows (module docstring). With ``drafter``, every
    step is speculative with ``budget`` nodes (``tree``: a best-first tree, else a chain);
    ``shared_total``: at most that many nodes over all rows, the best across requests
    (``tree.share_budget``; a drafter with scores). ``widths`` (e.g. (8, 12, 16), the largest
    being ``budget``): per-request draft sizes chosen from each request's recent acceptance
    (``_width``). ``two_level``: every step is two-level verification (``two_level.py``), each
    request with its own tree (neither of the two options before)."""

    def __init__(self, engine: Engine, *, sampling: Sampling = GREEDY,
                 stop_ids: frozenset[int] = frozenset(), drafter: Drafter | None = None,
                 budget: int = 16, tree: bool = True, shared_total: int | None = None,
                 widths: tuple[int, ...] | None = None, admission: int | None = None,
                 two_level: TwoLevel | None = None) -> None:
        if admission is not None and admission < 1:
            raise W12Error(f"admission {admission}: the prompt tokens admitted between two "
                           "steps must be at least 1")
        self.admission = admission
        self.engine, self.sampling, self.stop_ids = engine, sampling, stop_ids
        self.drafter, self.budget = drafter, budget if drafter is not None else 1
        self.queue: deque[Request] = deque()
        self.rows: list[Request | None] = [None] * engine.batch
        self.next_id = 0
        device = engine.model.device
        self.lengths = [0] * engine.batch  # host copy of each row's committed length
        self.roots = torch.zeros(engine.batch, dtype=torch.long, device=device)
        self.runner = None
        self.widths = tuple(sorted(widths)) if widths else None
        if self.widths is not None and (drafter is None or self.widths[-1] != budget
                                        or self.widths[0] < 1):
            raise W12Error(f"per-request widths {widths}: need a drafter, each at least 1 and "
                           f"the largest equal to the budget {budget}")
        self.ema = [0.0] * engine.batch  # recent tokens committed per step, per row
        if two_level is not None and (drafter is None or shared_total is not None
                                      or self.widths is not None):
            raise W12Error("two-level verification needs a drafter and drafts each request's "
                           "own tree: no shared node budget, no per-request widths")
        if drafter is not None:
            self.runner = SpecRunner(engine, drafter, budget=budget, tree=tree,
                                     sampling=sampling, shared_total=shared_total,
                                     per_row=self.widths is not None, two_level=two_level)
            self.runner.requests.zero_()
            self.runner.active.zero_()
        engine.cache.lengths.zero_()

    def submit(self, prompt: list[int], *, max_new_tokens: int, arrival: int = 0) -> int:
        """Queue a request; returns its id (the key of its sampling noise)."""
        if not prompt:
            raise W12Error("empty prompt")
        vocab = self.engine.model.args.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise W12Error(f"token id {bad[0]} outside the vocabulary [0, {vocab})")
        if max_new_tokens < 1:
            raise W12Error(f"max_new_tokens {max_new_tokens}: must be at least 1")
        need = len(prompt) + max_new_tokens + self.budget
        if need > self.engine.max_seq_len:
            raise W12Error(f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new tokens "
                           f"(and a step of {self.budget}) needs {need} cache positions; the "
                           f"cache holds {self.engine.max_seq_len}")
        request = Request(self.next_id, list(prompt), max_new_tokens, arrival)
        self.next_id += 1
        self.queue.append(request)
        return request.id

    def run(self, on_token: Callable[[int, int], None] | None = None
            ) -> tuple[dict[int, list[int]], ServeStats]:
        """Serve until the queue and the rows are empty: request id -> new tokens."""
        stats, outputs, step = ServeStats(), {}, 0
        self.began = time.perf_counter()
        pending = sorted(self.queue, key=lambda r: r.arrival)
        self.queue.clear()
        self.queue.extend(pending)
        while self.queue or any(self.rows):
            self._admit(step, stats, on_token, outputs)
            if not any(self.rows):
                step = self.queue[0].arrival  # nobody to serve until the next arrival
                continue
            if self.runner is None:
                committed = self._decode_step()
            else:
                committed = self._spec_step(stats)
            stats.steps += 1
            step += 1
            for row, tokens in enumerate(committed):
                request = self.rows[row]
                if request is None:
                    continue
                stats.committed.append(len(tokens))
                self._take(request, tokens, on_token)
                if request.done:
                    self._finish(request, row, step, stats, outputs)
        return outputs, stats

    # --------------------------------------------------------------------------- internals

    def _admit(self, step: int, stats: ServeStats, on_token, outputs) -> None:
        admitted, running = 0, any(self.rows)  # the cap protects requests already running
        for row in range(self.engine.batch):
            if self.rows[row] is not None or not self.queue or self.queue[0].arrival > step:
                continue
            if self.admission is not None and admitted and \
                    admitted + len(self.queue[0].prompt) > self.admission and running:
                break  # the rest waits for the next step
            request = self.queue.popleft()
            admitted += len(request.prompt)
            stats.prefill_tokens[step] = admitted
            logits = self.engine.prefill_row(row, request.prompt)
            first = int(self.engine.choose(
                logits[None], self.sampling, torch.tensor([request.id], device=logits.device),
                torch.tensor([len(request.prompt)], device=logits.device))[0])
            self.lengths[row] = len(request.prompt)
            stats.admitted_at[request.id] = step
            stats.first_token_s[request.id] = time.perf_counter() - self.began
            self._take(request, [first], on_token)
            if request.done:  # a stop token or max_new_tokens == 1: it never takes a step
                self._finish(request, row, step, stats, outputs)
                continue
            self.rows[row] = request
            self.roots[row] = first
            if self.runner is not None:
                self.runner.requests[row] = request.id
                self.runner.active[row] = True
                if self.widths is not None:  # start in the middle
                    self.runner.widths[row] = self.widths[len(self.widths) // 2]
                    self.ema[row] = self.widths[len(self.widths) // 2] / 2
                self.drafter.admit(row, request.prompt, first)

    def _take(self, request: Request, tokens: list[int], on_token) -> None:
        for token in tokens:
            if request.done:
                return
            request.output.append(token)
            if on_token is not None:
                on_token(request.id, token)
            request.done = token in self.stop_ids or len(request.output) == request.max_new_tokens

    def _finish(self, request: Request, row: int, step: int, stats: ServeStats,
                outputs: dict[int, list[int]]) -> None:
        outputs[request.id] = request.output
        stats.finished_at[request.id] = step
        stats.seconds[request.id] = time.perf_counter() - self.began  # tokens read back: synced
        self._free(row)

    def _free(self, row: int) -> None:
        self.rows[row] = None
        if self.runner is not None:
            self.runner.active[row] = False
        self.lengths[row] = 0
        self.engine.cache.lengths[row] = 0

    def _decode_step(self) -> list[list[int]]:
        engine = self.engine
        active = [r is not None for r in self.rows]
        engine.next_slot = max(self.lengths)
        logits = engine.step(self.roots)
        positions = torch.tensor([n + 1 for n in self.lengths], device=logits.device)
        ids = torch.tensor([r.id if r is not None else 0 for r in self.rows],
                           device=logits.device)
        picks = engine.choose(logits, self.sampling, ids, positions)
        self.roots.copy_(picks)
        tokens = picks.tolist()
        for row in range(engine.batch):
            self.lengths[row] += 1 if active[row] else 0
        self._park_idle(active)
        return [[t] if a else [] for t, a in zip(tokens, active, strict=True)]

    def _spec_step(self, stats: ServeStats) -> list[list[int]]:
        active = [r is not None for r in self.rows]
        verdict = self.runner.step(self.roots)
        counts = (verdict.accepted + 1).tolist()
        emitted = verdict.emitted.tolist()
        committed = [emitted[row][:counts[row]] if active[row] else []
                     for row in range(self.engine.batch)]
        for row in range(self.engine.batch):
            self.lengths[row] += counts[row] if active[row] else 0
        self.roots.copy_(verdict.emitted.gather(1, verdict.accepted[:, None])[:, 0])
        if self.widths is not None:
            self._adapt_widths(active, counts, stats)
        self._park_idle(active)
        self.drafter.observe(committed)
        return committed

    def _adapt_widths(self, active: list[bool], counts: list[int], stats: ServeStats) -> None:
        """Each active row's next draft size: the smallest width at least twice its recent
        tokens per step (an exponential average, weight 1/2), the largest if none is."""
        widths = self.runner.widths.tolist()
        for row in range(self.engine.batch):
            if not active[row]:
                continue
            stats.width_steps[widths[row]] = stats.width_steps.get(widths[row], 0) + 1
            self.ema[row] = 0.5 * self.ema[row] + 0.5 * counts[row]
            widths[row] = next((w for w in self.widths if w >= 2 * self.ema[row]),
                               self.widths[-1])
        self.runner.widths.copy_(torch.tensor(widths))

    def _park_idle(self, active: list[bool]) -> None:
        """Idle rows back to length 0, so their discarded steps never write past the cache."""
        if not all(active):
            idle = torch.tensor([not a for a in active], device=self.engine.cache.device)
            self.engine.cache.lengths.masked_fill_(idle, 0)
