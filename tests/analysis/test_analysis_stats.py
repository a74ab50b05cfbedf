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
    assert stats.unpaired_test([0.3 - 0.1] * 4, [0.2] * 30).p_value == 1.0


def test_unpaired_separates_a_clear_difference_and_is_seeded():
    draws = np.random.default_rng(1).normal(5.0, 0.5, 60)
    better = stats.unpaired_test([1.0, 1.2, 0.8, 1.1], draws)
    assert better.p_value < 0.001
    assert stats.unpaired_test([6.0, 5.5, 6.2], draws).p_value > 0.5
    assert stats.unpaired_test([1.0, 1.2, 0.8, 1.1], draws).p_value == better.p_value


def test_unpaired_exact_when_few_partitions():
    # C(4, 2) = 6 partitions; policy holds the two smallest: p = 1/6.
    assert stats.unpaired_test([1.0, 2.0], [3.0, 4.0]).p_value == pytest.approx(1 / 6)


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    values = [1.0, 2.5, 3.0, 4.5, 2.0, 3.5]
    low, high = stats.bootstrap_mean_ci(values)
    assert low < np.mean(values) < high
    assert stats.bootstrap_mean_ci(values) == (low, high)


def test_bootstrap_degenerate_inputs_never_nan():
    assert stats.bootstrap_mean_ci([2.0]) == (-np.inf, np.inf)
    assert stats.bootstrap_mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)
