"""The mechanism gate's statistic, bounds, outcome, and its power estimate against a simulation of the gate."""

from __future__ import annotations

import numpy as np
import pytest

from syncsafe.schedules.schedule import Schedule
from syncsafe.realarm.gate import (
    GatePairs,
    bootstrap_gates,
    gate_bounds,
    gate_outcome,
    gate_power,
    gate_statistic,
    merge_active,
)


def design(rng: np.random.Generator, effect: float, sigma: float = 0.25, seeds: int = 4, blocks: int = 12,
           per_block: float = 6.0) -> GatePairs:
    """Synthetic gate rows with a known effect: a block factor shared by a burst, per-request noise."""
    parts = []
    for s in range(seeds):
        for b in range(blocks):
            n = int(rng.poisson(per_block))
            burst = np.exp(rng.normal(0.0, 0.3))
            twin = np.exp(rng.normal(np.log(100.0), 0.5, n)) * burst
            parts.append(GatePairs(twin * effect * np.exp(rng.normal(0.0, sigma, n)), twin,
                                   twin * np.exp(rng.normal(0.0, sigma, n)), np.full(n, s * 1_000_000 + b)))
    return GatePairs.concat(parts)


def test_the_statistic_divides_the_paired_ratio_by_the_folded_drift():
    twin = np.linspace(10.0, 100.0, 50)
    pairs = GatePairs(twin * 1.5, twin, twin * 1.2, np.zeros(50, dtype=np.int64))
    sync, drift, gate = gate_statistic(pairs)
    assert sync == pytest.approx(1.5) and drift == pytest.approx(1.2) and gate == pytest.approx(1.25)
    faster = GatePairs(twin * 1.5, twin, twin / 1.2, np.zeros(50, dtype=np.int64))
    assert gate_statistic(faster)[2] == pytest.approx(1.25)  # drift either way costs the same
    no_drift = GatePairs(twin * 1.5, twin, np.full(50, np.nan), np.zeros(50, dtype=np.int64))
    assert gate_statistic(no_drift) == (pytest.approx(1.5), None, None)


def test_outcomes_passed_failed_and_inconclusive():
    assert gate_outcome(1.2, 1.6, 1.05) == "passed"
    assert gate_outcome(0.8, 1.01, 1.05) == "failed"
    assert gate_outcome(0.9, 1.3, 1.05) == "inconclusive"
    assert gate_outcome(None, None, 1.05) == "inconclusive"


def test_bounds_are_seeded_and_bracket_the_point_estimate():
    pairs = design(np.random.default_rng(0), 1.4)
    low, high = gate_bounds(pairs, seed=3, n_bootstrap=300)
    assert low < gate_statistic(pairs)[2] < high
    assert gate_bounds(pairs, seed=3, n_bootstrap=300) == (low, high)


def test_a_resample_without_rows_counts_against_the_bound_it_could_not_support():
    """Rows in one of many blocks: most resamples draw none; they are failures, never skipped."""
    twin = np.full(30, 100.0)
    rows = GatePairs(twin * 2.0, twin, twin, np.zeros(30, dtype=np.int64))
    empty_blocks = GatePairs(np.full(9, np.nan), np.full(9, np.nan), np.full(9, np.nan), np.arange(1, 10))
    pairs = GatePairs.concat([rows, empty_blocks])
    gates = bootstrap_gates(pairs, n_bootstrap=400)
    assert np.isnan(gates).mean() > 0.2  # a resample of only empty blocks has no statistic
    low, high = gate_bounds(pairs, n_bootstrap=400)
    assert low is None, "skipping the empty resamples would report a lower bound of 2.0"
    assert high is None


def _bootstrap_by_definition(pairs: GatePairs, seed: int, n_bootstrap: int) -> np.ndarray:
    """The block bootstrap written plainly: each seed's blocks drawn with replacement (`rng.choice`), for
    every resample at once and seed after seed, each resample's rows gathered block by block, the statistic
    from `gate_statistic`."""
    blocks, inverse = np.unique(pairs.block, return_inverse=True)
    rows_of = [np.flatnonzero(inverse == i) for i in range(blocks.size)]
    seeds = blocks // 1_000_000
    per_seed = [np.flatnonzero(seeds == s) for s in np.unique(seeds)]
    rng = np.random.default_rng([seed, 0x6A7E])
    draws = [rng.choice(idx, size=(n_bootstrap, idx.size)) for idx in per_seed]
    out = np.full(n_bootstrap, np.nan)
    for b in range(n_bootstrap):
        chosen = np.concatenate([drawn[b] for drawn in draws])
        g = gate_statistic(pairs.take(np.concatenate([rows_of[i] for i in chosen])))[2]
        out[b] = np.nan if g is None else g
    return out


@pytest.mark.parametrize("case", range(6))
def test_the_bootstrap_is_its_definition_bit_for_bit(case):
    rng = np.random.default_rng(case)
    pairs = design(rng, 1.2, seeds=1 + case % 3, blocks=3 + case)
    if case % 2:  # a latency not measured: the rows' own p95s, non-finite values left out
        pairs.mine[0], pairs.other[-1] = np.nan, np.inf
    fast, plain = bootstrap_gates(pairs, seed=case, n_bootstrap=150), _bootstrap_by_definition(pairs, case, 150)
    assert np.array_equal(fast, plain, equal_nan=True)


def test_merge_active_is_decided_by_arrival_and_one_nominal_lifetime():
    schedule = Schedule(regime="r", policy="p", seed=0, source="train", duration_s=100.0, window_s=8.0, min_gap_s=0.0,
                        merge_starts_s=[20.0])
    arrival = np.array([10.0, 19.5, 20.0, 27.9, 28.0, 40.0])
    assert merge_active(schedule, arrival, 0.0).tolist() == [False, False, True, True, False, False]
    assert merge_active(schedule, arrival, 1.0).tolist() == [False, True, True, True, False, False]


@pytest.mark.slow
@pytest.mark.parametrize("effect", [1.1, 1.2, 1.3])
def test_the_power_estimate_matches_a_simulation_of_the_gate_with_a_known_effect(effect):
    rng = np.random.default_rng(11)
    estimate = gate_power([design(rng, effect) for _ in range(32)], threshold=1.05)
    simulated = np.mean([gate_outcome(*gate_bounds(design(rng, effect), seed=i, n_bootstrap=400), 1.05) == "passed"
                         for i in range(150)])
    # 150 simulated experiments: standard error <= 0.041; the estimate is a normal approximation
    assert abs(estimate.power - simulated) <= 0.12, (estimate, simulated)


def test_power_grows_with_the_effect_and_is_zero_without_merge_active_rows():
    rng = np.random.default_rng(2)
    weak = gate_power([design(rng, 1.05) for _ in range(16)], 1.05, n_bootstrapped=4, n_bootstrap=200)
    strong = gate_power([design(rng, 1.6) for _ in range(16)], 1.05, n_bootstrapped=4, n_bootstrap=200)
    assert weak.power < 0.2 < 0.95 < strong.power
    assert gate_power([GatePairs.empty()] * 4, 1.05).power == 0.0
