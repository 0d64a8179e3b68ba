"""Paired-run controller: promotion rule, fixed thresholds, append-only JSON log."""

import inspect
import json

import numpy as np
import pytest

from spec_tuning import controller as ctl
from spec_tuning.controller import Controller, RunSample, TimedRunner, decide, read_log
from spec_tuning.simulate import SimulatedRunner, paired_log_ratios
from spec_tuning.stats import rate_tolerance
from w12.errors import W12Error

REQUESTS = [{"id": i} for i in range(4)]


def _compare(tmp_path, gain, noise=0.005, digest="same", seed=0):
    incumbent = SimulatedRunner(1000.0, noise, seed=seed)
    candidate = SimulatedRunner(1000.0 * (1 + gain), noise, seed=seed + 1, output_digest=digest)
    return Controller(tmp_path / "log.jsonl").compare(
        incumbent, candidate, REQUESTS, candidate_config={"tree": "8x4", "gain": gain})


def test_clear_gain_is_promoted(tmp_path):
    d = _compare(tmp_path, 0.05)
    assert d.promote, d.reason
    assert d.gain.lower > ctl.MIN_GAIN and not d.outputs_differ


def test_gain_below_floor_is_not_promoted(tmp_path):
    d = _compare(tmp_path, 0.005)
    assert not d.promote, d.reason


def test_changed_outputs_demand_three_percent(tmp_path):
    same = _compare(tmp_path, 0.025, noise=0.002)
    changed = _compare(tmp_path, 0.025, noise=0.002, digest="other")
    assert same.promote and not changed.promote
    assert changed.outputs_differ and changed.bar >= ctl.MIN_GAIN_CHANGED_OUTPUT
    assert _compare(tmp_path, 0.06, noise=0.002, digest="other").promote


def test_noise_is_the_run_to_run_spread_and_does_not_shrink_with_rounds():
    """Two runs of one system 0.5% apart, read over 20 or 2000 A/A pairs: the same noise
    (about sqrt(2) x 0.5%), while the standard error of the A/A mean falls tenfold."""
    rng = np.random.default_rng(3)
    few = paired_log_ratios(rng, sims=1, pairs=20, gain=0.0, noise=0.005)[0]
    many = paired_log_ratios(rng, sims=1, pairs=2000, gain=0.0, noise=0.005)[0]
    ab = np.full(20, np.log(1.02))
    d_few = decide(ab, few, outputs_differ=False)
    d_many = decide(ab, many, outputs_differ=False)
    assert d_many.noise == pytest.approx(0.005 * np.sqrt(2), rel=0.05)
    assert d_few.noise == pytest.approx(d_many.noise, rel=0.4)
    assert d_many.self_gain.log_std_error < d_few.self_gain.log_std_error / 5
    assert not d_many.promote  # 2% is inside 1% + 2 x 0.7%: the bar did not fall with rounds


def test_unknown_outputs_count_as_changed(tmp_path):
    assert _compare(tmp_path, 0.025, digest=None).outputs_differ


def test_log_is_append_only_jsonl(tmp_path):
    first = _compare(tmp_path, 0.05)
    lines_after_first = (tmp_path / "log.jsonl").read_text().splitlines()
    _compare(tmp_path, 0.0)
    records = read_log(tmp_path / "log.jsonl")
    assert records[: len(lines_after_first)] == [json.loads(x) for x in lines_after_first]
    decisions = [r for r in records if r["kind"] == "decision"]
    samples = [r for r in records if r["kind"] == "sample"]
    assert [d["promote"] for d in decisions] == [first.promote, False]
    assert len(samples) == 2 * (4 * ctl.ROUNDS + 2 * ctl.WARMUP_RUNS)
    assert decisions[0]["candidate_config"] == {"tree": "8x4", "gain": 0.05}
    assert decisions[0]["rules"]["min_gain"] == ctl.MIN_GAIN
    ids = {r["decision_id"] for r in records}
    assert len(ids) == 2


def test_thresholds_are_not_parameters():
    """A candidate reaches the controller only as a runner and a config that is recorded."""
    names = set(inspect.signature(Controller.compare).parameters)
    names |= set(inspect.signature(Controller.__init__).parameters)
    names |= set(inspect.signature(decide).parameters)
    assert names == {"self", "incumbent", "candidate", "requests", "candidate_config",
                     "log_path", "ab_log_ratios", "aa_log_ratios", "outputs_differ"}


def test_bad_sample_is_a_user_error(tmp_path):
    class Broken:
        def run(self, requests):
            return RunSample(tokens=0, seconds=1.0)

    with pytest.raises(W12Error, match="reported 0 tokens"):
        Controller(tmp_path / "log.jsonl").compare(Broken(), Broken(), REQUESTS,
                                                   candidate_config={})


def test_timed_runner_digests_outputs():
    runner = TimedRunner(lambda reqs: [[1, 2, 3] for _ in reqs])
    a, b = runner.run(REQUESTS), runner.run(REQUESTS)
    assert a.tokens == 12 and a.seconds > 0
    assert a.output_digest == b.output_digest
    other = TimedRunner(lambda reqs: [[1, 2, 4] for _ in reqs]).run(REQUESTS)
    assert other.output_digest != a.output_digest


@pytest.mark.parametrize("gain,noise,differ", [
    (ctl.MIN_GAIN, 0.005, False), (ctl.MIN_GAIN, 0.03, False),
    (ctl.MIN_GAIN_CHANGED_OUTPUT, 0.01, True)])
def test_false_promotion_rate_at_the_floor(gain, noise, differ):
    """A candidate exactly at the floor must be promoted at most 5% of the time."""
    sims = 3000
    rng = np.random.default_rng(17)
    ab = paired_log_ratios(rng, sims=sims, pairs=ctl.ROUNDS, gain=gain, noise=noise)
    aa = paired_log_ratios(rng, sims=sims, pairs=ctl.ROUNDS, gain=0.0, noise=noise)
    promoted = np.mean([decide(x, y, outputs_differ=differ).promote
                        for x, y in zip(ab, aa, strict=True)])
    assert promoted <= 1 - ctl.CONFIDENCE + rate_tolerance(1 - ctl.CONFIDENCE, sims)


def test_order_bias_seen_in_aa_pairs_raises_the_bar():
    rng = np.random.default_rng(2)
    ab = paired_log_ratios(rng, sims=1, pairs=ctl.ROUNDS, gain=0.03, noise=0.002)[0]
    aa_fair = paired_log_ratios(rng, sims=1, pairs=ctl.ROUNDS, gain=0.0, noise=0.002)[0]
    # The second run of a pair is always 2% faster, in A/A as in A/B.
    assert decide(ab, aa_fair, outputs_differ=False).promote
    assert not decide(ab, aa_fair + np.log(1.02), outputs_differ=False).promote
