"""What the real arm checks of its own replays before they count: pooled SLO, noise floor, load, intervals.

- **Pooled SLO** (`pooled_slo`): a seed's SLO thresholds come from all of
  its valid no-sync controls pooled (their requests together), not from
  one replay whose p95 rests on a handful of slow requests.
- **Noise floor** (`controls_drift`): did the server change under the
  regime's replays? A replay-level pace that merely wanders is noise, not a
  change: on the 2-core machine back-to-back identical no-sync replays of
  one warmed server spread 10-44 % in p95 E2E (benchmarks/bench_carryover.py;
  the pace wanders in spells of 10-20 wall seconds, as long as a burst,
  whose p95 it then sets), far beyond their requests' sampling noise. The
  randomised rounds of each seed's block (`design.seed_block`) make such wandering
  noise for every comparison, and the gate judges merges against the
  controls' own disagreement (`gate`); what order cannot make harmless is a
  server that drifts over the run (still warming, slowed by what ran
  before). So the test asks whether the controls' p95 E2E follows their
  place in the replay order: the statistic is the sum over seeds of the
  correlation (Pearson) of each seed's controls' log p95 with their
  replay positions; under the null of one stationary server, however much
  it wanders, the positions of a seed's controls are exchangeable, so the
  exact null comes from permuting them within each seed (every arrangement
  when there are at most `EXACT_ARRANGEMENTS`, else `resamples` drawn).
  Two-sided p = share of arrangements with |sum| >= the observed. A regime
  with p < `control_alpha` gets one more control per seed (at the end of
  the run, where a drift shows most); tested again with them and still
  below, its seeds are left out with the reason (their replays are marked
  invalid, so nothing downstream counts them). The false leave-out rate is
  at most `control_alpha` under any stationary server, wandering in long
  spells or not (tests/unit/realarm/test_control_noise.py checks it, shows
  the replaced block-permutation test leaving out such servers far above
  its alpha, and that a drifting server is caught). Few controls cannot
  show a drift: the test states the smallest p its design can reach
  (`min_p`; two seeds of three controls: 1/36), and a design whose `min_p`
  is not below `control_alpha` says so rather than claiming a check.
- **Load met** (`overload_reason`): a no-sync control whose TTFT p95 passes
  the bound the capacity search measured (`capacity_ttft_factor` x the
  light-load TTFT p95) ran on an overloaded server: invalid "overloaded",
  never re-planned mid-run.
- **Intervals** (`replay_intervals`): each replay's p95 E2E and SLO
  violation rate with percentile-bootstrap 95 % intervals
  (`scipy.stats.bootstrap`), seeded per replay.
"""

from __future__ import annotations

import itertools
import math
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


#: Up to this many arrangements of the controls' positions, the drift test's null is enumerated exactly.
EXACT_ARRANGEMENTS = 20_000


@dataclass(frozen=True)
class ControlTest:
    """The drift test of a regime's no-sync controls (see the module docstring)."""

    #: Sum over seeds of the correlation of the controls' log p95 E2E with their replay positions.
    statistic: float
    p_value: float
    #: The smallest p this design (seeds and their control counts) can reach.
    min_p: float
    controls: int
    seeds: int

    def disagree(self, alpha: float) -> bool:
        return self.p_value < alpha

    def can_detect(self, alpha: float) -> bool:
        return self.min_p < alpha

    def describe(self) -> str:
        return (f"{self.controls} no-sync controls of {self.seeds} seed(s): correlation of their log p95 E2E with "
                f"replay position summed {self.statistic:+.2f} (drift test p {self.p_value:.3g}, smallest attainable "
                f"{self.min_p:.3g})")


def _correlation(values: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of `values` (rows: arrangements) with `positions`; 0 where either is flat."""
    a = values - values.mean(axis=-1, keepdims=True)
    b = positions - positions.mean()
    denom = np.sqrt((a**2).sum(axis=-1) * (b**2).sum())
    return np.divide((a * b).sum(axis=-1), denom, out=np.zeros(a.shape[:-1]), where=denom > 0)


def drift_min_p(controls_per_seed: Sequence[int]) -> float:
    """The smallest p the drift test can reach with these control counts (one arrangement of the largest
    |sum| among all, for controls whose p95s differ)."""
    return 1.0 / float(np.prod([math.factorial(c) for c in controls_per_seed if c >= 2] or [1]))


def controls_drift(controls: dict[int, Sequence[tuple[int, pd.DataFrame]]], resamples: int, seed: Sequence[int]
                   ) -> ControlTest | None:
    """The drift test of the module docstring. `controls`: per seed, its no-sync controls as (replay position,
    per-request table). None when no seed has two measured controls."""
    series = []  # per seed: (replay positions, log p95 E2E) of its measured controls
    for per_seed in controls.values():
        measured = sorted((pos, float(np.log(np.percentile(e, 95)))) for pos, e in
                          ((pos, _ok_e2e(table)) for pos, table in per_seed) if e.size)
        if len(measured) >= 2:
            series.append(np.array(measured, dtype=float).T)
    if not series:
        return None
    observed = float(sum(_correlation(v[None, :], pos)[0] for pos, v in series))
    fewest = drift_min_p([v.size for _, v in series])  # 1 / the number of arrangements
    if 1.0 / fewest <= EXACT_ARRANGEMENTS:
        sums = np.zeros(1)
        for pos, v in series:  # every arrangement: the sums over seeds of every seed's permutations
            per = _correlation(np.array([v[list(p)] for p in itertools.permutations(range(v.size))]), pos)
            sums = (sums[:, None] + per[None, :]).ravel()
        p_value = float(np.mean(np.abs(sums) >= abs(observed) - 1e-9))
        min_p = float(np.mean(np.abs(sums) >= np.abs(sums).max() - 1e-9))
    else:
        rng = np.random.default_rng(list(seed))
        sums = np.zeros(resamples)
        for pos, v in series:
            sums += _correlation(rng.permuted(np.tile(v, (resamples, 1)), axis=1), pos)
        p_value = float((1 + np.sum(np.abs(sums) >= abs(observed) - 1e-9)) / (1 + resamples))
        min_p = float(max(fewest, 1.0 / (1 + resamples)))
    return ControlTest(statistic=observed, p_value=p_value, min_p=min_p, controls=sum(v.size for _, v in series),
                       seeds=len(series))


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
