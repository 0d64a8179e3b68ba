"""Statistics shared by the tuning judges: rates, paired excess tests, ratio bounds.

Every function here takes its levels and margins as arguments so that simulations can probe
them; the judges (:mod:`spec_tuning.forcing`, :mod:`spec_tuning.controller`) bind them to
module constants. The tests that matter run on many simulated experiments at once, so the
core functions accept a leading batch axis and work on the last axis.

Clustering: positions inside one prompt are not independent (a hard passage produces several
near-ties in a row, repetition repeats a state), so rates and differences are ratio estimators
over prompts with a cluster-robust standard error and Student-t quantiles with J-1 degrees of
freedom (J prompts), not binomial formulas over positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from w12.errors import W12Error


@dataclass(frozen=True)
class RateEstimate:
    """A rate with a two-sided confidence interval."""

    rate: float
    low: float
    high: float
    count: int
    total: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ExcessTest:
    """One-sided test of H0: rate_a - rate_b <= margin on paired, clustered positions."""

    excess: float  # estimated rate_a - rate_b
    std_error: float
    lower: float  # one-sided lower confidence bound of the excess
    p_value: float
    reject: bool

    def to_dict(self) -> dict:
        return asdict(self)


def clopper_pearson(count: int, total: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided binomial interval for ``count`` successes in ``total`` trials."""
    if total <= 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if count == 0 else float(sps.beta.ppf(tail, count, total - count + 1))
    high = 1.0 if count == total else float(sps.beta.ppf(1.0 - tail, count + 1, total - count))
    return low, high


def _check_clusters(sizes: np.ndarray) -> None:
    if sizes.shape[-1] < 2:
        raise W12Error(f"need at least 2 prompts for a clustered test, got {sizes.shape[-1]}")
    if np.any(sizes.sum(axis=-1) <= 0):
        raise W12Error("clustered test: the prompts hold no scored positions")


def _cluster_se(diffs: np.ndarray, sizes: np.ndarray, estimate: np.ndarray) -> np.ndarray:
    """Cluster-robust (CR1) standard error of a ratio estimator sum(diffs) / sum(sizes)."""
    clusters = diffs.shape[-1]
    resid = diffs - estimate[..., None] * sizes
    total = sizes.sum(axis=-1)
    var = clusters / (clusters - 1) * (resid**2).sum(axis=-1) / total**2
    return np.sqrt(var)


def cluster_rate(counts, sizes, confidence: float = 0.95) -> RateEstimate:
    """Rate of events over clustered positions with a two-sided interval.

    The interval is the cluster-robust t interval widened to contain the exact binomial one,
    so it is never narrower than the independent-positions answer (which matters at rates near
    zero, where the cluster standard error collapses).
    """
    counts = np.asarray(counts, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    _check_clusters(sizes)
    total = sizes.sum()
    rate = counts.sum() / total
    se = float(_cluster_se(counts, sizes, np.asarray(rate)))
    half = float(sps.t.ppf(0.5 + confidence / 2.0, sizes.size - 1)) * se
    exact_low, exact_high = clopper_pearson(int(counts.sum()), int(total), confidence)
    low = max(0.0, min(rate - half, exact_low))
    high = min(1.0, max(rate + half, exact_high))
    return RateEstimate(float(rate), low, high, int(counts.sum()), int(total))


def paired_excess_arrays(counts_a, counts_b, sizes, *, margin: float, alpha: float):
    """Vectorised core of :func:`paired_excess_test`: returns (excess, se, lower, p, reject).

    ``counts_a``/``counts_b`` are per-prompt event counts of two systems on the *same*
    positions, ``sizes`` the per-prompt number of positions; all share shape (..., J).
    Positions where both systems agree cancel in the per-prompt difference, so only the
    discordant positions carry information (the paired, McNemar-like part); the variance comes
    from the spread of per-prompt differences (the clustered part).
    """
    a = np.asarray(counts_a, dtype=np.float64)
    b = np.asarray(counts_b, dtype=np.float64)
    sizes = np.broadcast_to(np.asarray(sizes, dtype=np.float64), a.shape)
    _check_clusters(sizes)
    diffs = a - b
    excess = diffs.sum(axis=-1) / sizes.sum(axis=-1)
    se = _cluster_se(diffs, sizes, excess)
    dof = sizes.shape[-1] - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        t_stat = (excess - margin) / se
    t_stat = np.where(se > 0, t_stat, np.where(excess > margin, np.inf, -np.inf))
    # The t statistic is only as good as its standard error, which is zero (or nearly) when
    # every prompt shows the same difference, as with a stock that never mismatches. The exact
    # binomial answer for the net excess count is a floor under the p-value and a cap on the
    # lower bound, so a few extra mismatches never read as certainty.
    net, total = diffs.sum(axis=-1), sizes.sum(axis=-1)
    p_value = np.maximum(sps.t.sf(t_stat, dof), binomial_floor_p(net, total, margin))
    lower = np.minimum(excess - sps.t.ppf(1.0 - alpha, dof) * se,
                       binomial_lower_rate(net, total, alpha))
    return excess, se, lower, p_value, p_value < alpha


def binomial_floor_p(net, total, margin: float):
    """P(Binomial(total, margin) >= net): the p-value of ``net`` excess events in ``total``
    positions when the excess rate is exactly ``margin`` and the other system has none."""
    net = np.ceil(np.asarray(net, dtype=np.float64))
    return np.where(net > 0, sps.binom.sf(net - 1, total, margin), 1.0)


def binomial_lower_rate(net, total, alpha: float):
    """One-sided exact (Clopper-Pearson) lower bound of the rate of ``net`` events in
    ``total`` positions (+inf for no excess, leaving the other bound to decide)."""
    net = np.asarray(net, dtype=np.float64)
    safe = np.clip(net, 1.0, None)
    low = sps.beta.ppf(alpha, safe, np.asarray(total, dtype=np.float64) - safe + 1)
    return np.where(net > 0, low, np.inf)


def holm(p_values) -> np.ndarray:
    """Holm-adjusted p-values of one family of tests: rejecting each hypothesis whose adjusted
    p-value is below alpha keeps the family-wise error at alpha."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (p.size - np.arange(p.size)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.maximum.accumulate(scaled)
    return adjusted


def paired_excess_test(counts_a, counts_b, sizes, *, margin: float, alpha: float) -> ExcessTest:
    """One-sided clustered paired test of H0: rate_a - rate_b <= margin (reject: a is worse)."""
    excess, se, lower, p_value, reject = paired_excess_arrays(
        counts_a, counts_b, sizes, margin=margin, alpha=alpha
    )
    return ExcessTest(float(excess), float(se), float(lower), float(p_value), bool(reject))


def binomial_excess_p(only_a, only_b):
    """Exact one-sided p-value that system a has more events than b on discordant positions.

    Conditional on ``only_a + only_b`` positions where exactly one system has an event, H0
    (equal event probability at every position) makes ``only_a`` Binomial(n, 1/2): the exact
    McNemar test, one-sided. Vectorised over array inputs.
    """
    only_a = np.asarray(only_a)
    n = only_a + np.asarray(only_b)
    p = sps.binom.sf(only_a - 1, n, 0.5)
    return np.where(n > 0, p, 1.0)


@dataclass(frozen=True)
class RatioBound:
    """Geometric-mean ratio of paired measurements with its one-sided lower bound."""

    gain: float  # exp(mean log ratio) - 1
    lower: float  # one-sided lower confidence bound of the gain
    log_mean: float
    log_std_error: float
    pairs: int

    def to_dict(self) -> dict:
        return asdict(self)


def ratio_lower_bound(log_ratios, confidence: float) -> RatioBound:
    """Student-t lower bound of the mean of per-pair log ratios, reported as a gain."""
    x = np.asarray(log_ratios, dtype=np.float64)
    if x.size < 2:
        raise W12Error(f"need at least 2 paired measurements, got {x.size}")
    mean = float(x.mean())
    se = float(x.std(ddof=1) / np.sqrt(x.size))
    lower = mean - float(sps.t.ppf(confidence, x.size - 1)) * se
    return RatioBound(float(np.expm1(mean)), float(np.expm1(lower)), mean, se, int(x.size))


def rate_tolerance(rate: float, trials: int, sigmas: float = 3.0) -> float:
    """Simulation error allowance: ``sigmas`` binomial standard errors of a rate estimate.

    Used to judge a simulated false-reject rate against its nominal level: the observed rate
    may exceed the nominal one by this much from simulation noise alone.
    """
    return sigmas * float(np.sqrt(rate * (1.0 - rate) / trials))
