"""Speculative decoding loop: prefill, then draft -> verify -> commit until every row is done.

The loop mirrors ``engine.generate.generate``: the same prefill, the same first token (the
keyed pick from the prefill's logits), the same stop rules (a stop id ends a row and is kept;
``max_new_tokens`` caps it). Each step commits one or more tokens per row; a row's output is
cut at its first stop and at ``max_new_tokens``, so it is exactly the list plain decoding
returns. A finished row is parked at its prompt length while the others go on (its steps
then write scratch slots after its prompt), so the cache needs room for
``prompt + max_new_tokens + budget`` positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.generate import GREEDY, Engine, StopCheck
from engine.sampling import Sampling
from engine.speculative.drafters import Drafter
from engine.speculative.tree import DraftTree, limit_rows, share_budget
from engine.speculative.two_level import TwoLevel, two_level_step
from engine.speculative.verify import (
    Pending,
    Verdict,
    head_picks,
    verify,
    verify_finish,
    verify_forward,
)
from w12.errors import W12Error


@dataclass
class SpecStats:
    """Per verify step and row: how many tokens it committed (accepted drafts + 1)."""

    committed: list[int] = field(default_factory=list)
    steps: int = 0
    q_committed: list[int] = field(default_factory=list)  # two-level: the Q path's tokens

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step and active row, bonus included."""
        return sum(self.committed) / len(self.committed) if self.committed else 0.0


class SpecRunner:
    """One draft -> verify -> commit iteration on an ``Engine``'s model and cache.

    On a GPU the iteration is captured once in a CUDA graph (the drafter's work too when it is
    device-only; a host drafter's tree is copied into the graph's input buffers), so a step
    costs one replay. The verdict tensors are the graph's outputs: read them before the next
    step. With ``two_level`` each step is two-level verification (``two_level.py``): one graph
    too when the drafter works on the device (its re-draft from the Q pass's path needs no
    host), eagerly with a host drafter or the INT8 head. With the engine's certified INT8 head
    (``engine.head``), whose candidate recompute is sized on the host, the step is two graphs
    with the head's picks between them: the draft and the forward pass to the head's input,
    then acceptance and commit.
    """

    def __init__(self, engine: Engine, drafter: Drafter, *, budget: int, tree: bool,
                 sampling: Sampling = GREEDY, forced_accept: int | None = None,
                 cuda_graph: bool | None = None, two_level: TwoLevel | None = None,
                 shared_total: int | None = None, per_row: bool = False) -> None:
        if budget < 1:
            raise W12Error(f"node budget {budget}: must be at least 1")
        self.engine, self.drafter, self.budget, self.tree = engine, drafter, budget, tree
        self.sampling, self.forced_accept = sampling, forced_accept
        self.two_level, self.q_verdict, self.q_out = two_level, None, None
        # a node budget shared by all requests: ``budget`` nodes at most per request, this
        # many over the batch (``tree.share_budget``)
        self.shared_total = shared_total
        self.active = torch.ones(engine.batch, dtype=torch.bool, device=engine.model.device)
        # per_row: request b's tree cut to ``widths[b]`` nodes (``tree.limit_rows``), a buffer
        # the caller sets between steps (a captured graph reads it)
        self.per_row = per_row
        self.widths = torch.full((engine.batch,), budget, dtype=torch.long,
                                 device=engine.model.device)
        device = engine.model.device
        self.requests = torch.arange(engine.batch, device=device)
        self.roots = torch.zeros(engine.batch, dtype=torch.long, device=device)
        empty = torch.zeros(engine.batch, budget - 1, dtype=torch.long, device=device)
        self.tree_in = DraftTree.chain(self.roots, empty, torch.zeros_like(self.roots))
        self.graph = self.finish_graph = None
        if engine.head is not None:  # the head's picks between the two graphs of a step
            self.picks_in = torch.zeros(engine.batch, budget, dtype=torch.long, device=device)
        drafter.bind(engine.cache)
        graphable = two_level is None or (drafter.on_device and engine.head is None)
        if graphable and (cuda_graph if cuda_graph is not None else device.type == "cuda"):
            self._capture()

    def _propose(self, roots: torch.Tensor) -> DraftTree:
        draft = self.drafter.propose(roots, self.engine.cache, self.budget, self.tree)
        if self.per_row:
            draft = limit_rows(draft, self.widths)
        if self.shared_total is None:
            return draft
        try:
            return share_budget(draft, self.shared_total, self.active)
        except ValueError as exc:
            raise W12Error(f"drafter {self.drafter.name}: {exc}") from None

    def _draft(self) -> DraftTree:
        return self._propose(self.roots) if self.drafter.on_device else self.tree_in

    def _body(self) -> Verdict:
        if self.two_level is not None:  # (the Q verdict goes to ``q_out``)
            verdict, self.q_out = two_level_step(
                self.engine.model, self.engine.cache, self.drafter, self.roots, self.two_level,
                self.budget, self.tree, self.sampling, self.requests, self.engine.head,
                self.forced_accept)
            return verdict
        return verify(self.engine.model, self.engine.cache, self._draft(), self.sampling,
                      self.requests, self.forced_accept, self.engine.head)

    def _forward(self) -> Pending:  # (with the engine's INT8 head) the step up to its picks
        return verify_forward(self.engine.model, self.engine.cache, self._draft())

    def _finish(self) -> Verdict:  # (with the engine's INT8 head) the step after its picks
        return verify_finish(self.engine.cache, self.pending.tree, self.pending.paths,
                             self.picks_in, self.forced_accept)

    def _picks(self) -> None:
        self.picks_in.copy_(head_picks(self.engine.head, self.pending, self.sampling,
                                       self.requests))

    @torch.inference_mode()
    def _capture(self) -> None:
        cache = self.engine.cache
        saved = cache.lengths.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        split = self.engine.head is not None
        with torch.cuda.stream(stream):
            for _ in range(2):  # compiles; writes only scratch slots past the lengths
                if split:
                    self.pending = self._forward()
                    self._picks()
                    self._finish()
                else:
                    self._body()
                cache.lengths.copy_(saved)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):  # the warm-up's stream (w12_kernels)
            if split:
                self.pending = self._forward()
            else:
                self.verdict = self._body()
        if split:
            self.finish_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.finish_graph, stream=stream):
                self.verdict = self._finish()
        cache.lengths.copy_(saved)

    @torch.inference_mode()
    def step(self, roots: torch.Tensor) -> Verdict:
        """Draft from ``roots`` [B] (each request's last committed token), verify, commit."""
        self.roots.copy_(roots)
        if self.two_level is None and not self.drafter.on_device:
            draft = self._propose(roots)
            for name in ("tokens", "parents", "depth", "valid"):
                getattr(self.tree_in, name).copy_(getattr(draft, name))
        if self.graph is None:
            verdict = self._body()
            self.q_verdict = self.q_out
            return verdict
        self.graph.replay()
        self.q_verdict = self.q_out
        if self.finish_graph is not None:
            self._picks()
            self.finish_graph.replay()
        return self.verdict


def speculative_generate(
    engine: Engine, drafter: Drafter, prompts: list[list[int]], *, max_new_tokens: int,
    budget: int, tree: bool = True, sampling: Sampling = GREEDY,
    stop_ids: frozenset[int] = frozenset(), stop_check: StopCheck | None = None,
    on_token: Callable[[int, int], None] | None = None, runner: SpecRunner | None = None,
) -> tuple[list[list[int]], SpecStats]:
    """New tokens per prompt (as ``engine.generate.generate`` would return them) and the
    acceptance statistics. ``budget`` nodes per verify step (root included): 1 is plain
    decoding through the verify path. ``runner``: reuse one (and its CUDA graph) across calls
    on the same engine, drafter and settings."""
    runner = runner or SpecRunner(engine, drafter, budget=budget, tree=tree, sampling=sampling)
    lengths = engine.check_prompts(prompts, new_tokens=max_new_tokens + budget)
    device = engine.model.device
    logits = engine.prefill(prompts)
    roots = engine.choose(logits, sampling, runner.requests,
                          torch.tensor(lengths, device=device))
    first = roots.tolist()
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    stats = SpecStats()

    def take(row: int, tokens: list[int]) -> None:
        for token in tokens:
            if done[row]:
                return
            outputs[row].append(token)
            if on_token is not None:
                on_token(row, token)
            done[row] = (token in stop_ids or len(outputs[row]) == max_new_tokens
                         or bool(stop_check and stop_check(row, outputs[row])))

    for row, token in enumerate(first):
        take(row, [token])
    drafter.start(prompts, first)
    cache = engine.cache
    prompt_lengths = torch.tensor(lengths, device=device)
    while not all(done):
        verdict = runner.step(roots)
        counts = (verdict.accepted + 1).tolist()
        q_counts = (runner.q_verdict.accepted + 1).tolist() if runner.two_level else None
        emitted = verdict.emitted.tolist()
        committed = [emitted[row][: counts[row]] for row in range(len(prompts))]
        for row in range(len(prompts)):
            if not done[row]:
                stats.committed.append(counts[row])
                if q_counts is not None:
                    stats.q_committed.append(q_counts[row])
                take(row, committed[row])
        stats.steps += 1
        # a finished row is parked at its prompt: its later (discarded) steps write scratch
        # slots there, never past the cache (a row can finish up to budget - 1 tokens beyond
        # max_new_tokens, and each step writes budget slots past its length)
        finished = torch.tensor(done, device=device)
        cache.lengths.copy_(torch.where(finished, prompt_lengths, cache.lengths))
        drafter.observe(committed)
        roots = verdict.emitted.gather(1, verdict.accepted[:, None])[:, 0]
    return outputs, stats
