"""One-sided tests and bootstrap: scipy results vs hand enumeration."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from syncsafe.analysis import stats


def hand_sign_flip_p(differences: list[float]) -> float:
    """Exact one-sided sign-flip p: share of the 2**n sign patterns whose mean
    difference is <= the observed one (exact rational arithmetic)."""
    d = [Fraction(x) for x in differences]
    observed = sum(d)
    patterns = list(itertools.product((1, -1), repeat=len(d)))
    at_most = sum(1 for signs in patterns if sum(s * x for s, x in zip(signs, d)) <= observed)
    return at_most / len(patterns)


@pytest.mark.parametrize(
    "differences",
    [
        [-1.5, -0.25, 0.5, -2.0, -0.75],  # n = 5
        [-1.0, -1.0, 0.5, -2.0, 0.0, -0.5, 1.0, -1.5, -0.25, -1.0],  # n = 10, ties and a zero
        list(np.round(np.random.default_rng(7).normal(-0.3, 1.0, 10), 3)),  # n = 10, generic
        list(np.round(np.random.default_rng(8).normal(0.4, 1.0, 5), 3)),  # n = 5, policy worse
    ],
)
def test_paired_p_equals_hand_enumeration(differences):
    reference = np.linspace(3.0, 9.0, len(differences))
    policy = reference + np.asarray(differences)
    result = stats.paired_test(policy, reference)
    assert result.n == len(differences)
    assert result.p_value == pytest.approx(hand_sign_flip_p(differences), abs=1e-12)
    assert result.effect == pytest.approx(float(np.mean(differences)))


def test_all_seeds_better_gives_the_smallest_exact_p():
    assert stats.paired_test([1.0] * 5, [2.0] * 5).p_value == pytest.approx(1 / 32)


def test_single_pair_and_no_pairs_are_no_evidence():
    assert stats.paired_test([1.0], [9.0]).p_value == 1.0
    assert stats.paired_test([], []).p_value == 1.0


def test_zero_variance_and_float_noise_are_ties():
    # 0.3 - 0.1 != 0.2 in floating point; it must still be a tie, not evidence.
    assert stats.paired_test([0.3 - 0.1] * 10, [0.2] * 10).p_value == 1.0


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    values = [1.0, 2.5, 3.0, 4.5, 2.0, 3.5]
    low, high = stats.bootstrap_mean_ci(values)
    assert low < np.mean(values) < high
    assert stats.bootstrap_mean_ci(values) == (low, high)


def test_bootstrap_degenerate_inputs_never_nan():
    assert stats.bootstrap_mean_ci([2.0]) == (-np.inf, np.inf)
    assert stats.bootstrap_mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


def hand_rank_p(policy: list[float], draws: list[list[float]]) -> Fraction:
    """Exact rank-test p by enumerating every assignment of the policy's value to a position per seed."""
    def midranks(values):
        return [Fraction(sum(1 for w in values if w < v) * 2 + sum(1 for w in values if w == v) + 1, 2) for v in values]

    per_seed = [midranks([x, *d]) for x, d in zip(policy, draws)]
    observed = sum(r[0] for r in per_seed)
    outcomes = list(itertools.product(*per_seed))
    return Fraction(sum(1 for combo in outcomes if sum(combo) <= observed), len(outcomes))


@pytest.mark.parametrize(
    ("policy", "draws"),
    [
        ([0.1, 0.2, 0.0], [[0.3, 0.5], [0.1, 0.4, 0.6], [0.2, 0.2]]),
        ([0.0, 0.0, 0.0, 0.5], [[0.0, 0.0, 0.1], [0.0, 0.0], [0.3, 0.0, 0.0], [0.5, 0.5, 0.2]]),  # zero-inflated ties
        ([0.9, 0.1, 0.4], [[0.1, 0.2, 0.3], [0.5, 0.6], [0.4, 0.4, 0.4]]),
        (list(np.round(np.random.default_rng(3).exponential(1.0, 5), 1)),
         [list(np.round(np.random.default_rng(4 + i).exponential(1.0, 3), 1)) for i in range(5)]),
    ],
)
def test_rank_p_equals_hand_enumeration(policy, draws):
    result = stats.rank_test(policy, draws)
    assert result.p_value == pytest.approx(float(hand_rank_p(policy, draws)), rel=1e-12, abs=1e-15)
    assert result.n == len(policy)


def test_rank_test_extremes_and_no_evidence():
    best = stats.rank_test([0.0] * 6, [[1.0, 2.0, 3.0]] * 6)
    assert best.p_value == pytest.approx(4.0 ** -6) and best.rank_mean == 0.0
    worst = stats.rank_test([9.0] * 3, [[1.0, 2.0]] * 3)
    assert worst.p_value == 1.0 and worst.rank_mean == 1.0
    tied = stats.rank_test([0.0] * 5, [[0.0, 0.0]] * 5)  # all zero: no information at all
    assert tied.p_value == 1.0 and tied.rank_mean == pytest.approx(0.5)
    assert stats.rank_test([0.1], [[]]).p_value == 1.0
    with pytest.raises(ValueError, match="one draw sample per seed"):
        stats.rank_test([0.1, 0.2], [[0.3]])


def test_sign_test_counts_strict_wins_only():
    assert stats.sign_test([1, 1, 1, 1, 1], [2, 2, 2, 2, 2]).p_value == pytest.approx(1 / 32)
    assert stats.sign_test([1, 1, 2, 1], [2, 2, 2, 2]).p_value == pytest.approx(1 / 8)  # the tie is dropped
    assert stats.sign_test([3, 3], [3, 3]).p_value == 1.0
    assert stats.sign_test([3, 1, 3], [2, 2, 2]).p_value == pytest.approx(7 / 8)
