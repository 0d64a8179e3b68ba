"""Token forcing on the engine: every system driven along the reference through its own steps.

A system generates through one *path*, and it is forced through the same one:

* ``decode``: ``Engine.prefill``, then one ``Engine.step`` per reference token (the decode
  kernels, the cache, the CUDA graph on a GPU): the logits of step i predict token i + 1.
* ``chain:N`` / ``tree:N``: the speculative verify step (``SpecRunner.step``, graphed on a GPU)
  with the reference continuation as the draft: a chain of N - 1 reference tokens after the
  root, or a tree of N nodes whose main path is the reference and whose other nodes are
  siblings holding other tokens (laid out depth by depth, as the best-first builder lays out a
  tree). Acceptance is forced along the main path (``forced_accept``), so ``keep`` compacts it
  into place and the next step starts after it; the verdict's logits at the main-path nodes
  give the picks.
* ``prefill``: one causal forward over prompt + reference. It never reads the cache nor runs
  the decode or verify kernels, so it is blind to their defects; it is kept as the cheapest
  check of the prefill path only.

The batch is the system's serving batch: a last short group is filled with copies of its last
prompt, whose picks are dropped, so every step runs at the batch the system serves with (a
BF16 GEMM's bits depend on it). At every position the pick is the top-1 (greedy) or the keyed
Gumbel sample of ``engine.sampling`` (keyed by seed, the prompt's index in the set and the
absolute position, so a row draws the same noise whatever group it runs in), and the margin is
the pick's score minus the runner-up's. Logits transforms (planted defects) see each row's
generation offset; a ``KVShift`` defect replaces the cache the model makes.

The reference is plain decoding through the decode path at batch 1 (``REFERENCE_BATCH``): the
stock at its serving batch then differs from it by real numerics noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.cache import KVCache
from engine.generate import Engine
from engine.model import Transformer
from engine.ops import OpSet
from engine.sampling import Sampling, gumbel_noise, row_keys, top_p_mask
from engine.speculative.decode import SpecRunner
from engine.speculative.drafters import Drafter
from engine.speculative.tree import DraftTree
from spec_tuning.forcing import (
    ForcedTrace,
    NearTieSwap,
    PlantedDefect,
    Reference,
    top1_and_margin,
)
from w12.errors import W12Error

REFERENCE_BATCH = 1
PATH_KINDS = ("decode", "chain", "tree", "prefill")
LOGITS_BUDGET = 1 << 30  # bytes of fp32 logits one prefill-path forward may produce


@dataclass(frozen=True)
class ForcingPath:
    kind: str = "decode"
    budget: int = 1  # nodes per verify step (chain / tree)

    @classmethod
    def parse(cls, text: str) -> ForcingPath:
        kind, _, budget = text.partition(":")
        if kind not in PATH_KINDS or (kind in ("chain", "tree")) != bool(budget):
            raise W12Error(f"path {text!r}: use decode, prefill, chain:N or tree:N")
        try:
            n = int(budget) if budget else 1
        except ValueError:
            raise W12Error(f"path {text!r}: N must be an integer") from None
        if n < 2 and kind in ("chain", "tree"):
            raise W12Error(f"path {text!r}: a verify step needs N >= 2 nodes")
        if kind == "tree" and n < 3:
            raise W12Error(f"path {text!r}: a tree with siblings needs N >= 3 nodes")
        return cls(kind, n)

    def __str__(self) -> str:
        return self.kind if self.kind in ("decode", "prefill") else f"{self.kind}:{self.budget}"


# ---------------------------------------------------------------------------------------------
# A cache defect


class ShiftedWriteCache(KVCache):
    """A KV cache whose write lands one slot early at every slot ``start + k * every``: the
    slot before is overwritten and the slot itself keeps stale data. One extra slot at the end
    takes the rows a write leaves out, so every write stays a plain scatter (CUDA-graph safe)."""

    def __init__(self, args, batch: int, seq_len: int, *, start: int, every: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(args.n_layers, batch, args.n_kv_heads, seq_len + 1, args.head_dim,
                         dtype=dtype, device=device)
        self.start, self.every = start, every

    @property
    def seq_len(self) -> int:
        return self.k.shape[3] - 1

    def write(self, index, slots, k, v) -> None:
        spare = self.seq_len
        hit = (slots >= self.start) & ((slots - self.start) % self.every == 0)
        super().write(index, torch.where(hit, spare, slots), k, v)
        super().write(index, torch.where(hit, slots - 1, spare), k, v)


@dataclass(frozen=True)
class KVShift:
    """Installs a ``ShiftedWriteCache`` as the caches ``model`` makes from now on."""

    start: int = 64
    every: int = 1

    def install(self, model: Transformer) -> None:
        def new_cache(batch: int, seq_len: int) -> KVCache:
            model.rope_tables(seq_len)
            return ShiftedWriteCache(model.args, batch, seq_len, start=self.start,
                                     every=self.every, dtype=model.dtype, device=model.device)

        model.new_cache = new_cache  # this instance only: the defective system's own load

    def fires_within(self, prompt_lengths: Sequence[int], tokens: int) -> bool:
        """Whether a step reads a slot it moved: some sequence reaches slot ``start``."""
        return max(prompt_lengths) + tokens - 1 > self.start


DEFECT_FORMS = ("logit-bias:P", "near-tie:GAP", "kv-shift:SLOT[:EVERY]")


def parse_defect(text: str):
    """A planted defect from its name: ``logit-bias:P`` (+2 on every 7th vocabulary id from
    generated position P on), ``near-tie:GAP`` (the two best logits swapped where they are
    within GAP), ``kv-shift:SLOT[:EVERY]`` (the cache write at slot SLOT, and every EVERY-th
    after it, lands one slot early; EVERY 1 by default: every slot from SLOT on)."""
    kind, _, args = text.partition(":")
    parts = args.split(":") if args else []
    try:
        if kind == "logit-bias" and len(parts) == 1 and int(parts[0]) >= 0:
            return PlantedDefect(start=int(parts[0]))
        if kind == "near-tie" and len(parts) == 1 and float(parts[0]) > 0:
            return NearTieSwap(gap=float(parts[0]))
        if kind == "kv-shift" and len(parts) in (1, 2) and int(parts[0]) >= 1 and \
                (len(parts) == 1 or int(parts[1]) >= 1):
            return KVShift(int(parts[0]), int(parts[1]) if len(parts) == 2 else 1)
    except ValueError:
        pass
    raise W12Error(f"defect {text!r}: use one of {', '.join(DEFECT_FORMS)}")


# ---------------------------------------------------------------------------------------------
# Picks


@dataclass
class Picker:
    """The pick and margin at each row: greedy, or keyed Gumbel sampling as ``choose`` draws,
    after the system's logits transforms."""

    sampling: Sampling = field(default_factory=Sampling)
    transforms: Sequence = ()

    def __call__(self, logits: torch.Tensor, offsets, requests, positions):
        offsets = np.asarray(offsets)
        for transform in self.transforms:
            logits = transform(logits, offsets)
        scores = logits.float()
        if not self.sampling.greedy:
            scores = scores / self.sampling.temperature
            if self.sampling.top_p < 1.0:
                scores = scores.masked_fill(~top_p_mask(scores, self.sampling.top_p),
                                            float("-inf"))
            keys = row_keys(self.sampling.seed, torch.as_tensor(requests, device=scores.device),
                            torch.as_tensor(positions, device=scores.device))
            scores = scores + gumbel_noise(keys, scores.shape[-1])
        return top1_and_margin(scores)


def _as_ids(tokens) -> list[int]:
    return [int(t) for t in np.asarray(tokens, dtype=np.int64).ravel()]


@dataclass
class _Group:
    """Up to ``batch`` prompts (indices into the set) padded to the batch with copies."""

    index: list[int]
    prompts: list[list[int]]
    forced: np.ndarray  # [batch, steps] reference tokens, padded with the row's last token
    lengths: list[int]  # reference tokens per real row

    @property
    def rows(self) -> int:
        return len(self.index)


def _groups(prompts: list, forced: list, batch: int):
    for start in range(0, len(prompts), batch):
        index = list(range(start, min(start + batch, len(prompts))))
        rows = index + [index[-1]] * (batch - len(index))
        steps = max(len(forced[i]) for i in index)
        padded = np.zeros((batch, steps), dtype=np.int64)
        for row, i in enumerate(rows):
            padded[row, : len(forced[i])] = forced[i]
            padded[row, len(forced[i]):] = forced[i][-1]
        yield _Group(index, [prompts[i] for i in rows], padded, [len(forced[i]) for i in index])


class _Recorder:
    """Collects picks and margins per real row at generation offsets."""

    def __init__(self, group: _Group, picker: Picker, device) -> None:
        self.group, self.picker = group, picker
        self.requests = np.array(group.index + [group.index[-1]] * (len(group.prompts)
                                                                     - group.rows))
        self.prompt_len = np.array([len(p) for p in group.prompts])
        steps = group.forced.shape[1]
        self.top1 = np.full((len(group.prompts), steps), -1, dtype=np.int64)
        self.margin = np.zeros((len(group.prompts), steps))

    def record(self, logits: torch.Tensor, offset: int) -> np.ndarray:
        """Logits [B, V] predicting reference offset ``offset`` of every row; returns picks."""
        b = logits.shape[0]
        offsets = np.full(b, offset)
        top1, margin = self.picker(logits, offsets, self.requests, self.prompt_len + offset)
        if offset < self.top1.shape[1]:
            self.top1[:, offset], self.margin[:, offset] = top1, margin
        return top1

    def rows(self):
        for row, n in enumerate(self.group.lengths):
            yield self.group.index[row], self.top1[row, :n], self.margin[row, :n]


# ---------------------------------------------------------------------------------------------
# Paths


def _engine(model: Transformer, group: _Group, extra: int) -> Engine:
    longest = max(map(len, group.prompts))
    return Engine(model, batch=len(group.prompts),
                  max_seq_len=longest + group.forced.shape[1] + extra)


@torch.inference_mode()
def _force_decode(model, group: _Group, rec: _Recorder) -> None:
    engine = _engine(model, group, 0)
    logits = engine.prefill(group.prompts)
    device = model.device
    for i in range(group.forced.shape[1]):
        rec.record(logits, i)
        if i + 1 == group.forced.shape[1]:
            break
        logits = engine.step(torch.as_tensor(group.forced[:, i], device=device))


class ReferenceDraft(Drafter):
    """Proposes the reference continuation after each root: a chain, or a tree whose main
    path is the reference and whose extra nodes are siblings along it (other tokens)."""

    name = "reference"

    def __init__(self, forced: np.ndarray, budget: int, tree: bool, vocab: int) -> None:
        self.forced, self.budget, self.tree_mode, self.vocab = forced, budget, tree, vocab
        siblings = (budget - 1) // 2 if tree else 0
        self.depth = budget - 1 - siblings  # main-path nodes after the root
        main, parents, depth = [0], [-1], [0]
        sibling_of = {}  # node index -> the depth of the main node it stands beside
        for d in range(1, self.depth + 1):
            main.append(len(parents))
            parents.append(main[d - 1])
            depth.append(d)
            if d <= siblings:
                sibling_of[len(parents)] = d
                parents.append(main[d - 1])
                depth.append(d)
        self.main, self.sibling_of = main, sibling_of
        self.parents, self.node_depth = parents, depth
        self.at = 0  # reference offset of the next root

    def tokens(self, at: int) -> np.ndarray:
        """[B, N] node tokens for roots at reference offset ``at``."""
        b, steps = self.forced.shape
        cols = np.minimum(at + np.asarray(self.node_depth), steps - 1)
        tokens = self.forced[:, cols]
        for node, d in self.sibling_of.items():
            tokens[:, node] = (tokens[:, self.main[d]] + 1) % self.vocab
        return tokens

    def propose(self, roots, cache, budget, tree) -> DraftTree:
        device = roots.device
        b = roots.shape[0]
        as_tensor = lambda x: torch.as_tensor(np.array(x), device=device)  # noqa: E731
        return DraftTree(as_tensor(self.tokens(self.at)),
                         as_tensor(np.broadcast_to(self.parents, (b, self.budget))),
                         as_tensor(np.broadcast_to(self.node_depth, (b, self.budget))),
                         torch.ones(b, self.budget, dtype=torch.bool, device=device))


@torch.inference_mode()
def _force_verify(model, group: _Group, rec: _Recorder, path: ForcingPath) -> None:
    engine = _engine(model, group, path.budget)
    draft = ReferenceDraft(group.forced, path.budget, path.kind == "tree", model.args.vocab_size)
    runner = SpecRunner(engine, draft, budget=path.budget, tree=draft.tree_mode,
                        forced_accept=draft.depth)
    device = model.device
    rec.record(engine.prefill(group.prompts), 0)
    steps = group.forced.shape[1]
    while draft.at + 1 < steps:
        roots = torch.as_tensor(group.forced[:, draft.at], device=device)
        verdict = runner.step(roots)
        for d, node in enumerate(draft.main):
            if draft.at + d + 1 < steps:
                rec.record(verdict.logits[:, node], draft.at + d + 1)
        draft.at += draft.depth + 1


@torch.inference_mode()
def _force_prefill(model, group: _Group, rec: _Recorder) -> None:
    steps = group.forced.shape[1]
    seqs = [p + _as_ids(f[:-1]) for p, f in zip(group.prompts, group.forced, strict=True)]
    model.ops = OpSet(compiled=False)  # eager ops: one shape per batch would recompile
    tokens = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for row, seq in enumerate(seqs):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    logits = model.score(tokens.to(model.device))
    starts = torch.tensor([len(p) - 1 for p in group.prompts])
    for i in range(steps):
        rec.record(logits[torch.arange(len(seqs)), starts + i], i)


@dataclass
class PathScorer:
    """Forces one model along a reference through ``path`` at ``batch`` rows per step."""

    model: Transformer
    path: ForcingPath = field(default_factory=ForcingPath)
    batch: int = 8
    picker: Picker = field(default_factory=Picker)

    def trace(self, reference: Reference) -> ForcedTrace:
        prompts = [_as_ids(p) for p in reference.prompts]
        forced = [_as_ids(t) for t in reference.tokens]
        if any(not f for f in forced):
            raise W12Error("forced scoring: a prompt has no reference tokens")
        top1, margins = [None] * len(prompts), [None] * len(prompts)
        batch = self._batch(prompts, forced)
        for group in _groups(prompts, forced, batch):
            rec = _Recorder(group, self.picker, self.model.device)
            if self.path.kind == "decode":
                _force_decode(self.model, group, rec)
            elif self.path.kind == "prefill":
                _force_prefill(self.model, group, rec)
            else:
                _force_verify(self.model, group, rec, self.path)
            for index, t, m in rec.rows():
                top1[index], margins[index] = t, m
        return ForcedTrace(top1, margins)

    def _batch(self, prompts, forced) -> int:
        if self.path.kind != "prefill":
            return self.batch
        longest = max(len(p) + len(f) for p, f in zip(prompts, forced, strict=True))
        return max(1, min(self.batch, LOGITS_BUDGET // (4 * self.model.args.vocab_size
                                                         * longest)))

    def score(self, prompt_ids, forced_ids):
        """The ForcedScorer Protocol, one prompt (at the scorer's batch, filled by copies)."""
        ref = Reference([np.asarray(prompt_ids)], [np.asarray(forced_ids)],
                        [np.zeros(len(forced_ids))])
        trace = self.trace(ref)
        return trace.top1[0], trace.margins[0]


@torch.inference_mode()
def reference_decode(model: Transformer, prompts: Sequence, max_new: int, *,
                     sampling: Sampling | None = None, stop_ids: frozenset[int] = frozenset(),
                     batch: int = REFERENCE_BATCH) -> Reference:
    """Plain decoding of ``model`` through its decode path: each prompt's tokens end at its
    first stop id (kept) or after ``max_new`` tokens; picks as ``Picker`` makes them."""
    picker = Picker(sampling or Sampling())
    prompts = [_as_ids(p) for p in prompts]
    tokens: list = [None] * len(prompts)
    margins: list = [None] * len(prompts)
    device = model.device
    for group in _groups(prompts, [[0] * max_new] * len(prompts), batch):
        engine = _engine(model, group, 0)
        rec = _Recorder(group, picker, device)
        logits = engine.prefill(group.prompts)
        done = np.zeros(len(group.prompts), dtype=bool)
        ends = np.full(len(group.prompts), max_new)
        for i in range(max_new):
            picks = rec.record(logits, i)
            for row in np.flatnonzero(~done & np.isin(picks, list(stop_ids))):
                done[row], ends[row] = True, i + 1
            if done.all() or i + 1 == max_new:
                break
            logits = engine.step(torch.as_tensor(picks, device=device))
        for row, index in enumerate(group.index):
            tokens[index] = rec.top1[row, : ends[row]].copy()
            margins[index] = rec.margin[row, : ends[row]].copy()
    return Reference([np.asarray(p, dtype=np.int64) for p in prompts], tokens, margins)
