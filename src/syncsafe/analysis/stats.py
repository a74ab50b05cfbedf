"""One-sided tests and bootstrap intervals for the evidence protocol (scipy).

Lower SLO violations are better, so every test asks one question: is the
policy's mean *below* the reference's? The alternative is ``'less'`` and the
statistic is the mean difference ``policy - reference``.

* :func:`paired_test`: paired samples over seeds (policy vs its matched-random
  mean, or vs ``fixed_h``, on the same seed). ``scipy.stats.permutation_test``
  with ``permutation_type='samples'`` swaps the two values of a pair, which is
  a sign flip of that seed's difference; with ``n_resamples=np.inf`` all
  ``2**n`` sign patterns are enumerated (exact test). Above
  :data:`EXACT_MAX_PAIRS` pairs it falls back to a seeded Monte Carlo.
* :func:`bootstrap_mean_ci`: seeded percentile bootstrap of a mean.
* :func:`rank_test`: the protocol's primary test. Per seed, the policy's
  mid-rank among itself and that seed's K matched-random draws (1 = lowest
  SLO); the statistic is the sum over seeds. Under the null "the controller
  is one more draw" the K + 1 values of a seed are exchangeable, so, given
  the seed's observed values (ties included), the controller's mid-rank is
  uniform over their K + 1 mid-ranks; seeds are independent, so the exact
  null distribution of the sum is the convolution of those uniform
  distributions. No symmetry is assumed, which zero-inflated, skewed SLO
  rates do not have (a sign-flip test on them rejects far too often).
* :func:`sign_test`: exact binomial test on the seeds where the policy and a
  single paired reference differ (ties dropped): valid for any shape of the
  differences.

No evidence is never reported as NaN: the p-value is 1.0 when a sample has
fewer than :data:`MIN_SAMPLE` values (scipy cannot permute one observation;
a single seed is no evidence either way), and scipy itself returns 1.0 when
every permutation gives the same statistic (zero variance).

Values are quantised to :data:`RESOLUTION` (in the caller's units, percentage
points here) before testing, so floating-point noise (``0.3 - 0.1`` vs
``0.2``) never turns a tie into evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats
from numpy.typing import ArrayLike

RESOLUTION = 1e-9
EXACT_MAX_PAIRS = 16  # 2**16 sign patterns; beyond that, Monte Carlo
MONTE_CARLO_RESAMPLES = 9_999
DEFAULT_SEED = 0
MIN_SAMPLE = 2
NO_EVIDENCE_P = 1.0


@dataclass(frozen=True)
class OneSidedTest:
    """Result of a one-sided test that the policy's mean is below the reference's.

    ``effect`` is mean(policy) - mean(reference) (negative: policy better);
    NaN when there is nothing to compare (``n == 0``).
    """

    n: int
    effect: float
    p_value: float


def quantised(values: ArrayLike) -> np.ndarray:
    """`values` as whole multiples of :data:`RESOLUTION` (float64 integers)."""
    return np.round(np.asarray(values, dtype=float) / RESOLUTION)


def _mean_paired_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x - y, axis=axis)


def paired_test(policy: ArrayLike, reference: ArrayLike, *, seed: int = DEFAULT_SEED) -> OneSidedTest:
    """Exact one-sided sign-flip test of paired samples (one pair per seed)."""
    x, y = quantised(policy), quantised(reference)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and of equal length, got {x.shape} and {y.shape}")
    n = x.size
    if n == 0:
        return OneSidedTest(n=0, effect=float("nan"), p_value=NO_EVIDENCE_P)
    effect = float(np.mean(x - y)) * RESOLUTION
    if n < MIN_SAMPLE:
        return OneSidedTest(n=n, effect=effect, p_value=NO_EVIDENCE_P)
    result = scipy.stats.permutation_test(
        (x, y),
        _mean_paired_difference,
        permutation_type="samples",
        alternative="less",
        n_resamples=np.inf if n <= EXACT_MAX_PAIRS else MONTE_CARLO_RESAMPLES,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return OneSidedTest(n=n, effect=effect, p_value=_p_or_no_evidence(result.pvalue))


@dataclass(frozen=True)
class RankTest:
    """Result of :func:`rank_test`: ``rank_mean`` is the mean normalised rank (0 best, 1 worst)."""

    n: int
    rank_sum: float
    rank_mean: float
    p_value: float


def rank_test(policy: ArrayLike, draws: list[ArrayLike]) -> RankTest:
    """Exact within-seed rank test: is the policy ranked low among its draws across seeds?

    `policy[i]` is seed i's policy value and `draws[i]` that seed's draw
    values (any count >= 1; lower is better). Seeds without draws are left
    out. The p-value is P(rank sum <= observed) under the exchangeability null.
    """
    values = quantised(policy).ravel()
    if len(draws) != values.size:
        raise ValueError(f"rank_test needs one draw sample per seed: {values.size} seeds, {len(draws)} samples")
    distribution = np.ones(1)  # P(sum of doubled mid-ranks = index)
    observed, normalised, used = 0, [], 0
    for value, seed_draws in zip(values, draws):
        others = quantised(seed_draws).ravel()
        if others.size == 0:
            continue
        doubled = np.rint(2 * scipy.stats.rankdata(np.concatenate([[value], others]), method="average")).astype(int)
        observed += int(doubled[0])
        normalised.append((doubled[0] / 2 - 1) / others.size)
        seed_null = np.bincount(doubled) / doubled.size
        distribution = np.convolve(distribution, seed_null)
        used += 1
    if used == 0:
        return RankTest(n=0, rank_sum=float("nan"), rank_mean=float("nan"), p_value=NO_EVIDENCE_P)
    p = float(distribution[: observed + 1].sum())
    return RankTest(n=used, rank_sum=observed / 2, rank_mean=float(np.mean(normalised)), p_value=min(p, 1.0))


def sign_test(policy: ArrayLike, reference: ArrayLike) -> OneSidedTest:
    """Exact one-sided sign test that the policy is below its paired reference more often than not."""
    x, y = quantised(policy), quantised(reference)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples must be 1-D and of equal length, got {x.shape} and {y.shape}")
    if x.size == 0:
        return OneSidedTest(n=0, effect=float("nan"), p_value=NO_EVIDENCE_P)
    effect = float(np.mean(x - y)) * RESOLUTION
    below, above = int((x < y).sum()), int((x > y).sum())
    if below + above == 0:
        return OneSidedTest(n=int(x.size), effect=effect, p_value=NO_EVIDENCE_P)
    p = scipy.stats.binomtest(below, below + above, 0.5, alternative="greater").pvalue
    return OneSidedTest(n=int(x.size), effect=effect, p_value=_p_or_no_evidence(p))


def bootstrap_mean_ci(
    values: ArrayLike,
    *,
    confidence: float = 0.95,
    n_resamples: int = 9_999,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Seeded percentile-bootstrap interval of the mean of `values`.

    With fewer than two values there is no spread to resample: the interval
    is unbounded, ``(-inf, inf)``. Identical values give a point interval.
    """
    data = np.asarray(values, dtype=float).ravel()
    if data.size < 2:
        return (-np.inf, np.inf)
    if np.ptp(data) == 0.0:
        return (float(data[0]), float(data[0]))
    result = scipy.stats.bootstrap(
        (data,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(result.confidence_interval.low), float(result.confidence_interval.high))


def _p_or_no_evidence(p: float) -> float:
    p = float(p)
    return NO_EVIDENCE_P if not np.isfinite(p) else min(p, 1.0)
