"""Token forcing: is a candidate system lossless against the stock one?

Reference tokens come from plain greedy (or keyed-sampled) decoding of the BF16 model
(``build_reference``). Any system is then driven along them through its own steps (the engine
adapter forces it through its decode step, or its verify step with the reference as the draft),
recording at every position its pick (top-1, or the keyed-noise sample) and margin (the pick's
score minus the runner-up's). The stock is forced the same way, so its mismatches are the
numerics noise a lossless system shows, and ``judge`` compares the candidate with it under two
rules, combined by Holm's method so that together they falsely reject a lossless candidate at
most ``ALPHA`` (5%) of the time:

* mismatch rule: reject when the candidate's mismatch rate exceeds the stock's by more than
  ``MISMATCH_MARGIN`` (0.5 pp), a one-sided test of H0: p_cand - p_stock <= 0.005 on the
  per-prompt differences (positions where both agree cancel, as in McNemar's test). Positions
  inside a prompt are not independent, so the excess is a ratio estimator over prompts with a
  cluster-robust standard error and a Student-t quantile on J-1 degrees of freedom; the exact
  binomial p-value of the net excess count is a floor under it, so a zero standard error (a
  stock that never mismatches) never gives certainty.
* margin rule: delta is the size of a near-tie that lossless numerics can flip, measured on a
  *calibration* set of prompts that the verdict never judges: the ``DELTA_QUANTILE`` quantile
  of |stock margin - reference margin| where the two pick the same token (the noise of the
  difference of the two best scores), rounded up to a multiple of 1/8 and at least 1/8. An
  *event* is a mismatch where the reference margin exceeds 2*delta; reject when the candidate
  has significantly more events than the stock (exact one-sided McNemar test on the
  positions where exactly one of them has an event).

``PlantedDefect`` (+2 on every 7th vocabulary id from a position on) and ``NearTieSwap`` (the
top two scores swapped where they are within a gap) are logits transforms that prove the judge
catches real defects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from spec_tuning.stats import (
    RateEstimate,
    binomial_excess_p,
    cluster_rate,
    holm,
    paired_excess_test,
)
from w12.errors import W12Error

# Fixed verdict levels: a candidate cannot choose how it is judged.
ALPHA = 0.05  # family-wise level of the two rules together (Holm)
MISMATCH_MARGIN = 0.005  # tolerated mismatch-rate excess over the stock (0.5 pp)
DELTA_QUANTILE = 0.999  # delta: this quantile of the stock's margin noise on calibration
DELTA_QUANTUM = 1.0 / 8.0  # delta is rounded up to a multiple of this, and is at least this
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

    def fires_within(self, tokens: int) -> bool:
        """Whether it changes anything in ``tokens`` generated positions."""
        return tokens > self.start


@dataclass(frozen=True)
class NearTieSwap:
    """Swaps the two best logits of every row whose top-1 leads the runner-up by less than
    ``gap``: a kernel that gets near-ties wrong. Numpy or torch; never modifies its input."""

    gap: float = 0.25

    def __call__(self, logits, gen_positions):
        torch_in = not isinstance(logits, np.ndarray)
        values = logits.float().cpu().numpy() if torch_in else np.asarray(logits)
        top2 = np.argsort(-values, axis=-1, kind="stable")[:, :2]
        rows = np.arange(values.shape[0])
        first, second = values[rows, top2[:, 0]], values[rows, top2[:, 1]]
        swap = np.flatnonzero((first - second > 0) & (first - second < self.gap))
        out = logits.clone() if torch_in else logits.copy()
        if swap.size:
            a, b = top2[swap, 0], top2[swap, 1]
            if torch_in:
                ra, rb = out[swap, a].clone(), out[swap, b].clone()
                out[swap, a], out[swap, b] = rb, ra
            else:
                out[swap, a], out[swap, b] = values[swap, b], values[swap, a]
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


@dataclass(frozen=True)
class Calibration:
    """delta and where it came from: the stock forced along a calibration reference."""

    delta: float
    noise_quantile: float  # DELTA_QUANTILE quantile of |stock margin - reference margin|
    prompts: int
    positions: int  # positions where stock and reference pick the same token

    def to_dict(self) -> dict:
        return asdict(self)


def calibrate(reference: Reference, stock: ForcedTrace) -> Calibration:
    """delta from the stock's margin noise along a calibration reference (never judged)."""
    _check_alignment(reference, stock, "calibration stock")
    noise = np.concatenate([
        np.abs(sm - rm)[(sids == rids) & np.isfinite(sm) & np.isfinite(rm)]
        for rids, rm, sids, sm in zip(reference.tokens, reference.margins, stock.top1,
                                      stock.margins, strict=True)])
    if noise.size == 0:
        raise W12Error("calibration: the stock agrees with the reference at no position")
    q = float(np.quantile(noise, DELTA_QUANTILE))
    delta = max(DELTA_QUANTUM, math.ceil(q / DELTA_QUANTUM) * DELTA_QUANTUM)
    return Calibration(delta, q, len(reference.tokens), int(noise.size))


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
    calibration: Calibration
    candidate_events: int
    stock_events: int
    candidate_only_events: int
    stock_only_events: int
    margin_p: float
    mismatch_p_holm: float  # the p-values adjusted for testing two rules (Holm)
    margin_p_holm: float
    audit: list[AuditEvent]

    @property
    def delta(self) -> float:
        return self.calibration.delta

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
            f"p={self.mismatch_p:.3g} (Holm {self.mismatch_p_holm:.3g})",
            f"delta {self.delta:.3f} (calibration: {self.calibration.prompts} other prompts, "
            f"{DELTA_QUANTILE:g} quantile of the stock's margin noise "
            f"{self.calibration.noise_quantile:.3f})",
            f"events (ref margin > {EVENT_DELTA_FACTOR * self.delta:.3f}) "
            f"candidate {self.candidate_events}, stock {self.stock_events}, "
            f"discordant {self.candidate_only_events}/{self.stock_only_events}, "
            f"p={self.margin_p:.3g} (Holm {self.margin_p_holm:.3g})",
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


def judge(reference: Reference, stock: ForcedTrace, candidate: ForcedTrace,
          calibration: Calibration) -> ForcingVerdict:
    """Apply the mismatch and margin rules to a candidate against the stock; ``calibration``
    (from :func:`calibrate` on other prompts) gives delta."""
    _check_alignment(reference, stock, "stock")
    _check_alignment(reference, candidate, "candidate")
    sizes = np.array([len(t) for t in reference.tokens])
    cand_miss = [c != r for c, r in zip(candidate.top1, reference.tokens, strict=True)]
    stock_miss = [s != r for s, r in zip(stock.top1, reference.tokens, strict=True)]
    cand_counts = np.array([m.sum() for m in cand_miss])
    stock_counts = np.array([m.sum() for m in stock_miss])
    test = paired_excess_test(cand_counts, stock_counts, sizes, margin=MISMATCH_MARGIN,
                              alpha=ALPHA)

    threshold = EVENT_DELTA_FACTOR * calibration.delta
    big = [m > threshold for m in reference.margins]
    cand_ev = np.concatenate([c & b for c, b in zip(cand_miss, big, strict=True)])
    stock_ev = np.concatenate([s & b for s, b in zip(stock_miss, big, strict=True)])
    only_c, only_s = int((cand_ev & ~stock_ev).sum()), int((stock_ev & ~cand_ev).sum())
    margin_p = float(binomial_excess_p(only_c, only_s))
    mismatch_holm, margin_holm = holm([test.p_value, margin_p])

    reasons = []
    if mismatch_holm < ALPHA:
        reasons.append("mismatch rate above stock + 0.5 pp")
    if margin_holm < ALPHA:
        reasons.append(f"more mismatches above 2*delta={threshold:.3f} than stock")
    return ForcingVerdict(
        accepted=not reasons, reasons=reasons, prompts=len(sizes), positions=int(sizes.sum()),
        stock_rate=cluster_rate(stock_counts, sizes, 1 - ALPHA),
        candidate_rate=cluster_rate(cand_counts, sizes, 1 - ALPHA),
        excess=test.excess, excess_lower=test.lower, mismatch_p=test.p_value,
        calibration=calibration, candidate_events=int(cand_ev.sum()),
        stock_events=int(stock_ev.sum()), candidate_only_events=only_c, stock_only_events=only_s,
        margin_p=margin_p, mismatch_p_holm=float(mismatch_holm),
        margin_p_holm=float(margin_holm), audit=_audit(reference, stock, candidate, threshold),
    )


def evaluate(calibration_reference: Reference, reference: Reference, stock: ForcedScorer,
             candidate: ForcedScorer) -> ForcingVerdict:
    """Force both systems along the references, calibrate delta on the first, judge on the
    second (the two references must hold different prompts)."""
    calibration = calibrate(calibration_reference, run_forced(stock, calibration_reference))
    return judge(reference, run_forced(stock, reference), run_forced(candidate, reference),
                 calibration)
