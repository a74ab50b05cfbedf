"""The held-out fidelity errors' 95 % bounds under the real server's replay-to-replay wander.

A held-out real replay is one draw of a server whose pace wanders from
replay to replay: identical no-merge replays of one warm server differ by
10-40 % in p95 on 2 cores (benchmarks/bench_carryover.py), so a perfect
simulator still misses one real replay's p95 by about that much, and a
paired sync ratio (a replay with merges over its no-sync control: two
draws) by more. A point error against a 15 % or [0.8, 1.25] target is then
a coin flip, and two runs of one plan met it in one and missed it in the
other.

Each error therefore carries bounds. The wander is the one the gate uses
(`syncsafe.realarm.gate.ReplayNoise`: the pooled within-seed variance of
the no-sync controls' log p95, on its degrees of freedom). Each of
`N_DRAWS` draws takes a replay-level sd from the variance's sampling spread
(var * df / chi2(df)) and multiplies every held-out real replay's latencies
by its own log-normal shock; the errors are recomputed on the shocked
replays. The simulated side carries the fit's own run-to-run variation
when the calibration was refitted on shocked fit replays (`refits`): draw d
then takes refit d mod n's simulated figures (one row per refit below),
else the calibration's alone:

- p95 error: sim p95 / (real p95 * shock) - 1, per replay;
- SLO-rate error: sim % - real %, per replay, the real % of a request
  violating once its latencies times the shock exceed a bound;
- sync ratio sim / real: the simulated paired ratio over the real one of
  the shocked rows (`GatePairs` carry each row's replays).

Each replay's error gets the draws' 2.5 and 97.5 percentiles; the largest
error over the replays (the figure the target judges) is bounded by the
largest of the replays' lows and the largest of their highs, so the figure
is met when every replay's range meets the target and missed when one
replay's whole range misses it. The sync ratio's bounds are the draws'
percentiles. Without a wander estimate (no seed with two controls) the
bounds are the point: the errors are judged as measured. `syncsafe.analysis.evidence.fidelity_outcome`
turns value and bounds into met / missed / undecided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from syncsafe.realarm.gate import GatePairs, ReplayNoise
from syncsafe.serving.metrics import SloSpec, failed_mask

#: Draws of the replay shocks, and the two-sided level of the bounds.
N_DRAWS = 2000
LEVEL = 0.95

Bounds = tuple[float, float]


def replay_shocks(noise: ReplayNoise | None, n_replays: int, seed: int, n_draws: int = N_DRAWS) -> np.ndarray:
    """Log shocks (draws x replays): each draw's sd from the pooled variance's spread, then one normal shock per
    replay. A single row of zeros without noise (the errors as measured)."""
    if noise is None or noise.df < 1 or n_replays == 0:
        return np.zeros((1, n_replays))
    rng = np.random.default_rng([seed, 0xF1DE])
    return noise.draw_sd(rng, n_draws)[:, None] * rng.standard_normal((n_draws, n_replays))


def _interval(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two-sided `LEVEL` percentiles of each column of `values` (draws x columns, or draws)."""
    tail = 100.0 * (1.0 - LEVEL) / 2.0
    low, high = np.percentile(values, [tail, 100.0 - tail], axis=0)
    return low, high


def _largest_absolute(signed: np.ndarray) -> Bounds:
    """Bounds of the largest |error| over replays from each replay's signed errors under the shocks (draws x
    replays): each replay's interval of |error| (0 at its low end when its signed interval holds 0), then the
    largest low and the largest high. Per replay, not the draws' joint maximum: a perfect simulator's
    figure is then missed only when one replay's own range misses the target."""
    low, high = _interval(signed)
    abs_low = np.where((low <= 0) & (high >= 0), 0.0, np.minimum(np.abs(low), np.abs(high)))
    abs_high = np.maximum(np.abs(low), np.abs(high))
    return float(abs_low.max()), float(abs_high.max())


def per_draw(simulated: np.ndarray, n_draws: int) -> np.ndarray:
    """The simulated side of each of `n_draws` draws: row d is row d mod n of `simulated` (one row per refit, or
    a single row: the calibration's own figures)."""
    simulated = np.atleast_2d(np.asarray(simulated, dtype=float))
    return simulated[np.arange(n_draws) % simulated.shape[0]]


def _as_float(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in np.atleast_2d(np.asarray(values, object))],
                    dtype=float)


def p95_error_bounds(real_p95: Sequence[float | None], sim_p95: Sequence[float | None] | np.ndarray,
                     shocks: np.ndarray) -> Bounds:
    """Bounds of the largest relative p95 error over the replays (one column of `shocks` per replay; `sim_p95` one
    value per replay, or one row per refit); a replay without a real or simulated p95 is an infinite error, as in
    the point figure."""
    real = _as_float(real_p95)[0]
    sim = _as_float(sim_p95)
    if not (np.isfinite(real).all() and np.isfinite(sim).all() and (real > 0).all()):
        return math.inf, math.inf
    return _largest_absolute(per_draw(sim, shocks.shape[0]) / (real * np.exp(shocks)) - 1.0)


def critical_factors(results: pd.DataFrame, slo: SloSpec) -> np.ndarray:
    """Per request, the largest factor its latencies can be multiplied by and still meet `slo` (0: violates at any
    factor: failed, or a latency not measured). A request violates at factor f exactly when f > its factor, so at
    f = 1 this is `serving.metrics.violation_mask`."""
    factor = np.full(len(results), np.inf)
    for column, bound in (("ttft_ms", slo.ttft_ms), ("e2e_ms", slo.e2e_ms)):
        if bound is not None:
            latency = results[column].to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                limit = np.where(latency > 0, bound / latency, np.inf)
            factor = np.minimum(factor, np.where(np.isnan(latency), 0.0, limit))
    return np.where(failed_mask(results), 0.0, factor)


def slo_error_bounds(factors: Sequence[np.ndarray], sim_pct: Sequence[float] | np.ndarray, shocks: np.ndarray
                     ) -> Bounds:
    """Bounds of the largest SLO-rate error (pp) over the replays: replay r's real rate at shock s is the share of
    its requests whose critical factor is below exp(s); `sim_pct` one rate per replay, or one row per refit."""
    sim = per_draw(sim_pct, shocks.shape[0])
    signed = np.empty(shocks.shape)
    for r, crit in enumerate(factors):
        crit = np.sort(np.asarray(crit, dtype=float))
        violating = np.searchsorted(crit, np.exp(shocks[:, r]), side="left")  # factors strictly below the shock
        signed[:, r] = sim[:, r] - 100.0 * violating / max(crit.size, 1)
    return _largest_absolute(signed)


def sync_ratio_bounds(pairs: GatePairs, sim_ratio: float | Sequence[float], shocks_of: np.ndarray) -> Bounds | None:
    """Bounds of (simulated paired ratio) / (real paired ratio) when each real replay is shocked: `shocks_of`
    holds one column per replay id of `pairs` (its `replay_columns` order); `sim_ratio` the calibration's ratio,
    or one per refit. None without rows or ids."""
    if pairs.size == 0 or pairs.replay is None:
        return None
    _, column = pairs.replay_columns()
    p95s = []
    for values, col in ((pairs.mine, column[0]), (pairs.twin, column[1])):
        finite = np.isfinite(values)  # each group's p95 over its own finite latencies, as `metrics.p95_ratio`
        if not finite.any():
            return None
        p95s.append(np.percentile(values[finite][None, :] * np.exp(shocks_of[:, col[finite]]), 95, axis=1))
    real = p95s[0] / p95s[1]
    low, high = _interval(per_draw(np.atleast_1d(np.asarray(sim_ratio, dtype=float))[:, None], real.size)[:, 0] / real)
    return float(low), float(high)


__all__ = ["LEVEL", "N_DRAWS", "Bounds", "critical_factors", "p95_error_bounds", "per_draw", "replay_shocks",
           "slo_error_bounds", "sync_ratio_bounds"]
