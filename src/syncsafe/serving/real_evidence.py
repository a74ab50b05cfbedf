"""What the real arm checks of its own replays before they count: pooled SLO, noise floor, load, intervals.

- **Pooled SLO** (`pooled_slo`): a seed's SLO thresholds come from all of
  its valid no-sync controls pooled (their requests together), not from
  one replay whose p95 rests on a handful of slow requests.
- **Noise floor** (`controls_disagree`): do a seed's no-sync controls
  disagree beyond their own sampling noise? The p95 of a few hundred
  requests moves by several percent between identical replays, so a fixed
  spread threshold (the old `max_control_spread` 10 %) left seeds out by
  chance. The statistic is the spread of the controls' p95 E2E,
  (max - min) / median (`control_spread`); its null distribution (the
  server did not change: the controls are exchangeable replays of the same
  arrivals) comes from block permutation: every control is rebuilt block
  by block (`CONTROL_BLOCK_S` trace seconds of arrivals), the controls'
  data of each block dealt to the controls in a random order, which keeps
  the correlation of requests that queued together. p = (1 + #{resampled spread >= observed})
  / (1 + resamples). A seed with p < `control_alpha` gets one more control;
  tested again with it and still below, it is left out with the reason
  (its replays are marked invalid, so nothing downstream counts them). The
  null is one server throughout: replays differ by per-request and
  per-block noise (slow spells shorter than a block); a pace that differs
  between whole replays is the change the test is there to catch. Under
  that null the false leave-out rate is at most `control_alpha`
  (tests/unit/serving/test_control_noise.py checks it on synthetic
  identical replays, and that a shifted server is caught).
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
from dataclasses import dataclass

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


#: Trace seconds of arrivals per resampled block of the noise test (the gate's block length).
CONTROL_BLOCK_S = 10.0


@dataclass(frozen=True)
class ControlTest:
    """The noise test of one seed's no-sync controls (see the module docstring)."""

    spread: float
    p_value: float
    controls: int

    def disagree(self, alpha: float) -> bool:
        return self.p_value < alpha

    def describe(self) -> str:
        return f"{self.controls} no-sync controls' p95 spread {self.spread:.0%} (noise test p {self.p_value:.3g})"


def _blocks(results: pd.DataFrame, block_s: float) -> dict[int, np.ndarray]:
    ok = results[~failed_mask(results)]
    e2e = ok["e2e_ms"].to_numpy(dtype=float)
    block = np.floor(ok["arrival_s"].to_numpy(dtype=float) / block_s).astype(np.int64)
    keep = np.isfinite(e2e)
    return {int(b): e2e[keep & (block == b)] for b in np.unique(block[keep])}


def controls_disagree(controls: Sequence[pd.DataFrame], resamples: int, seed: Sequence[int],
                      block_s: float = CONTROL_BLOCK_S) -> ControlTest | None:
    """The noise test of the module docstring on replays of the same arrivals (`arrival_s` in trace seconds);
    None with fewer than two measured controls."""
    blocks = [b for b in (_blocks(c, block_s) for c in controls) if b]
    observed = control_spread(controls)
    if len(blocks) < 2 or observed is None:
        return None
    keys = sorted(set().union(*blocks))
    rng = np.random.default_rng(list(seed))
    exceed = 0
    for _ in range(resamples):
        # per block, the controls' data dealt to the controls in a random order (a permutation, not draws with
        # replacement: two rebuilt controls sharing a block would agree more than two replays do)
        sources = np.argsort(rng.random((len(keys), len(blocks))), axis=1).T
        p95s = []
        for row in sources:
            parts = [blocks[src].get(key) for src, key in zip(row, keys)]
            values = np.concatenate([v for v in parts if v is not None and v.size] or [np.empty(0)])
            if values.size:
                p95s.append(float(np.percentile(values, 95)))
        if len(p95s) >= 2 and (max(p95s) - min(p95s)) / np.median(p95s) >= observed - 1e-12:
            exceed += 1
    return ControlTest(spread=observed, p_value=(1 + exceed) / (1 + resamples), controls=len(blocks))


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
