"""Token forcing: is a candidate system lossless against the stock one?

Reference tokens come from plain greedy decoding of the BF16 model (``build_reference``). Any
system is then run teacher-forced along them (``run_forced``), recording at every position its
top-1 id and logit margin (top-1 minus runner-up). ``judge`` compares a candidate's trace with
the stock's under two rules, both at the fixed levels below:

* mismatch rule: reject when the candidate's top-1 mismatch rate exceeds the stock's by more
  than ``MISMATCH_MARGIN`` (0.5 pp) at 95% confidence, i.e. a one-sided test of
  H0: p_cand - p_stock <= 0.005. Both systems are scored on the *same* positions, so the test
  works on per-position differences: positions where both agree (both right, or both wrong)
  cancel and only discordant positions move the estimate, as in McNemar's test. Unlike
  McNemar's test it does not treat positions as independent: a prompt that is hard for one
  system tends to be hard at many positions, which makes position-level standard errors too
  small and the test too eager to reject (``lab/stat_power.py`` measures this). The
  excess is therefore a ratio estimator over prompts with a cluster-robust standard error and
  a Student-t quantile on J-1 degrees of freedom (J prompts); the simulations in the tests
  check its false-reject rate at the H0 boundary with strongly clustered prompts.
* margin rule: delta is the largest reference margin at the stock's first divergence in each
  prompt, rounded up to a multiple of 1/8: the size of a near-tie that the stock's own
  numerics can flip. An *event* is a mismatch where the reference margin exceeds 2*delta;
  reject when the candidate has significantly more events than the stock. Events are rare, so
  the test is exact: on positions where exactly one system has an event, H0 makes the
  candidate's share Binomial(n, 1/2) (one-sided exact McNemar).

``PlantedDefect`` is a logits transform (+2 on every 7th vocabulary id from a position on)
that the engine adapter applies to prove the judge catches a real defect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from spec_tuning.stats import RateEstimate, binomial_excess_p, cluster_rate, paired_excess_test
from w12.errors import W12Error

# Fixed verdict levels: a candidate cannot choose how it is judged.
ALPHA = 0.05  # one-sided level of both rules (95% confidence)
MISMATCH_MARGIN = 0.005  # tolerated mismatch-rate excess over the stock (0.5 pp)
DELTA_QUANTUM = 1.0 / 8.0  # delta is rounded up to a multiple of this
EVENT_DELTA_FACTOR = 2.0  # an event needs reference margin > this * delta
AUDIT_EVENTS = 10  # how many of the largest unexplained events the verdict lists


class ForcedScorer(Protocol):
    """A system scored by teacher forcing along fixed tokens."""

    def score(self, prompt_ids, forced_ids) -> tuple[np.ndarray, np.ndarray]:
        """Top-1 ids and margins predicting ``forced_ids[i]`` from prompt + forced[:i]."""
        ...


class GreedyDecoder(Protocol):
    """The reference system: plain autoregressive greedy decoding."""

    def greedy(self, prompt_ids, max_new: int) -> tuple[np.ndarray, np.ndarray]:
        """Generated ids and the margin of each step's top-1 logit over the runner-up."""
        ...


class LogitsTransform(Protocol):
    def __call__(self, logits, gen_positions):
        """Return changed logits [T, V]; ``gen_positions[t]`` is row t's generation offset."""
        ...


@dataclass(frozen=True)
class PlantedDefect:
    """Adds ``boost`` to the logit of every id divisible by ``every`` at positions >= ``start``.

    Positions are generation offsets (0 = the first generated token). Works on numpy arrays
    and torch tensors and never modifies its input.
    """

    start: int = 0
    every: int = 7
    boost: float = 2.0

    def __call__(self, logits, gen_positions):
        out = logits.copy() if isinstance(logits, np.ndarray) else logits.clone()
        if hasattr(gen_positions, "cpu"):  # a torch tensor, possibly on a GPU
            gen_positions = gen_positions.cpu().numpy()
        rows = np.flatnonzero(np.asarray(gen_positions) >= self.start)
        if rows.size:
            sub = out[rows.tolist()]
            sub[:, :: self.every] += self.boost
            out[rows.tolist()] = sub
        return out


def top1_and_margin(logits) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 id (lowest id on ties) and top-1 minus runner-up logit per row, as numpy."""
    if not isinstance(logits, np.ndarray):  # a torch tensor, possibly on a GPU
        import torch

        values = torch.topk(logits.float(), 2, dim=-1).values
        top1 = torch.argmax(logits, dim=-1)
        return top1.cpu().numpy().astype(np.int64), (values[:, 0] - values[:, 1]).cpu().numpy()
    top1 = np.argmax(logits, axis=-1)
    top2 = np.partition(logits, -2, axis=-1)[:, -2:]
    return top1.astype(np.int64), (top2[:, 1] - top2[:, 0]).astype(np.float64)


@dataclass
class LogitsScorer:
    """A ForcedScorer from a function returning teacher-forced logits, plus transforms.

    ``logits_fn(prompt_ids, forced_ids)`` returns [len(forced_ids), V] logits, row i
    predicting ``forced_ids[i]``; the engine adapter supplies it.
    """

    logits_fn: object
    transforms: Sequence[LogitsTransform] = field(default_factory=tuple)

    def score(self, prompt_ids, forced_ids):
        logits = self.logits_fn(prompt_ids, forced_ids)
        positions = np.arange(len(forced_ids))
        for transform in self.transforms:
            logits = transform(logits, positions)
        return top1_and_margin(logits)


@dataclass
class Reference:
    """Greedy reference tokens and their margins, per prompt."""

    prompts: list[np.ndarray]
    tokens: list[np.ndarray]
    margins: list[np.ndarray]


@dataclass
class ForcedTrace:
    """A system's teacher-forced top-1 ids and margins along a reference, per prompt."""

    top1: list[np.ndarray]
    margins: list[np.ndarray]


def build_reference(decoder: GreedyDecoder, prompts: Sequence, max_new: int) -> Reference:
    tokens, margins = [], []
    for prompt in prompts:
        ids, m = decoder.greedy(prompt, max_new)
        tokens.append(np.asarray(ids, dtype=np.int64))
        margins.append(np.asarray(m, dtype=np.float64))
    return Reference([np.asarray(p) for p in prompts], tokens, margins)


def run_forced(scorer: ForcedScorer, reference: Reference) -> ForcedTrace:
    top1, margins = [], []
    for i, (prompt, forced) in enumerate(zip(reference.prompts, reference.tokens, strict=True)):
        ids, m = scorer.score(prompt, forced)
        ids, m = np.asarray(ids, dtype=np.int64), np.asarray(m, dtype=np.float64)
        if ids.shape != forced.shape or m.shape != forced.shape:
            raise W12Error(
                f"forced scorer: prompt {i} returned {ids.shape}/{m.shape} for "
                f"{forced.shape[0]} forced tokens"
            )
        top1.append(ids)
        margins.append(m)
    return ForcedTrace(top1, margins)


def stock_delta(reference: Reference, stock: ForcedTrace) -> float:
    """Largest reference margin at the stock's first divergences, rounded up to 1/8."""
    worst = 0.0
    for ref_ids, ref_margin, ids in zip(reference.tokens, reference.margins, stock.top1,
                                        strict=True):
        diverged = np.flatnonzero(ids != ref_ids)
        if diverged.size:
            worst = max(worst, float(ref_margin[diverged[0]]))
    return math.ceil(worst / DELTA_QUANTUM) * DELTA_QUANTUM


@dataclass(frozen=True)
class AuditEvent:
    prompt: int
    position: int
    reference_token: int
    candidate_token: int
    stock_token: int
    reference_margin: float
    candidate_margin: float
    stock_also: bool  # the stock mismatched here too


@dataclass
class ForcingVerdict:
    accepted: bool
    reasons: list[str]
    prompts: int
    positions: int
    stock_rate: RateEstimate
    candidate_rate: RateEstimate
    excess: float
    excess_lower: float  # one-sided 95% lower bound of p_cand - p_stock
    mismatch_p: float
    delta: float
    candidate_events: int
    stock_events: int
    candidate_only_events: int
    stock_only_events: int
    margin_p: float
    audit: list[AuditEvent]

    def to_dict(self) -> dict:
        return asdict(self)

    def report(self) -> str:
        s, c = self.stock_rate, self.candidate_rate
        lines = [
            f"verdict: {'ACCEPT' if self.accepted else 'REJECT'}"
            + ("" if self.accepted else f" ({'; '.join(self.reasons)})"),
            f"positions {self.positions} over {self.prompts} prompts",
            f"stock mismatch     {_pct_ci(s)}",
            f"candidate mismatch {_pct_ci(c)}",
            f"excess {100 * self.excess:+.3f} pp, one-sided 95% lower bound "
            f"{100 * self.excess_lower:+.3f} pp vs {100 * MISMATCH_MARGIN:.1f} pp, "
            f"p={self.mismatch_p:.3g}",
            f"delta {self.delta:.3f}: events (ref margin > {EVENT_DELTA_FACTOR * self.delta:.3f}) "
            f"candidate {self.candidate_events}, stock {self.stock_events}, "
            f"discordant {self.candidate_only_events}/{self.stock_only_events}, "
            f"p={self.margin_p:.3g}",
        ]
        for e in self.audit:
            lines.append(
                f"  prompt {e.prompt} pos {e.position}: ref {e.reference_token} "
                f"(margin {e.reference_margin:.3f}) -> cand {e.candidate_token} "
                f"(margin {e.candidate_margin:.3f}), stock {e.stock_token}"
            )
        return "\n".join(lines)


def _pct_ci(r: RateEstimate) -> str:
    return f"{100 * r.rate:.3f}%  95% CI [{100 * r.low:.3f}, {100 * r.high:.3f}]"


def _check_alignment(reference: Reference, trace: ForcedTrace, name: str) -> None:
    if len(trace.top1) != len(reference.tokens):
        raise W12Error(f"{name} trace has {len(trace.top1)} prompts, reference has "
                       f"{len(reference.tokens)}")
    for i, (ids, ref) in enumerate(zip(trace.top1, reference.tokens, strict=True)):
        if ids.shape != ref.shape:
            raise W12Error(f"{name} trace: prompt {i} has {ids.shape[0]} positions, reference "
                           f"has {ref.shape[0]}")


def _audit(reference, stock, candidate, threshold) -> list[AuditEvent]:
    events = []
    for p, (ref, ref_m, cand, cand_m, st) in enumerate(zip(
            reference.tokens, reference.margins, candidate.top1, candidate.margins, stock.top1,
            strict=True)):
        for pos in np.flatnonzero((cand != ref) & (ref_m > threshold)):
            events.append(AuditEvent(p, int(pos), int(ref[pos]), int(cand[pos]), int(st[pos]),
                                     float(ref_m[pos]), float(cand_m[pos]),
                                     bool(st[pos] != ref[pos])))
    events.sort(key=lambda e: (-e.reference_margin, e.prompt, e.position))
    return events[:AUDIT_EVENTS]


def judge(reference: Reference, stock: ForcedTrace, candidate: ForcedTrace) -> ForcingVerdict:
    """Apply the mismatch and margin rules to a candidate against the stock."""
    _check_alignment(reference, stock, "stock")
    _check_alignment(reference, candidate, "candidate")
    sizes = np.array([len(t) for t in reference.tokens])
    cand_miss = [c != r for c, r in zip(candidate.top1, reference.tokens, strict=True)]
    stock_miss = [s != r for s, r in zip(stock.top1, reference.tokens, strict=True)]
    cand_counts = np.array([m.sum() for m in cand_miss])
    stock_counts = np.array([m.sum() for m in stock_miss])
    test = paired_excess_test(cand_counts, stock_counts, sizes, margin=MISMATCH_MARGIN,
                              alpha=ALPHA)

    delta = stock_delta(reference, stock)
    threshold = EVENT_DELTA_FACTOR * delta
    big = [m > threshold for m in reference.margins]
    cand_ev = np.concatenate([c & b for c, b in zip(cand_miss, big, strict=True)])
    stock_ev = np.concatenate([s & b for s, b in zip(stock_miss, big, strict=True)])
    only_c, only_s = int((cand_ev & ~stock_ev).sum()), int((stock_ev & ~cand_ev).sum())
    margin_p = float(binomial_excess_p(only_c, only_s))

    reasons = []
    if test.reject:
        reasons.append("mismatch rate above stock + 0.5 pp")
    if margin_p < ALPHA:
        reasons.append(f"more mismatches above 2*delta={threshold:.3f} than stock")
    return ForcingVerdict(
        accepted=not reasons, reasons=reasons, prompts=len(sizes), positions=int(sizes.sum()),
        stock_rate=cluster_rate(stock_counts, sizes, 1 - ALPHA),
        candidate_rate=cluster_rate(cand_counts, sizes, 1 - ALPHA),
        excess=test.excess, excess_lower=test.lower, mismatch_p=test.p_value, delta=delta,
        candidate_events=int(cand_ev.sum()), stock_events=int(stock_ev.sum()),
        candidate_only_events=only_c, stock_only_events=only_s, margin_p=margin_p,
        audit=_audit(reference, stock, candidate, threshold),
    )


def evaluate(reference: Reference, stock: ForcedScorer, candidate: ForcedScorer) -> ForcingVerdict:
    """Run both systems teacher-forced along the reference and judge the candidate."""
    return judge(reference, run_forced(stock, reference), run_forced(candidate, reference))
