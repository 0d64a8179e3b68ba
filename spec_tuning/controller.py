"""Paired-run controller: promotes a candidate only when it is faster by more than the noise.

The incumbent (A) and the candidate (B) run on the same requests in rounds ``A B A A``: the
first two runs form an A/B pair, the last two an A/A pair. Every pair gives a log throughput
ratio (second run over first); interleaving makes slow drifts (clocks, thermals, other tenants)
hit both arms alike, and the A/A pairs sit in the same order and conditions as the A/B pairs,
so they show how large a gain an unchanged system appears to have.

Decision rule, with the module constants below:

* gain = exp(mean A/B log ratio) - 1, and its one-sided 95% Student-t lower bound;
* noise = the run-to-run spread of the A/A pairs: the root-mean-square of the A/A log ratios,
  sqrt(mean(x^2)), i.e. how far one run of A lands from the run before it. It is the spread of
  one pair, not the standard error of their mean, so it does not shrink as pairs are added;
  it also holds any order bias (a second run that is always faster moves every A/A ratio);
* promote when lower bound > MIN_GAIN + NOISE_FACTOR * noise, where MIN_GAIN is 1%, or 3%
  when the candidate's outputs differ from the incumbent's (or cannot be compared).

The controller is the one part a proposer can never modify. Its thresholds are module
constants, not arguments: a candidate reaches it only as a ``Runner`` built from a config,
and the config is only recorded. Every run sample and every decision is appended to a JSONL
log that the controller never rewrites.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from spec_tuning.stats import RatioBound, ratio_lower_bound
from w12.errors import W12Error

ROUNDS = 20  # rounds of A B A A: 20 A/B pairs and 20 A/A pairs
WARMUP_RUNS = 1  # unmeasured runs of each arm before the first round
CONFIDENCE = 0.95  # one-sided level of the gain's lower bound
MIN_GAIN = 0.01  # the smallest gain worth promoting, identical outputs
MIN_GAIN_CHANGED_OUTPUT = 0.03  # the same when outputs differ from the incumbent's
NOISE_FACTOR = 2.0  # the lower bound must also clear this many noise units


@dataclass(frozen=True)
class RunSample:
    """One measured run over the request set."""

    tokens: int
    seconds: float
    output_digest: str | None = None  # hash of the generated ids; None: not comparable

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


class Runner(Protocol):
    """A system under test: serves the request set once and reports what it did."""

    def run(self, requests: Sequence) -> RunSample: ...


def digest_outputs(outputs: Sequence[Sequence[int]]) -> str:
    """A stable hash of generated token ids, for comparing outputs across runs."""
    h = hashlib.sha256()
    for ids in outputs:
        h.update(np.asarray(ids, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


@dataclass
class TimedRunner:
    """A Runner from ``generate(requests) -> list of generated id lists``, timed on the wall.

    ``sync`` runs before each clock read (``torch.cuda.synchronize`` on a GPU) so that queued
    device work is inside the measured interval.
    """

    generate: Callable[[Sequence], Sequence[Sequence[int]]]
    sync: Callable[[], None] = field(default=lambda: None)

    def run(self, requests: Sequence) -> RunSample:
        self.sync()
        start = time.perf_counter()
        outputs = self.generate(requests)
        self.sync()
        seconds = time.perf_counter() - start
        tokens = sum(len(ids) for ids in outputs)
        return RunSample(tokens, seconds, digest_outputs(outputs))


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    gain: RatioBound  # candidate over incumbent
    self_gain: RatioBound  # incumbent over itself (A/A)
    noise: float
    bar: float  # the lower bound had to exceed this
    outputs_differ: bool

    def to_dict(self) -> dict:
        return asdict(self)


def run_to_run_noise(aa_log_ratios) -> float:
    """Root-mean-square of the A/A log ratios: one run's distance from the run before it."""
    x = np.asarray(aa_log_ratios, dtype=np.float64)
    return float(np.sqrt(np.mean(x**2)))


def decide(ab_log_ratios, aa_log_ratios, *, outputs_differ: bool) -> Decision:
    """The decision rule on measured per-pair log ratios (pure; no running, no logging)."""
    gain = ratio_lower_bound(ab_log_ratios, CONFIDENCE)
    self_gain = ratio_lower_bound(aa_log_ratios, CONFIDENCE)
    noise = run_to_run_noise(aa_log_ratios)
    floor = MIN_GAIN_CHANGED_OUTPUT if outputs_differ else MIN_GAIN
    bar = floor + NOISE_FACTOR * noise
    promote = gain.lower > bar
    reason = (
        f"gain {100 * gain.gain:+.2f}%, lower bound {100 * gain.lower:+.2f}% "
        f"{'>' if promote else '<='} bar {100 * bar:.2f}% = {100 * floor:.0f}% + "
        f"{NOISE_FACTOR:g} x run-to-run noise {100 * noise:.2f}%"
        + (" (outputs differ)" if outputs_differ else "")
    )
    return Decision(promote, reason, gain, self_gain, noise, bar, outputs_differ)


class Controller:
    """Runs the paired experiment and appends samples and the decision to a JSONL log."""

    def __init__(self, log_path: str | Path):
        self.log_path = Path(log_path)

    def _append(self, record: Mapping) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as f:  # append-only, never rewritten
            f.write(json.dumps(record, sort_keys=True, default=str) + "\n")

    def _measure(self, runner: Runner, requests, decision_id: str, arm: str, rnd: int,
                 slot: int) -> RunSample:
        sample = runner.run(requests)
        if sample.tokens <= 0 or not sample.seconds > 0:
            raise W12Error(f"controller: {arm} run in round {rnd} reported {sample.tokens} "
                           f"tokens in {sample.seconds} s")
        self._append({"kind": "sample", "decision_id": decision_id, "arm": arm, "round": rnd,
                      "slot": slot, "tokens": sample.tokens, "seconds": sample.seconds,
                      "throughput": sample.throughput, "output_digest": sample.output_digest,
                      "time": time.time()})
        return sample

    def compare(self, incumbent: Runner, candidate: Runner, requests: Sequence, *,
                candidate_config: Mapping) -> Decision:
        """Measure ``candidate`` against ``incumbent`` and decide; ``candidate_config`` is
        recorded, never interpreted."""
        decision_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        for i in range(WARMUP_RUNS):
            self._measure(incumbent, requests, decision_id, "warmup-A", -1, 2 * i)
            self._measure(candidate, requests, decision_id, "warmup-B", -1, 2 * i + 1)
        ab, aa, digests_a, digests_b = [], [], set(), set()
        for rnd in range(ROUNDS):
            runs = [(incumbent, "A"), (candidate, "B"), (incumbent, "A"), (incumbent, "A")]
            s = [self._measure(r, requests, decision_id, arm, rnd, slot)
                 for slot, (r, arm) in enumerate(runs)]
            ab.append(math.log(s[1].throughput / s[0].throughput))
            aa.append(math.log(s[3].throughput / s[2].throughput))
            digests_a.update(x.output_digest for x in (s[0], s[2], s[3]))
            digests_b.add(s[1].output_digest)
        outputs_differ = None in (digests_a | digests_b) or not digests_b <= digests_a
        decision = decide(ab, aa, outputs_differ=outputs_differ)
        self._append({"kind": "decision", "decision_id": decision_id, "time": time.time(),
                      "candidate_config": dict(candidate_config),
                      "rules": rule_constants(), **decision.to_dict()})
        return decision


def rule_constants() -> dict:
    """The fixed thresholds, recorded with every decision."""
    return {"rounds": ROUNDS, "warmup_runs": WARMUP_RUNS, "confidence": CONFIDENCE,
            "min_gain": MIN_GAIN, "min_gain_changed_output": MIN_GAIN_CHANGED_OUTPUT,
            "noise_factor": NOISE_FACTOR}


def read_log(log_path: str | Path) -> list[dict]:
    """All records of a controller log, oldest first."""
    path = Path(log_path)
    if not path.exists():
        raise W12Error(f"{path}: controller log not found")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise W12Error(f"{path}:{n}: not a JSON record ({exc.msg})") from None
    return records
