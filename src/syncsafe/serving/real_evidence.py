"""What the real arm checks of its own replays before they count: pooled SLO, noise floor, load, intervals.

- **Pooled SLO** (`pooled_slo`): a seed's SLO thresholds come from all of
  its valid no-sync controls pooled (their requests together), not from
  one replay whose p95 rests on a handful of slow requests.
- **Noise floor** (`control_spread`): the spread of a seed's no-sync
  controls' p95 E2E, (max - min) / median. Identical loads on a quiet
  machine should agree; a seed over `max_control_spread` gets one more
  control, and still over it is left out with the reason (its replays are
  marked invalid, so nothing downstream counts them).
- **Load met** (`overload_reason`): a no-sync control whose TTFT p95 passes
  the bound the capacity search measured (`capacity_ttft_factor` x the
  light-load TTFT p95) ran on an overloaded server: invalid "overloaded",
  never re-planned mid-run.
- **Intervals** (`replay_intervals`): each replay's p95 E2E and SLO
  violation rate with percentile-bootstrap 95 % intervals
  (`scipy.stats.bootstrap`), seeded per replay.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from syncsafe.config import Params
from syncsafe.serving.metrics import SloSpec, failed_mask, violation_mask
from syncsafe.serving.replay import resolve_slo


def pooled_slo(params: Params, controls: Sequence[pd.DataFrame]) -> SloSpec:
    """The seed's SLO from its no-sync controls' requests pooled (params' fixed thresholds win)."""
    if not controls:
        raise ValueError("no no-sync control to derive an SLO from")
    return resolve_slo(params, pd.concat(list(controls), ignore_index=True))


def _ok_e2e(results: pd.DataFrame) -> np.ndarray:
    e2e = results.loc[~failed_mask(results), "e2e_ms"].to_numpy(dtype=float)
    return e2e[np.isfinite(e2e)]


def control_spread(controls: Sequence[pd.DataFrame]) -> float | None:
    """(max - min) / median of the controls' p95 E2E; None with fewer than two measured controls."""
    p95s = [float(np.percentile(e, 95)) for e in map(_ok_e2e, controls) if e.size]
    if len(p95s) < 2:
        return None
    return float((max(p95s) - min(p95s)) / np.median(p95s))


def overload_reason(results: pd.DataFrame, ttft_bound_ms: float | None) -> str | None:
    """'overloaded: ...' when a no-sync replay's TTFT p95 passes the capacity search's bound, else None."""
    if ttft_bound_ms is None:
        return None
    ttft = results.loc[~failed_mask(results), "ttft_ms"].to_numpy(dtype=float)
    ttft = ttft[np.isfinite(ttft)]
    if not ttft.size:
        return None
    p95 = float(np.percentile(ttft, 95))
    if p95 <= ttft_bound_ms:
        return None
    return (f"overloaded: no-sync TTFT p95 {p95:.0f} ms > {ttft_bound_ms:.0f} ms, the bound the capacity "
            "search sustained (capacity_ttft_factor x the light-load TTFT p95)")


def replay_intervals(results: pd.DataFrame, slo: SloSpec, resamples: int, seed: Sequence[int]) -> dict:
    """Percentile-bootstrap 95 % intervals of the replay's p95 E2E (ms) and SLO violation rate."""
    rng = np.random.default_rng(list(seed))
    e2e = _ok_e2e(results)
    violated = np.asarray(violation_mask(results, slo), dtype=float)
    out: dict[str, list[float] | None] = {"e2e_p95_ci_ms": None, "slo_violation_rate_ci": None}
    if e2e.size >= 2:
        ci = stats.bootstrap((e2e,), lambda x, axis: np.percentile(x, 95, axis=axis), n_resamples=resamples,
                             method="percentile", random_state=rng, vectorized=True).confidence_interval
        out["e2e_p95_ci_ms"] = [float(ci.low), float(ci.high)]
    if violated.size >= 2:
        if violated.min() == violated.max():  # all alike: every resample is the same rate
            out["slo_violation_rate_ci"] = [float(violated[0]), float(violated[0])]
        else:
            ci = stats.bootstrap((violated,), np.mean, n_resamples=resamples, method="percentile",
                                 random_state=rng, vectorized=True).confidence_interval
            out["slo_violation_rate_ci"] = [float(ci.low), float(ci.high)]
    return out
