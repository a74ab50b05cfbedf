"""Seeded fleet-load timelines, one generator per regime kind.

A timeline is a fixed-step table of what the serving fleet looks like while
training runs beside it: `t_s, busy, arrival_rate, inference_pressure,
network_pressure, checkpoint_pressure`. `busy` marks serving bursts (the
windows a merge should avoid); `arrival_rate` (requests/s) drives the request
generator; the pressures (0..1) are the signals a workload-aware controller
reads.
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from syncsafe.artifacts.traces import TIMELINE_COLUMNS
from syncsafe.config import BurstyRegime, PressureHeavyRegime, SteadyRegime, TraceRegime

RegimeConfig = BurstyRegime | SteadyRegime | PressureHeavyRegime

__all__ = ["TIMELINE_COLUMNS", "RegimeConfig", "checkpoint_pressure", "generate_timeline", "regime_rng"]


def regime_rng(regime: str, seed: int, stream: str) -> np.random.Generator:
    """An independent, reproducible random stream per (regime, seed, purpose)."""
    key = zlib.crc32(f"{regime}/{stream}".encode())
    return np.random.default_rng([seed, key])


def generate_timeline(name: str, regime: RegimeConfig, step_s: float, seed: int) -> pd.DataFrame:
    """Build the load timeline of synthetic regime `name` for `seed` (trace regimes: `trace_regime`)."""
    if isinstance(regime, TraceRegime):
        raise TypeError(f"regime {name!r} is a trace regime: its timeline comes from syncsafe.traces.trace_regime")
    t = np.arange(round(regime.duration_s / step_s)) * step_s
    rng = regime_rng(name, seed, "timeline")
    if isinstance(regime, BurstyRegime):
        busy, rate = _bursty(regime, t, rng)
    elif isinstance(regime, SteadyRegime):
        busy, rate = _steady(regime, t, rng)
    else:
        busy, rate = _pressure_heavy(regime, t, step_s, rng)
    if regime.load_scale != 1.0:  # pressure stays relative to the regime's unscaled peak: more load, more pressure
        rate = rate * regime.load_scale
    peak = _peak_rate(regime)
    inference = np.clip(rate / peak + rng.normal(0.0, 0.03, t.size), 0.0, 1.0)
    network = np.clip(regime.network_base + 0.25 * busy + rng.normal(0.0, 0.03, t.size), 0.0, 1.0)
    checkpoint = checkpoint_pressure(regime, t, step_s, rng)
    return pd.DataFrame(
        {
            "t_s": t,
            "busy": busy.astype(bool),
            "arrival_rate": rate,
            "inference_pressure": inference,
            "network_pressure": network,
            "checkpoint_pressure": checkpoint,
        }
    )


def _peak_rate(regime: RegimeConfig) -> float:
    if isinstance(regime, BurstyRegime):
        return regime.busy_rate * float(np.exp(2 * regime.burst_jitter))
    if isinstance(regime, SteadyRegime):
        return regime.mean_rate * (1 + regime.amplitude)
    return regime.busy_rate


def _bursty(regime: BurstyRegime, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    since_phase = t - regime.phase_s
    busy = (since_phase >= 0) & (np.mod(since_phase, regime.period_s) < regime.window_s)
    burst_index = np.floor(since_phase / regime.period_s).astype(int)
    n_bursts = int(burst_index.max()) + 1 if busy.any() else 0
    intensity = rng.lognormal(0.0, regime.burst_jitter, max(n_bursts, 1))
    rate = np.full(t.size, regime.quiet_rate)
    rate[busy] = regime.busy_rate * intensity[burst_index[busy]]
    return busy, rate


def _steady(regime: SteadyRegime, t: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    wave = np.sin(2 * np.pi * (t - regime.phase_s) / regime.period_s)
    wobble = 1 + rng.normal(0.0, 0.03, t.size)
    rate = regime.mean_rate * (1 + regime.amplitude * wave) * wobble
    level = (wave + 1) / 2  # 0 at the trough, 1 at the peak
    busy = level >= regime.busy_above
    return busy, np.maximum(rate, 0.0)


def _pressure_heavy(
    regime: PressureHeavyRegime, t: np.ndarray, step_s: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    busy = _poisson_episodes(t, step_s, regime.episodes_per_hour, regime.episode_s, rng)
    rate = np.where(busy, regime.busy_rate, regime.base_rate) * (1 + rng.normal(0.0, 0.05, t.size))
    return busy, np.maximum(rate, 0.0)


def checkpoint_pressure(regime: RegimeConfig | TraceRegime, t: np.ndarray, step_s: float, rng: np.random.Generator) -> np.ndarray:
    """Other jobs' checkpoint writes: Poisson-timed plateaus of storage pressure."""
    active = _poisson_episodes(t, step_s, regime.checkpoints_per_hour, regime.checkpoint_s, rng)
    return np.where(active, 0.8, 0.05)


def _poisson_episodes(
    t: np.ndarray, step_s: float, per_hour: float, length_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Boolean mask of episodes of `length_s` whose starts form a Poisson process."""
    duration = t.size * step_s
    n = rng.poisson(per_hour * duration / 3600.0)
    starts = rng.uniform(0.0, duration, n)
    mask = np.zeros(t.size, dtype=bool)
    for s in starts:
        mask |= (t >= s) & (t < s + length_s)
    return mask
