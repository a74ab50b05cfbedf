"""Span-conditioned matched random: counts against enumeration, exact uniformity, refusal of impossible targets."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from syncsafe.schedules.action_space import ActionSpace, ActionSpaceError
from syncsafe.schedules.span import SpanCount, count_in_span, placements_in_span, sample_in_span, span_count

SMALL = ActionSpace(cycle_s=20.0, window_s=8.0, duration_s=240.0, max_cycles=4)


def test_span_count_reads_merges_before_the_end_and_the_cut():
    assert span_count([20.0, 48.0, 76.0], 8.0, 50.0) == SpanCount(2, True)
    assert span_count([20.0, 48.0, 76.0], 8.0, 56.0) == SpanCount(2, False)
    assert span_count([20.0, 48.0, 76.0], 8.0, 10.0) == SpanCount(0, False)
    assert span_count([], 8.0, 100.0) == SpanCount(0, False)


@pytest.mark.parametrize("span", [15.0, 30.0, 60.0, 84.0, 100.0, 128.0, 200.0, 240.0])
def test_counts_equal_enumeration_for_every_merge_count_and_target(span):
    for n in SMALL.merge_counts():
        groups = collections.Counter(span_count(SMALL.starts(g), 8.0, span) for g in SMALL.enumerate(n))
        for target, expected in groups.items():
            assert count_in_span(SMALL, n, span, target) == expected, (n, span, target)
        assert count_in_span(SMALL, n, span, SpanCount(n + 1, False)) == 0


def test_draws_are_exactly_uniform_over_the_conditioned_set():
    n, span = 5, 84.0
    everything = [tuple(SMALL.starts(g)) for g in SMALL.enumerate(n)]
    target = span_count(everything[7], 8.0, span)
    allowed = {s for s in everything if span_count(s, 8.0, span) == target}
    rng = np.random.default_rng(0)
    draws = 200 * len(allowed)
    seen = collections.Counter(tuple(sample_in_span(SMALL, n, span, target, rng)) for _ in range(draws))
    assert set(seen) == allowed
    # each schedule drawn with probability 1/|allowed|: counts within 5 binomial standard deviations
    expected = draws / len(allowed)
    sd = (draws * (1 / len(allowed)) * (1 - 1 / len(allowed))) ** 0.5
    assert max(abs(c - expected) for c in seen.values()) < 5 * sd


def test_an_impossible_target_is_refused_with_the_span():
    with pytest.raises(ActionSpaceError, match="no controller schedule with 3 merges has 2 merge"):
        sample_in_span(SMALL, 3, 30.0, SpanCount(2, False), np.random.default_rng(0))


@pytest.mark.parametrize("span", [30.0, 48.0, 84.0, 128.0])
def test_placements_in_span_count_the_distinct_in_span_starts(span):
    for n in SMALL.merge_counts():
        by_target: dict[SpanCount, set] = collections.defaultdict(set)
        for g in SMALL.enumerate(n):
            starts = SMALL.starts(g)
            by_target[span_count(starts, 8.0, span)].add(tuple(s for s in starts if s < span))
        for target, placements in by_target.items():
            assert placements_in_span(SMALL, n, span, target) == len(placements), (n, span, target)
