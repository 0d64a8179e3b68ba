"""Token forcing on a simulated model: accepts lossless systems, catches a planted defect."""

import numpy as np
import pytest
import torch

from spec_tuning.forcing import (
    ALPHA,
    ForcedTrace,
    LogitsScorer,
    PlantedDefect,
    Reference,
    build_reference,
    evaluate,
    judge,
    run_forced,
    stock_delta,
    top1_and_margin,
)
from spec_tuning.simulate import SimulatedLM, SimulatedSystem
from spec_tuning.stats import rate_tolerance
from w12.errors import W12Error

PROMPTS, NEW_TOKENS, NOISE = 32, 128, 0.02


@pytest.fixture(scope="module")
def lm():
    return SimulatedLM(seed=0)


@pytest.fixture(scope="module")
def reference(lm):
    bf16 = SimulatedSystem(lm, noise=0.0, seed=0)
    return build_reference(bf16, lm.random_prompts(PROMPTS, 8, seed=1), NEW_TOKENS)


@pytest.fixture(scope="module")
def stock(lm):
    return SimulatedSystem(lm, noise=NOISE, seed=11)


def test_simulated_model_has_near_ties(reference):
    margins = np.concatenate(reference.margins)
    assert (margins < 0.05).mean() > 0.01  # otherwise nothing could ever flip
    assert len(np.unique(np.concatenate(reference.tokens))) > 100


def test_planted_defect_numpy_and_torch_agree_and_leave_input_alone():
    logits = np.random.default_rng(0).standard_normal((6, 30))
    before = logits.copy()
    defect = PlantedDefect(start=2)
    out = defect(logits, np.arange(6))
    np.testing.assert_array_equal(logits, before)
    expected = before.copy()
    expected[2:, 0::7] += 2.0
    np.testing.assert_array_equal(out, expected)
    out_t = defect(torch.from_numpy(before), torch.arange(6))
    np.testing.assert_array_equal(out_t.numpy(), expected)


def test_top1_and_margin_ties_and_torch_path():
    logits = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 4.5]])
    ids, margins = top1_and_margin(logits)
    assert ids.tolist() == [1, 0]
    np.testing.assert_allclose(margins, [0.0, 0.5])
    ids_t, margins_t = top1_and_margin(torch.from_numpy(logits))
    assert ids_t.tolist() == [1, 0]
    np.testing.assert_allclose(margins_t, [0.0, 0.5])


def test_logits_scorer_applies_transforms_like_the_system(lm, reference, stock):
    defect = PlantedDefect(start=40)
    direct = SimulatedSystem(lm, noise=NOISE, seed=11, transforms=(defect,))
    wrapped = LogitsScorer(lambda p, f: stock._logits(lm.states(np.asarray(p), np.asarray(f)),
                                                      np.arange(len(f))), (defect,))
    a, b = run_forced(direct, reference), run_forced(wrapped, reference)
    for x, y in zip(a.top1, b.top1, strict=True):
        np.testing.assert_array_equal(x, y)


def test_identical_system_is_accepted(reference, stock):
    verdict = evaluate(reference, stock, stock)
    assert verdict.accepted, verdict.report()
    assert verdict.excess == 0.0 and verdict.candidate_only_events == 0


def test_w12_like_system_is_accepted(lm, reference, stock):
    """Same weights, different kernel numerics: the noise of another reduction order."""
    w12 = SimulatedSystem(lm, noise=NOISE, seed=12)
    verdict = evaluate(reference, stock, w12)
    assert verdict.accepted, verdict.report()
    assert verdict.stock_rate.rate > 0  # the comparison is not vacuous


@pytest.mark.parametrize("start", [0, 64, 120])
def test_planted_defect_is_rejected(lm, reference, stock, start):
    defective = SimulatedSystem(lm, noise=NOISE, seed=12, transforms=(PlantedDefect(start),))
    verdict = evaluate(reference, stock, defective)
    assert not verdict.accepted
    assert verdict.margin_p < ALPHA
    assert verdict.audit and all(e.position >= start for e in verdict.audit)
    margins = [e.reference_margin for e in verdict.audit]
    assert margins == sorted(margins, reverse=True)
    assert min(margins) > 2 * verdict.delta


def test_late_defect_is_caught_by_the_margin_rule_alone(lm, reference, stock):
    """Two defective positions per prompt barely move the rate, but flip confident tokens."""
    defective = SimulatedSystem(lm, noise=NOISE, seed=12, transforms=(PlantedDefect(126),))
    verdict = evaluate(reference, stock, defective)
    assert verdict.mismatch_p >= ALPHA  # the rate rule alone would let it through
    assert not verdict.accepted and verdict.margin_p < ALPHA


def test_delta_is_largest_first_divergence_margin_rounded_up():
    ref = Reference([np.zeros(1, int)] * 2, [np.array([1, 2, 3]), np.array([4, 5, 6])],
                    [np.array([0.30, 0.9, 0.4]), np.array([0.01, 2.0, 0.05])])
    stock = ForcedTrace([np.array([1, 9, 9]), np.array([4, 5, 6])], [np.zeros(3)] * 2)
    assert stock_delta(ref, stock) == 1.0  # first divergence of prompt 0 at margin 0.9
    stock = ForcedTrace([np.array([1, 2, 3]), np.array([4, 5, 0])], [np.zeros(3)] * 2)
    assert stock_delta(ref, stock) == 0.125
    exact = ForcedTrace([np.array([1, 2, 3]), np.array([4, 5, 6])], [np.zeros(3)] * 2)
    assert stock_delta(ref, exact) == 0.0


def test_misaligned_trace_is_a_user_error(reference, stock):
    trace = run_forced(stock, reference)
    short = ForcedTrace([t[:-1] for t in trace.top1], trace.margins)
    with pytest.raises(W12Error, match="prompt 0 has 127 positions"):
        judge(reference, trace, short)


def test_false_reject_rate_of_lossless_candidates(lm, reference):
    """Many independent stock/candidate pairs with the same numerics noise: few rejects."""
    trials = 150
    rejects = 0
    for k in range(trials):
        stock = SimulatedSystem(lm, noise=NOISE, seed=1000 + 2 * k)
        cand = SimulatedSystem(lm, noise=NOISE, seed=1001 + 2 * k)
        rejects += not evaluate(reference, stock, cand).accepted
    assert rejects / trials <= ALPHA + rate_tolerance(ALPHA, trials)
