"""Token forcing on a simulated model: accepts lossless systems, catches planted defects.

Sizes are the command line's defaults: 32 judged prompts x 128 tokens, 8 calibration prompts.
"""

import numpy as np
import pytest
import torch

from spec_tuning.forcing import (
    ALPHA,
    DELTA_QUANTUM,
    Calibration,
    ForcedTrace,
    LogitsScorer,
    NearTieSwap,
    PlantedDefect,
    Reference,
    build_reference,
    calibrate,
    evaluate,
    judge,
    run_forced,
    top1_and_margin,
)
from spec_tuning.simulate import SimulatedLM, SimulatedSystem
from spec_tuning.stats import rate_tolerance
from w12.errors import W12Error

PROMPTS, CALIBRATION_PROMPTS, NEW_TOKENS, NOISE = 32, 8, 128, 0.02


@pytest.fixture(scope="module")
def lm():
    return SimulatedLM(seed=0)


@pytest.fixture(scope="module")
def reference(lm):
    bf16 = SimulatedSystem(lm, noise=0.0, seed=0)
    return build_reference(bf16, lm.random_prompts(PROMPTS, 8, seed=1), NEW_TOKENS)


@pytest.fixture(scope="module")
def calibration(lm):
    bf16 = SimulatedSystem(lm, noise=0.0, seed=0)
    return build_reference(bf16, lm.random_prompts(CALIBRATION_PROMPTS, 8, seed=2), NEW_TOKENS)


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


def test_w12_like_system_is_accepted(lm, calibration, reference, stock):
    """Same weights, different kernel numerics: the noise of another reduction order."""
    w12 = SimulatedSystem(lm, noise=NOISE, seed=12)
    verdict = evaluate(calibration, reference, stock, w12)
    assert verdict.accepted, verdict.report()
    assert verdict.stock_rate.rate > 0  # the comparison is not vacuous


@pytest.mark.parametrize("start", [0, 64, 120])
def test_planted_defect_is_rejected(lm, calibration, reference, stock, start):
    defective = SimulatedSystem(lm, noise=NOISE, seed=12, transforms=(PlantedDefect(start),))
    verdict = evaluate(calibration, reference, stock, defective)
    assert not verdict.accepted
    assert verdict.margin_p_holm < ALPHA
    assert verdict.audit and all(e.position >= start for e in verdict.audit)
    margins = [e.reference_margin for e in verdict.audit]
    assert margins == sorted(margins, reverse=True)
    assert min(margins) > 2 * verdict.delta


def test_late_defect_is_caught_by_the_margin_rule_alone(lm, calibration, reference, stock):
    """Two defective positions per prompt barely move the rate, but flip confident tokens."""
    defective = SimulatedSystem(lm, noise=NOISE, seed=12, transforms=(PlantedDefect(126),))
    verdict = evaluate(calibration, reference, stock, defective)
    assert verdict.mismatch_p_holm >= ALPHA  # the rate rule alone would let it through
    assert not verdict.accepted and verdict.margin_p_holm < ALPHA


def test_near_tie_swap_is_caught_by_the_mismatch_rule(lm, calibration, reference, stock):
    """Swapping near-ties (below 2*delta, so no event) flips many tokens."""
    defective = SimulatedSystem(lm, noise=NOISE, seed=12, transforms=(NearTieSwap(0.2),))
    verdict = evaluate(calibration, reference, stock, defective)
    assert 2 * verdict.delta >= 0.2
    assert not verdict.accepted and verdict.mismatch_p_holm < ALPHA


def test_near_tie_swap_numpy_and_torch_agree_and_leave_input_alone():
    logits = np.array([[1.0, 3.0, 2.9, 0.0], [5.0, 1.0, 2.0, 4.0], [2.0, 2.0, 0.0, 1.0]])
    before = logits.copy()
    swap = NearTieSwap(0.25)
    out = swap(logits, np.arange(3))
    np.testing.assert_array_equal(logits, before)
    expected = before.copy()
    expected[0, 1], expected[0, 2] = 2.9, 3.0  # a gap of 0.1: swapped; 1.0 and a tie: not
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(swap(torch.from_numpy(before), torch.arange(3)).numpy(),
                                  expected)


def test_delta_is_a_quantile_of_the_stocks_margin_noise_where_it_agrees():
    ref = Reference([np.zeros(1, int)] * 2, [np.arange(400), np.arange(400)],
                    [np.full(400, 3.0), np.full(400, 3.0)])
    noise = np.zeros(400)
    noise[:2] = 0.6  # two large deviations in 800 positions: above the 0.999 quantile
    noise[2:100] = 0.3
    ids = np.arange(400)
    wrong = ids.copy()
    wrong[399] = -1  # a mismatch: its margin (far off) must not count
    stock = ForcedTrace([ids, wrong], [3.0 + noise, 3.0 - noise + np.eye(400)[399] * 9])
    cal = calibrate(ref, stock)
    assert cal.positions == 799 and cal.noise_quantile == pytest.approx(0.6, abs=0.31)
    assert cal.delta == np.ceil(cal.noise_quantile / DELTA_QUANTUM) * DELTA_QUANTUM
    exact = calibrate(ref, ForcedTrace([ids, ids], [np.full(400, 3.0)] * 2))
    assert exact.delta == DELTA_QUANTUM  # never zero: a near-tie is never an event


def test_delta_does_not_depend_on_the_judged_prompts(lm, calibration, reference, stock):
    cal = calibrate(calibration, run_forced(stock, calibration))
    trace = run_forced(stock, reference)
    few = Reference(reference.prompts[:4], reference.tokens[:4], reference.margins[:4])
    few_trace = ForcedTrace(trace.top1[:4], trace.margins[:4])
    assert judge(few, few_trace, few_trace, cal).delta == judge(reference, trace, trace,
                                                               cal).delta == cal.delta


def test_misaligned_trace_is_a_user_error(reference, stock):
    trace = run_forced(stock, reference)
    short = ForcedTrace([t[:-1] for t in trace.top1], trace.margins)
    with pytest.raises(W12Error, match="prompt 0 has 127 positions"):
        judge(reference, trace, short, Calibration(0.25, 0.2, 8, 1000))


def test_few_extra_mismatches_never_give_certainty():
    """One extra mismatch in each of two 128-token prompts, a stock with none: the exact
    binomial probability of that much excess at the 0.5 pp boundary is about 0.37."""
    ref = Reference([np.zeros(1, int)] * 2, [np.arange(128)] * 2, [np.full(128, 0.1)] * 2)
    stock = ForcedTrace([np.arange(128)] * 2, [np.full(128, 0.1)] * 2)
    flipped = np.arange(128)
    flipped[50] = -1
    cand = ForcedTrace([flipped, flipped], [np.full(128, 0.1)] * 2)
    verdict = judge(ref, stock, cand, Calibration(0.25, 0.2, 8, 1000))
    assert verdict.accepted and verdict.mismatch_p == pytest.approx(0.365, abs=0.01)


def test_simulated_trace_is_run_forced(lm, reference, stock):
    batched, one_by_one = stock.trace(reference), run_forced(stock, reference)
    for a, b in zip(batched.top1, one_by_one.top1, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(batched.margins, one_by_one.margins, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-9)


def test_false_reject_rate_of_lossless_candidates(lm, calibration, reference):
    """Many independent stock/candidate pairs with the same numerics noise, at the command
    line's sample size: the two rules together (Holm) reject at most ALPHA of them, up to the
    simulation's own error (``rate_tolerance``: 3 binomial standard errors, 4.6 pp at 200
    trials)."""
    trials = 200
    rejects = 0
    for k in range(trials):
        stock = SimulatedSystem(lm, noise=NOISE, seed=1000 + 2 * k)
        cand = SimulatedSystem(lm, noise=NOISE, seed=1001 + 2 * k)
        delta = calibrate(calibration, stock.trace(calibration))
        rejects += not judge(reference, stock.trace(reference), cand.trace(reference),
                             delta).accepted
    assert rejects / trials <= ALPHA + rate_tolerance(ALPHA, trials)
