"""The noise floor's drift test on synthetic replays: a stationary server is left out at most at its alpha
however much it wanders between replays (the real CPU server does: benchmarks/bench_carryover.py), a server
that drifts over the run is caught, and a design too small to show a drift says so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from syncsafe.realarm import evidence as real_evidence
from syncsafe.realarm.evidence import EXACT_ARRANGEMENTS, control_spread, controls_drift, drift_min_p

ALPHA = 0.05
SIMULATIONS = 200
RESAMPLES = 199
SPAN_S = 120.0
#: Replays in the simulated run: the controls of every seed and the replays with merges between them.
RUN = 24


def arrivals(rng: np.random.Generator, rate: float = 3.0) -> np.ndarray:
    return np.sort(rng.uniform(0.0, SPAN_S, rng.poisson(rate * SPAN_S)))


def replay(arrival_s: np.ndarray, rng: np.random.Generator, pace: float = 1.0, carry: float = 0.85,
           shock_sd: float = 0.12) -> pd.DataFrame:
    """One replay of `arrival_s` on a server whose pace wanders: skewed per-request latencies (log-normal, a tail
    of queued requests), a shock per 10 s of arrivals that every request in it shares, carried over to the next
    block with coefficient `carry` (slow spells of several blocks, as the real server's), times `pace`."""
    blocks = np.floor(arrival_s / 10.0).astype(int)
    shocks = np.zeros(blocks.max() + 1)
    shocks[0] = rng.normal(0.0, shock_sd / np.sqrt(1 - carry**2))  # stationary from the first block
    for b in range(1, shocks.size):
        shocks[b] = carry * shocks[b - 1] + rng.normal(0.0, shock_sd)
    e2e = 120.0 * np.exp(rng.normal(0.0, 0.4, arrival_s.size) + shocks[blocks])
    e2e *= np.where(rng.random(arrival_s.size) < 0.05, rng.uniform(2.0, 4.0, arrival_s.size), 1.0)
    return pd.DataFrame({"arrival_s": arrival_s, "e2e_ms": e2e * pace, "ttft_ms": e2e * 0.2, "error": ""})


def simulated_run(sim: int, seeds: int, controls: int, drift: float = 0.0, replay_sd: float = 0.15):
    """Per seed, its controls at random places in a run of RUN replays, on a server whose pace also varies from
    replay to replay (log-normal, `replay_sd`) and is `1 + drift` times slower at the start of the run than at
    its end (a server still warming)."""
    rng = np.random.default_rng([sim, seeds, controls, 0xD71F])
    places = rng.permutation(RUN)[: seeds * controls].reshape(seeds, controls)
    run = {}
    for seed in range(seeds):
        arrival_s = arrivals(rng)
        run[seed] = [(int(pos), replay(arrival_s, rng, (1 + drift * (1 - pos / (RUN - 1)))
                                       * np.exp(rng.normal(0.0, replay_sd))))
                     for pos in places[seed]]
    return run


def left_out(drift: float, seeds: int = 4, controls: int = 3) -> tuple[int, list[float]]:
    """How many of the simulated runs the test leaves out at ALPHA, and every seed's controls' p95 spread."""
    count, spreads = 0, []
    for sim in range(SIMULATIONS):
        run = simulated_run(sim, seeds, controls, drift)
        test = controls_drift(run, RESAMPLES, (sim,))
        assert test is not None and test.controls == seeds * controls and test.seeds == seeds
        count += test.disagree(ALPHA)
        spreads += [control_spread([t for _, t in run[s]]) for s in run]
    return count, spreads


@pytest.mark.parametrize("controls", [3, 4])
def test_a_wandering_but_stationary_server_is_left_out_at_most_at_alpha(controls):
    count, spreads = left_out(drift=0.0, controls=controls)
    # the leave-out rate is not above alpha: a one-sided binomial test of the count does not reject it
    assert stats.binomtest(count, SIMULATIONS, ALPHA, alternative="greater").pvalue > 0.01, count
    # the server wanders as the real one does: identical controls of a seed spread well past 10 %, the fixed
    # threshold an earlier noise floor used (and past what their requests' sampling noise alone gives)
    assert np.median(spreads) > 0.2, np.median(spreads)


def test_a_server_that_drifts_over_the_run_is_caught():
    """A server 3x slower at the start of the run than at its end (linearly), beside its wandering from replay to
    replay: four seeds of four controls catch it most of the time, four of three about half the time (few
    controls of a wandering server show a drift poorly: the test states its smallest attainable p)."""
    strong = left_out(drift=2.0, controls=4)[0]
    assert strong / SIMULATIONS >= 0.7
    assert left_out(drift=2.0, controls=3)[0] / SIMULATIONS >= 0.45
    assert strong > left_out(drift=0.5, controls=4)[0] > left_out(drift=0.0, controls=4)[0]


def test_the_smallest_attainable_p_is_stated_and_a_small_design_says_it_cannot_detect():
    two_by_three = controls_drift(simulated_run(0, seeds=2, controls=3), RESAMPLES, (0,))
    assert two_by_three.min_p == pytest.approx(1 / 36)  # the one arrangement of largest |sum|
    assert not two_by_three.can_detect(0.01) and two_by_three.p_value >= two_by_three.min_p
    two_by_four = controls_drift(simulated_run(0, seeds=2, controls=4), RESAMPLES, (0,))
    assert two_by_four.min_p == pytest.approx(1 / 576) and two_by_four.can_detect(0.01)
    assert drift_min_p([3, 3]) == pytest.approx(two_by_three.min_p) and drift_min_p([4, 4, 1]) == pytest.approx(1 / 576)


def test_a_perfect_drift_reaches_the_smallest_p_and_the_sampled_null_agrees_with_the_exact_one(monkeypatch):
    run = {s: [(pos, pd.DataFrame({"arrival_s": [1.0] * 20, "e2e_ms": np.full(20, np.exp(-pos / 10)), "error": ""}))
               for pos in (s, s + 4, s + 8)] for s in range(2)}
    test = controls_drift(run, RESAMPLES, (0,))
    assert test.statistic == pytest.approx(-2.0) and test.p_value == pytest.approx(test.min_p)
    design = simulated_run(3, seeds=2, controls=4, drift=0.3)  # 24^2 arrangements: enumerated
    assert 24**2 <= EXACT_ARRANGEMENTS
    exact = controls_drift(design, RESAMPLES, (1,))
    monkeypatch.setattr(real_evidence, "EXACT_ARRANGEMENTS", 0)  # the same design, its null sampled
    sampled = controls_drift(design, 4000, (1,))
    assert sampled.p_value == pytest.approx(exact.p_value, abs=0.02), (sampled.p_value, exact.p_value)
    assert sampled.statistic == exact.statistic


def test_seeds_with_fewer_than_two_measured_controls_are_not_tested():
    rng = np.random.default_rng(1)
    one = replay(arrivals(rng), rng)
    assert controls_drift({0: [(0, one)]}, RESAMPLES, (0,)) is None
    failed = one.assign(error="timeout")
    assert controls_drift({0: [(0, one), (3, failed)], 1: [(1, one)]}, RESAMPLES, (0,)) is None
