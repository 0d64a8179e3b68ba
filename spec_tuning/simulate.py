"""Simulated systems for exercising the judges without a model or a GPU.

``SimulatedLM`` is a fixed random recurrent "language model": its logits are a deterministic
function of the prefix, spread wide enough over a few hundred ids that the top-2 gap is often
tiny (near-ties), as in a real model. A ``SimulatedSystem`` adds its own small deterministic
logit noise (a different reduction order in a real kernel) and optional logits transforms (a
planted defect), and scores by teacher forcing like the engine adapter will. The count and
throughput generators produce the data the statistical rules see, with prompt-level
clustering, so false-reject rates and power can be measured by simulation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from spec_tuning.controller import RunSample
from spec_tuning.forcing import ForcedTrace, LogitsTransform, top1_and_margin


class SimulatedLM:
    """A seeded recurrent model: h_t = tanh(h_{t-1} R + E[x_t] + P[t]); logits = h_t U."""

    def __init__(self, vocab: int = 256, hidden: int = 48, max_len: int = 1024, seed: int = 0,
                 logit_scale: float = 4.0):
        rng = np.random.default_rng(seed)
        self.vocab, self.hidden = vocab, hidden
        self.embed = rng.standard_normal((vocab, hidden))
        # A recurrent gain above 1 keeps the dynamics chaotic, so prompts do not all converge
        # to one trajectory; a small position term keeps greedy decoding out of exact loops.
        self.recur = rng.standard_normal((hidden, hidden)) * (1.6 / np.sqrt(hidden))
        self.pos = rng.standard_normal((max_len, hidden)) * 0.25
        self.unembed = rng.standard_normal((hidden, vocab)) * (logit_scale / np.sqrt(hidden))
        self._cache: dict[bytes, np.ndarray] = {}

    def step(self, state: np.ndarray, token: int, position: int) -> np.ndarray:
        return np.tanh(state @ self.recur + self.embed[token] + self.pos[position])

    def states(self, prompt_ids: np.ndarray, forced_ids: np.ndarray) -> np.ndarray:
        """Hidden states that predict each forced token, shape [len(forced), hidden]."""
        seq = np.concatenate([prompt_ids, forced_ids[:-1]]).astype(np.int64)
        key = seq.tobytes() + len(forced_ids).to_bytes(4, "little")
        if key not in self._cache:
            h = np.zeros(self.hidden)
            out = np.empty((len(seq), self.hidden))
            for t, tok in enumerate(seq):
                h = self.step(h, int(tok), t)
                out[t] = h
            self._cache[key] = out[len(prompt_ids) - 1:]
        return self._cache[key]

    def random_prompts(self, count: int, length: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.integers(0, self.vocab, size=length) for _ in range(count)]


@dataclass
class SimulatedSystem:
    """One deployment of a :class:`SimulatedLM`: its kernel noise and its logits transforms."""

    lm: SimulatedLM
    noise: float = 0.02  # logit noise scale of this system's numerics
    seed: int = 1
    transforms: Sequence[LogitsTransform] = field(default_factory=tuple)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        self._noise_proj = rng.standard_normal((self.lm.hidden, self.lm.vocab)) / np.sqrt(
            self.lm.hidden
        )

    def _logits(self, states: np.ndarray, gen_positions: np.ndarray) -> np.ndarray:
        logits = states @ (self.lm.unembed + self.noise * self._noise_proj)
        for transform in self.transforms:
            logits = transform(logits, gen_positions)
        return logits

    def score(self, prompt_ids, forced_ids):
        """Teacher-forced top-1 ids and margins along ``forced_ids`` (the ForcedScorer API)."""
        prompt_ids, forced_ids = np.asarray(prompt_ids), np.asarray(forced_ids)
        states = self.lm.states(prompt_ids, forced_ids)
        return top1_and_margin(self._logits(states, np.arange(len(forced_ids))))

    def trace(self, reference) -> ForcedTrace:
        """``run_forced`` along a whole reference in one logits computation: the same picks
        and margins as scoring prompt by prompt, in a few large array operations."""
        states = [self.lm.states(np.asarray(p), np.asarray(f))
                  for p, f in zip(reference.prompts, reference.tokens, strict=True)]
        positions = np.concatenate([np.arange(len(f)) for f in reference.tokens])
        top1, margins = top1_and_margin(self._logits(np.concatenate(states), positions))
        cuts = np.cumsum([len(f) for f in reference.tokens])[:-1]
        return ForcedTrace(np.split(top1.astype(np.int64), cuts),
                           np.split(margins.astype(np.float64), cuts))

    def greedy(self, prompt_ids, max_new: int):
        """Plain autoregressive greedy decoding: (tokens, margins) (the GreedyDecoder API)."""
        h = np.zeros(self.lm.hidden)
        for t, tok in enumerate(prompt_ids):
            h = self.lm.step(h, int(tok), t)
        tokens, margins = [], []
        for i in range(max_new):
            top1, margin = top1_and_margin(self._logits(h[None, :], np.array([i])))
            tokens.append(int(top1[0]))
            margins.append(float(margin[0]))
            h = self.lm.step(h, tokens[-1], len(prompt_ids) + i)
        return np.array(tokens, dtype=np.int64), np.array(margins)


def _bursty_counts(rng: np.random.Generator, positions, prob, burst: float):
    """Event counts when events come in runs of mean length ``burst`` (geometric lengths)."""
    if burst <= 1.0:
        return rng.binomial(positions, prob)
    runs = rng.binomial(positions, np.clip(prob / burst, 0.0, 1.0))
    extra = rng.negative_binomial(np.maximum(runs, 1), 1.0 / burst)
    return np.minimum(runs + np.where(runs > 0, extra, 0), positions)


def clustered_paired_counts(rng: np.random.Generator, *, sims: int, prompts: int,
                            positions: int, stock_rate: float, excess: float,
                            shared_rate: float = 0.0, dispersion: float = 0.0,
                            burst: float = 1.0):
    """Per-prompt mismatch counts of a candidate and a stock system on the same positions.

    Two kinds of correlation inside a prompt: a difficulty multiplier m ~ Gamma(mean 1,
    variance ``dispersion``) scales all its mismatch probabilities, and mismatches come in
    runs of mean length ``burst`` (a wrong state persists for a few tokens). Per position the
    outcome is both-mismatch (``shared_rate``), stock-only or candidate-only, the candidate's
    rate exceeding the stock's by ``excess`` on average.
    Returns (cand_counts, stock_counts), each of shape [sims, prompts].
    """
    shape = (sims, prompts)
    m = rng.gamma(1.0 / dispersion, dispersion, size=shape) if dispersion > 0 else np.ones(shape)
    both = _bursty_counts(rng, positions, shared_rate * m, burst)
    stock_only = _bursty_counts(rng, positions, (stock_rate - shared_rate) * m, burst)
    cand_only = _bursty_counts(rng, positions, (stock_rate - shared_rate + excess) * m, burst)
    # Overlaps between the three kinds are negligible at the rates simulated (a few percent).
    return both + cand_only, both + stock_only


@dataclass
class SimulatedRunner:
    """A system whose throughput is ``speed`` tokens/s with log-normal run-to-run noise."""

    speed: float
    noise: float  # relative standard deviation of one run's throughput
    seed: int
    output_digest: str = "same"
    tokens_per_run: int = 1000
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        self._rng = np.random.default_rng(self.seed)

    def run(self, requests) -> RunSample:
        throughput = self.speed * float(np.exp(self.noise * self._rng.standard_normal()))
        return RunSample(tokens=self.tokens_per_run, seconds=self.tokens_per_run / throughput,
                         output_digest=self.output_digest)


def paired_log_ratios(rng: np.random.Generator, *, sims: int, pairs: int, gain: float,
                      noise: float) -> np.ndarray:
    """Per-pair log throughput ratios B/A for ``sims`` experiments, shape [sims, pairs]."""
    a = noise * rng.standard_normal((sims, pairs))
    b = np.log1p(gain) + noise * rng.standard_normal((sims, pairs))
    return b - a
