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
* :func:`unpaired_test`: policy seeds vs the pool of all draw values
  (``permutation_type='independent'``, seeded Monte Carlo, exact when the
  number of distinct partitions is small).
* :func:`bootstrap_mean_ci`: seeded percentile bootstrap of a mean.

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


def _difference_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


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


def unpaired_test(
    policy: ArrayLike,
    draws: ArrayLike,
    *,
    n_resamples: int = MONTE_CARLO_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> OneSidedTest:
    """One-sided permutation test: policy seeds vs all matched-random draw values."""
    x, y = quantised(policy).ravel(), quantised(draws).ravel()
    if x.size == 0 or y.size == 0:
        return OneSidedTest(n=int(x.size), effect=float("nan"), p_value=NO_EVIDENCE_P)
    effect = float(np.mean(x) - np.mean(y)) * RESOLUTION
    if x.size < MIN_SAMPLE or y.size < MIN_SAMPLE:
        return OneSidedTest(n=int(x.size), effect=effect, p_value=NO_EVIDENCE_P)
    result = scipy.stats.permutation_test(
        (x, y),
        _difference_of_means,
        permutation_type="independent",
        alternative="less",
        n_resamples=n_resamples,
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return OneSidedTest(n=int(x.size), effect=effect, p_value=_p_or_no_evidence(result.pvalue))


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
