"""Fit the iteration-level serving model to the server profile and the fit seeds' real replays.

Two steps, on wall time (`records.wall_inputs`):

1. **Profile** (`profile_prior`, from `syncsafe.serving.engine_profile`): the decode
   probes' mean inter-token latency at `n` sequences in flight is one
   iteration of a batch of `n`, so a least-squares line through them gives
   `iter_base_ms` (intercept) and `decode_ms_per_seq` (slope); the prefill
   probes' server-side prefill time against prompt length gives
   `prefill_ms_per_token`; the same decode probes under merge interference
   give the merge's compute share `1 - itl / itl_merge` (mean over `n`).
2. **Replays** (`fit_calibration`): what the profile cannot see (HTTP and
   streaming overhead, the arrival process, the real merge windows) is fitted
   through the simulator itself on the fit seeds' replays, coordinate by
   coordinate, each a bounded 1-D search (`scipy.optimize.minimize_scalar`):
   a common scale of the three iteration costs (within x0.5..2 of the profile
   when there is one) and `pressure_slowdown` (grid) on the no-sync replays
   (objective: mean |log| of the simulated / real p50 and p95 E2E and p50
   TTFT); with a profile, the API server's `request_overhead_ms` and
   `token_overhead_ms` (latency outside the engine); `residual_sigma` (grid; also
   searched jointly with the scale and pressure, since the jitter moves the
   quantiles the costs are fitted to), then
   `merge_compute_share` and `merge_share_skew` (grid) on the replays with
   merges (objective: mean |log| of simulated / real p95 E2E of all and of
   the twin-defined merge-active requests).

`max_batch` is the server's `--max-num-seqs`. Fit residuals per fit replay
(p95 and SLO-rate) go to the diagnostics.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize_scalar

from syncsafe.analysis.calibration.mechanism import active_pairs
from syncsafe.analysis.calibration.records import (
    ReplayRecord,
    no_sync_records,
    ok_mask,
    p95,
    simulate_record,
    without_later_controls,
)
from syncsafe.control.serving_model import MAX_MERGE_SHARE, Calibration
from syncsafe.serving.metrics import derive_slo, violation_mask
from syncsafe.serving.engine_profile import ServerProfile, profile_prior

#: Fewest no-sync requests the replay step accepts.
MIN_SERVICE_ROWS = 10
PRESSURE_GRID = (0.0, 0.25, 0.5, 1.0)
SIGMA_GRID = (0.0, 0.1, 0.2, 0.35, 0.5)
SKEW_GRID = (-0.5, 0.0, 0.5)
SCALE_BOUNDS = (math.log(0.1), math.log(10.0))
PROFILED_SCALE_BOUNDS = (math.log(0.5), math.log(2.0))


@dataclass(frozen=True)
class CalibrationFit:
    """A fitted calibration and how the fit went."""

    calibration: Calibration
    diagnostics: dict[str, float | int | str | None] = field(default_factory=dict)


def _quantile_errors(real: Sequence[ReplayRecord], cal: Calibration,
                     twins: Sequence[ReplayRecord] = ()) -> float:
    """Mean |log(sim / real)| of p50 and p95 E2E and p50 TTFT over `real`.

    With `twins` (the no-sync replays of `real`'s seeds), also the p95 of the
    twin-defined merge-active requests (weighted double: the quantity the
    mechanism and the paired sync ratio rest on).
    """
    errors = []
    sims = [simulate_record(r, cal) for r in real]
    for rec, sim in zip(real, sims):
        ok = ok_mask(rec.results)
        for column, qs in (("e2e_ms", (50, 95)), ("ttft_ms", (50,))):
            a = rec.results[column].to_numpy(dtype=float)[ok]
            b = sim.results[column].to_numpy(dtype=float)
            for q in qs:
                qa, qb = np.percentile(a, q), np.percentile(b, q)
                if qa > 0 and qb > 0:
                    errors.append(abs(math.log(qb / qa)))
    if twins:
        a = p95(active_pairs([*real, *twins]).mine)
        b = p95(active_pairs([*sims, *(simulate_record(t, cal) for t in twins)]).mine)
        if a and b:
            errors.extend([abs(math.log(b / a))] * 2)
    return float(np.mean(errors)) if errors else math.inf


def _search(objective: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """Bounded 1-D minimum, after a coarse grid so a flat start cannot trap it."""
    grid = np.linspace(lo, hi, 9)
    values = [objective(float(g)) for g in grid]
    i = int(np.argmin(values))
    left, right = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    best = minimize_scalar(objective, bounds=(left, right), method="bounded", options={"xatol": 1e-3})
    return (float(best.x), float(best.fun)) if best.fun <= values[i] else (float(grid[i]), float(values[i]))


def fit_calibration(
    real: Sequence[ReplayRecord],
    base: Calibration | None = None,
    *,
    profile: ServerProfile | None = None,
    max_batch: int | None = None,
    fit_merge_share: bool = True,
) -> CalibrationFit:
    """The calibration fitted to the profile and the real replays of the fit seeds (`fitted=True`).

    `real` must hold each seed's no-sync replay and at least one replay with
    merge-active requests. Raises ValueError when the data cannot support a fit.
    """
    real = without_later_controls(real)
    if not real:
        raise ValueError("no replays to fit the calibration to")
    cal = base or Calibration()
    if max_batch:
        cal = cal.model_copy(update={"max_batch": int(max_batch)})
    diag: dict[str, float | int | str | None] = {"n_replays": len(real)}
    if profile is not None:
        cal, prior = profile_prior(profile, cal)
        diag.update(prior)
    twins = list(no_sync_records(real).values())
    n_rows = sum(int(ok_mask(r.results).sum()) for r in twins)
    if n_rows < MIN_SERVICE_ROWS:
        raise ValueError(f"only {n_rows} completed no-sync requests: too few to fit the server (need {MIN_SERVICE_ROWS})")
    merges = [r for r in real if r.has_merges and not r.is_no_sync]
    if fit_merge_share and not merges:
        raise ValueError("no replay with merges among the fit seeds: the merge's compute share cannot be fitted")

    costs = (cal.iter_base_ms, cal.prefill_ms_per_token, cal.decode_ms_per_seq)

    def scaled(c: Calibration, log_scale: float) -> Calibration:
        k = math.exp(log_scale)
        return c.model_copy(update=dict(iter_base_ms=costs[0] * k, prefill_ms_per_token=costs[1] * k,
                                        decode_ms_per_seq=costs[2] * k))

    # with a profile the engine's costs are measured: the scale only absorbs machine-to-run drift, and what the
    # client sees beyond the engine is the API server's overhead, fitted next. The jitter moves the quantiles the
    # costs are fitted to, so the scale is searched on every (pressure, jitter) pair of the grids, not one by one.
    bounds = PROFILED_SCALE_BOUNDS if profile is not None else SCALE_BOUNDS
    best: tuple[float, Calibration] | None = None
    for ps in PRESSURE_GRID:
        for sigma in SIGMA_GRID:
            c_ps = cal.model_copy(update={"pressure_slowdown": ps, "residual_sigma": sigma})
            x, err = _search(lambda v: _quantile_errors(twins, scaled(c_ps, v)), *bounds)
            if best is None or err < best[0]:
                best = (err, scaled(c_ps, x))
    assert best is not None
    cal = best[1]
    if profile is not None:
        e2e = np.concatenate([r.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(r.results)] for r in twins])
        out = np.concatenate([r.results["output_tokens"].to_numpy(dtype=float) for r in twins])
        for name, hi in (("request_overhead_ms", float(np.median(e2e))),
                         ("token_overhead_ms", float(np.median(e2e) / max(np.median(out), 1.0)))):
            c_o = cal
            x, _ = _search(lambda v: _quantile_errors(twins, c_o.model_copy(update={name: v})), 0.0, hi)
            cal = cal.model_copy(update={name: x})
    sigma_errors = {s: _quantile_errors(twins, cal.model_copy(update={"residual_sigma": s})) for s in SIGMA_GRID}
    cal = cal.model_copy(update={"residual_sigma": min(sigma_errors, key=sigma_errors.get)})
    diag["no_sync_log_error"] = min(sigma_errors.values())
    if fit_merge_share:
        best_share: tuple[float, Calibration] | None = None
        for skew in SKEW_GRID:
            c_k = cal.model_copy(update={"merge_share_skew": skew})
            s, err = _search(lambda v: _quantile_errors(
                merges, c_k.model_copy(update={"merge_compute_share": v}), twins), 0.0, MAX_MERGE_SHARE)
            if best_share is None or err < best_share[0] - 1e-9:
                best_share = (err, c_k.model_copy(update={"merge_compute_share": s}))
        assert best_share is not None
        cal = best_share[1]
        diag["merge_log_error"] = best_share[0]
    cal = cal.model_copy(update={"capacity_rps": cal.full_batch_capacity_rps(), "fitted": True})
    cal = Calibration.model_validate(cal.model_dump())  # re-validated: every field within its bounds
    diag.update(fit_residuals(real, cal))
    return CalibrationFit(cal, diag)


def fit_residuals(real: Sequence[ReplayRecord], cal: Calibration, slo_multiplier: float = 1.5
                  ) -> dict[str, float | None]:
    """Per fit replay: simulated / real p95 E2E and the SLO-rate error (pp, the replay's own SLO)."""
    twins = no_sync_records(real)
    out: dict[str, float | None] = {}
    for rec in real:
        sim = simulate_record(rec, cal).results
        real_p95 = p95(rec.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(rec.results)])
        sim_p95 = p95(sim["e2e_ms"].to_numpy(dtype=float))
        out[f"p95_sim_over_real[{rec.name}]"] = sim_p95 / real_p95 if real_p95 and sim_p95 else None
        slo = rec.slo or derive_slo(twins[rec.key].results, slo_multiplier)
        out[f"slo_error_pp[{rec.name}]"] = 100.0 * float(violation_mask(sim, slo).mean() - violation_mask(rec.results, slo).mean())
    return out
