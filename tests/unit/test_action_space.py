"""The controller's action space: exact counts, exactly uniform draws, fair matched random."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import scipy.stats

from syncsafe.config import load_params
from syncsafe.schedules.action_space import ActionSpace, ActionSpaceError
from syncsafe.schedules.derive import even_cadence, matched_random
from syncsafe.schedules.schedule import Schedule, ScheduleError
from syncsafe.schedules.stage import run_harness
from syncsafe.traces.timeline import generate_timeline

# 20 s cycles, 8 s windows, at most 4 cycles apart, 200 s: small enough to enumerate
SMALL = ActionSpace(cycle_s=20.0, window_s=8.0, duration_s=200.0, max_cycles=4)


def brute_force(space: ActionSpace, n: int) -> list[tuple[int, ...]]:
    """Every gap sequence whose schedule the controller loop itself could produce, by direct simulation."""
    out = []

    def walk(prefix: tuple[int, ...]) -> None:
        if len(prefix) == n:
            # after the last merge the controller must never reach a forced merge that fits
            end = (space.starts(list(prefix))[-1] + space.window_s) if prefix else 0.0
            if end + space.max_cycles * space.cycle_s + space.window_s > space.duration_s + 1e-9:
                out.append(prefix)
            return
        for k in range(1, space.max_cycles + 1):
            candidate = (*prefix, k)
            if space.starts(list(candidate))[-1] + space.window_s <= space.duration_s + 1e-9:
                walk(candidate)

    walk(())
    return out


@pytest.mark.parametrize("n", range(0, 9))
def test_counts_and_enumeration_match_brute_force(n):
    expected = sorted(brute_force(SMALL, n))
    assert SMALL.count(n) == len(expected)
    assert sorted(tuple(g) for g in SMALL.enumerate(n)) == expected


def test_merge_counts_are_exactly_the_feasible_ones():
    feasible = [n for n in range(12) if brute_force(SMALL, n)]
    assert list(SMALL.merge_counts()) == feasible


@pytest.mark.parametrize("n", [2, 4, 6])
def test_draws_are_uniform_over_every_feasible_schedule(n):
    schedules = [tuple(g) for g in SMALL.enumerate(n)]
    assert len(schedules) >= 5
    rng = np.random.default_rng(7)
    draws = 400 * len(schedules)
    counts = collections.Counter(tuple(SMALL.sample_gaps(n, rng)) for _ in range(draws))
    assert set(counts) == set(schedules)  # every draw feasible, every feasible schedule drawn
    observed = np.array([counts[s] for s in schedules])
    p = scipy.stats.chisquare(observed).pvalue
    assert p > 1e-3, f"chi-square p {p:.2g}: draws not uniform over the {len(schedules)} schedules"


def test_sampling_exactly_with_counts_beyond_64_bits():
    space = ActionSpace(cycle_s=1.0, window_s=0.5, duration_s=300.0, max_cycles=6)
    n = 90
    assert space.count(n) > 2**64
    starts = space.sample(n, np.random.default_rng(0))
    assert len(starts) == n and space.contains(starts)


def test_membership_rules():
    assert SMALL.contains([20.0, 48.0, 76.0, 104.0, 172.0])  # gaps 1,1,1,1,3
    assert not SMALL.contains([30.0])  # off the cycle grid
    assert not SMALL.contains([20.0, 148.0])  # 6 cycles apart: past max_h
    assert not SMALL.contains([20.0])  # room left for a forced merge at 128 s
    with pytest.raises(ActionSpaceError, match="no controller schedule has 20 merges"):
        SMALL.sample(20, np.random.default_rng(0))


def test_evenly_spaced_is_feasible_and_even():
    for n in SMALL.merge_counts():
        gaps = SMALL.evenly_spaced_gaps(n)
        assert SMALL.contains(SMALL.starts(gaps))
        assert max(gaps, default=0) - min(gaps, default=0) <= 1


def harness_controllers():
    params = load_params()
    for regime in ("bursty", "steady", "pressure_heavy"):
        space = ActionSpace.of_params(params, regime)
        for seed in (0, 1):
            timeline = generate_timeline(regime, params.regimes[regime], params.traces.step_s, seed)
            for policy in params.control.policies:
                schedule, _ = run_harness(params, regime, policy, seed, timeline)
                yield space, schedule


def test_every_controller_schedule_and_every_draw_lie_in_the_action_space():
    seen = 0
    for space, controller in harness_controllers():
        assert space.contains(controller.merge_starts_s), (controller.policy, controller.merge_starts_s)
        for draw in range(5):
            d = matched_random(controller, draw, space)
            assert (d.source, d.policy, d.draw, d.matched_to) == ("matched_random", "matched_random", draw, controller.policy)
            assert d.n_merges == controller.n_merges and space.contains(d.merge_starts_s)
        cadence = even_cadence(controller, space)
        assert cadence.n_merges == controller.n_merges and space.contains(cadence.merge_starts_s)
        seen += 1
    assert seen > 20


def test_draws_are_seeded_per_controller_and_draw():
    space = ActionSpace(cycle_s=20.0, window_s=8.0, duration_s=600.0, max_cycles=4)
    ctl = Schedule(regime="bursty", policy="wa_diloco", seed=0, source="harness", duration_s=600.0, window_s=8.0,
                   min_gap_s=10.0, merge_starts_s=space.sample(12, np.random.default_rng(1)))
    assert matched_random(ctl, 3, space) == matched_random(ctl, 3, space)
    assert matched_random(ctl, 3, space).merge_starts_s != matched_random(ctl, 4, space).merge_starts_s
    other_seed = ctl.model_copy(update={"seed": 1})
    assert matched_random(ctl, 3, space).merge_starts_s != matched_random(other_seed, 3, space).merge_starts_s


def test_a_schedule_outside_the_action_space_gets_no_matched_baseline():
    space = ActionSpace(cycle_s=20.0, window_s=8.0, duration_s=600.0, max_cycles=4)
    ctl = Schedule(regime="bursty", policy="wa_diloco", seed=0, source="harness", duration_s=600.0, window_s=8.0,
                   min_gap_s=10.0, merge_starts_s=[33.0])
    with pytest.raises(ScheduleError, match="not in the controller's action space"):
        matched_random(ctl, 0, space)
