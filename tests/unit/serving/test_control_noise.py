"""The noise floor's test on synthetic replays: identical servers are left out at most at its alpha, a server
that changed between controls is caught, and the fixed spread threshold it replaces was no noise test at all."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from syncsafe.serving.real_evidence import control_spread, controls_disagree

ALPHA = 0.05
SIMULATIONS = 200
RESAMPLES = 199
SPAN_S = 120.0


def arrivals(rng: np.random.Generator, rate: float = 3.0) -> np.ndarray:
    return np.sort(rng.uniform(0.0, SPAN_S, rng.poisson(rate * SPAN_S)))


def replay(arrival_s: np.ndarray, rng: np.random.Generator, slowdown: float = 1.0) -> pd.DataFrame:
    """One replay of `arrival_s` on a server of one distribution: skewed per-request latencies (log-normal, a
    tail of queued requests) and a shock per 10 s of arrivals that every request in it shares (AR(1) across
    them, as a slow spell carries over), times `slowdown`."""
    blocks = np.floor(arrival_s / 10.0).astype(int)
    shocks = np.zeros(blocks.max() + 1)
    for b in range(shocks.size):
        shocks[b] = 0.3 * (shocks[b - 1] if b else 0.0) + rng.normal(0.0, 0.08)
    e2e = 120.0 * np.exp(rng.normal(0.0, 0.4, arrival_s.size) + shocks[blocks])
    e2e *= np.where(rng.random(arrival_s.size) < 0.05, rng.uniform(2.0, 4.0, arrival_s.size), 1.0)
    return pd.DataFrame({"arrival_s": arrival_s, "e2e_ms": e2e * slowdown, "ttft_ms": e2e * 0.2,
                         "error": ""})


def outcomes(slowdown: float, controls: int = 3) -> tuple[list[float], list[float]]:
    """Per simulated seed: the noise test's p and the controls' p95 spread (the last control `slowdown` x)."""
    ps, spreads = [], []
    for sim in range(SIMULATIONS):
        rng = np.random.default_rng([sim, 0xC0])
        arrival_s = arrivals(rng)
        tables = [replay(arrival_s, rng, slowdown if i == controls - 1 else 1.0) for i in range(controls)]
        test = controls_disagree(tables, RESAMPLES, (sim,))
        assert test is not None and test.controls == controls
        ps.append(test.p_value)
        spreads.append(control_spread(tables))
    return ps, spreads


def test_identical_controls_are_left_out_at_most_at_alpha_where_a_fixed_spread_threshold_was_not():
    ps, spreads = outcomes(slowdown=1.0)
    left_out = sum(p < ALPHA for p in ps)
    # the leave-out rate is not above alpha: a one-sided binomial test of the count does not reject it
    assert stats.binomtest(left_out, SIMULATIONS, ALPHA, alternative="greater").pvalue > 0.01, left_out
    assert np.mean(np.asarray(ps) < 0.5) < 0.7, "p is spread over [0, 1] under the null, not piled near 0"
    # the old rule (spread over 10 %: leave out) on the same replays: identical servers left out by chance
    old = sum(s > 0.10 for s in spreads)
    assert old > 3 * max(left_out, 1) and old / SIMULATIONS > 2 * ALPHA, (old, left_out)


def test_a_server_that_changed_between_controls_is_caught():
    """Power against one control 1.4x and 1.8x slower (3 controls of ~360 requests each, their p95 resting on
    the slowest 18): a p95 moves a lot by chance, so a 40 % change is caught about three times in four."""
    caught = {k: float(np.mean(np.asarray(outcomes(slowdown=k)[0]) < ALPHA)) for k in (1.4, 1.8)}
    assert caught[1.4] >= 0.7 and caught[1.8] >= 0.95, caught


def test_fewer_than_two_measured_controls_are_not_tested():
    rng = np.random.default_rng(1)
    one = replay(arrivals(rng), rng)
    assert controls_disagree([one], RESAMPLES, (0,)) is None
    failed = one.assign(error="timeout")
    assert controls_disagree([one, failed], RESAMPLES, (0,)) is None
