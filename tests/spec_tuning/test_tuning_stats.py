"""The statistical rules keep their false-reject rate at or below the nominal level."""

import numpy as np
import pytest
from scipy import stats as sps

from spec_tuning.forcing import ALPHA as FAMILY_ALPHA
from spec_tuning.forcing import MISMATCH_MARGIN
from spec_tuning.simulate import clustered_paired_counts, paired_log_ratios
from spec_tuning.stats import (
    binomial_excess_p,
    binomial_floor_p,
    clopper_pearson,
    cluster_rate,
    holm,
    paired_excess_arrays,
    paired_excess_test,
    rate_tolerance,
    ratio_lower_bound,
)
from w12.errors import W12Error

ALPHA = 0.05
MARGIN = 0.005


def test_clopper_pearson_matches_beta_quantiles():
    low, high = clopper_pearson(3, 50, 0.95)
    assert low == pytest.approx(sps.beta.ppf(0.025, 3, 48))
    assert high == pytest.approx(sps.beta.ppf(0.975, 4, 47))
    assert clopper_pearson(0, 10, 0.95)[0] == 0.0
    assert clopper_pearson(10, 10, 0.95)[1] == 1.0


def test_cluster_rate_interval_never_narrower_than_exact():
    counts, sizes = np.array([0, 0, 0, 0]), np.array([100, 100, 100, 100])
    r = cluster_rate(counts, sizes)
    assert r.rate == 0.0 and r.low == 0.0
    assert r.high == pytest.approx(clopper_pearson(0, 400, 0.95)[1])
    bursty = cluster_rate(np.array([0, 0, 0, 40]), sizes)
    assert bursty.high > clopper_pearson(40, 400, 0.95)[1]  # clustering widens it


def test_excess_test_needs_two_prompts():
    with pytest.raises(W12Error, match="at least 2 prompts"):
        paired_excess_test([3], [1], [100], margin=MARGIN, alpha=ALPHA)


def test_zero_standard_error_keeps_the_exact_binomial_p_value():
    # every prompt one extra mismatch: the cluster standard error is zero
    t = paired_excess_test([1, 1], [0, 0], [128, 128], margin=MARGIN, alpha=ALPHA)
    assert t.std_error == 0.0 and not t.reject
    assert t.p_value == pytest.approx(sps.binom.sf(1, 256, MARGIN))
    assert t.lower < MARGIN  # the bound does not claim what the test cannot
    many = paired_excess_test([9] * 16, [0] * 16, [128] * 16, margin=MARGIN, alpha=ALPHA)
    assert many.reject and many.p_value == pytest.approx(binomial_floor_p(144, 2048, MARGIN))


def test_holm_adjusts_the_smaller_p_value_twice():
    np.testing.assert_allclose(holm([0.01, 0.04]), [0.02, 0.04])
    np.testing.assert_allclose(holm([0.04, 0.03]), [0.06, 0.06])
    np.testing.assert_allclose(holm([0.9, 0.001]), [0.9, 0.002])


# (prompts, positions per prompt, difficulty dispersion, mean mismatch run length)
CLUSTERINGS = [(32, 128, 0.0, 1.0), (32, 128, 1.0, 4.0), (8, 256, 1.0, 4.0), (64, 64, 2.0, 8.0)]


@pytest.mark.parametrize("prompts,positions,dispersion,burst", CLUSTERINGS,
                         ids=lambda v: str(v))
def test_mismatch_rule_false_reject_rate_at_h0_boundary(prompts, positions, dispersion, burst):
    sims = 20000
    rng = np.random.default_rng(1234)
    cand, stock = clustered_paired_counts(
        rng, sims=sims, prompts=prompts, positions=positions, stock_rate=0.01, excess=MARGIN,
        shared_rate=0.003, dispersion=dispersion, burst=burst)
    reject = paired_excess_arrays(cand, stock, positions, margin=MARGIN, alpha=ALPHA)[4]
    assert reject.mean() <= ALPHA + rate_tolerance(ALPHA, sims)


def test_position_level_test_would_over_reject_bursty_mismatches():
    """Why the rule clusters by prompt: treating positions as independent fails here."""
    sims, prompts, positions = 4000, 32, 128
    rng = np.random.default_rng(7)
    cand, stock = clustered_paired_counts(
        rng, sims=sims, prompts=prompts, positions=positions, stock_rate=0.01, excess=MARGIN,
        burst=4.0)
    n = prompts * positions
    diff = (cand - stock).sum(-1) / n
    discordant = (cand + stock).sum(-1) / n  # no shared mismatches simulated
    z = (diff - MARGIN) / np.sqrt((discordant - diff**2) / n)
    assert (z > sps.norm.ppf(1 - ALPHA)).mean() > 2 * ALPHA


def test_mismatch_rule_detects_a_large_excess():
    rng = np.random.default_rng(3)
    cand, stock = clustered_paired_counts(
        rng, sims=2000, prompts=64, positions=256, stock_rate=0.01, excess=0.02)
    assert paired_excess_arrays(cand, stock, 256, margin=MARGIN, alpha=ALPHA)[4].mean() > 0.95


@pytest.mark.parametrize("rate", [0.5, 3.0, 20.0])
def test_margin_rule_false_reject_rate_with_equal_event_rates(rate):
    sims = 20000
    rng = np.random.default_rng(99)
    only_cand, only_stock = rng.poisson(rate, sims), rng.poisson(rate, sims)
    reject = binomial_excess_p(only_cand, only_stock) < ALPHA
    assert reject.mean() <= ALPHA + rate_tolerance(ALPHA, sims)


def test_margin_rule_exact_values():
    assert binomial_excess_p(0, 0) == 1.0
    assert binomial_excess_p(5, 0) == pytest.approx(1 / 32)
    assert binomial_excess_p(1, 1) == pytest.approx(0.75)


def test_ratio_lower_bound_coverage():
    sims, gain = 20000, 0.01
    rng = np.random.default_rng(5)
    ratios = paired_log_ratios(rng, sims=sims, pairs=12, gain=gain, noise=0.01)
    above = np.array([ratio_lower_bound(r, 0.95).lower > gain for r in ratios])
    assert above.mean() <= ALPHA + rate_tolerance(ALPHA, sims)
    assert above.mean() >= ALPHA - rate_tolerance(ALPHA, sims)  # exact, not just conservative


# The command line's default sample: 32 judged prompts x 128 tokens.
CLI_PROMPTS, CLI_TOKENS = 32, 128


def _mismatch_rejects(rng, excess, *, dispersion, burst, sims=4000):
    """Rejections of the mismatch rule at the family level it gets from Holm when the other
    rule shows nothing (the adjusted p-value is twice its own)."""
    cand, stock = clustered_paired_counts(
        rng, sims=sims, prompts=CLI_PROMPTS, positions=CLI_TOKENS, stock_rate=0.01,
        excess=excess, shared_rate=0.003, dispersion=dispersion, burst=burst)
    p = paired_excess_arrays(cand, stock, CLI_TOKENS, margin=MISMATCH_MARGIN,
                             alpha=FAMILY_ALPHA)[3]
    return np.minimum(1.0, 2 * p) < FAMILY_ALPHA


@pytest.mark.parametrize("dispersion,burst", [(0.0, 1.0), (1.0, 4.0)])
def test_mismatch_rule_at_the_cli_sample_size_false_rejects_and_power(dispersion, burst):
    """At the boundary (0.5 pp) a lossless-by-the-rule candidate is rejected at most 5% of
    the time; the power grows with the excess (1 and 2 pp over the stock: the notebook
    records the measured values)."""
    rng = np.random.default_rng(31)
    at_boundary = _mismatch_rejects(rng, MISMATCH_MARGIN, dispersion=dispersion, burst=burst)
    one_point = _mismatch_rejects(rng, 0.01, dispersion=dispersion, burst=burst)
    two_points = _mismatch_rejects(rng, 0.02, dispersion=dispersion, burst=burst)
    assert at_boundary.mean() <= FAMILY_ALPHA + rate_tolerance(FAMILY_ALPHA, at_boundary.size)
    assert at_boundary.mean() < one_point.mean() < two_points.mean()
    if dispersion == 0.0:  # independent positions: a 1-point excess is found often
        assert one_point.mean() >= 0.4 and two_points.mean() >= 0.95
