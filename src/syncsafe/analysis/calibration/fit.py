"""Fit the iteration-level serving model to the server profile and the fit seeds' real replays.

Wall time throughout (`records.simulate_record`). Every fit seed given is
used, and every no-sync control of each (the first and the repeats), so
warm-up drift between replays averages out instead of one control deciding.

1. **Profile** (`profile_prior`, from `syncsafe.realarm.engine_profile`): the decode
   probes' mean inter-token latency at `n` sequences in flight is one
   iteration of a batch of `n`, so a least-squares line through them gives
   `iter_base_ms` (intercept) and `decode_ms_per_seq` (slope); the prefill
   probes' server-side prefill time against prompt length gives
   `prefill_ms_per_token`; the same decode probes under merge interference
   give the merge's compute share `1 - itl / itl_merge` (mean over `n`).
2. **Service** (`fit_service`), on the no-sync controls: one common log
   scale of the three iteration costs (within x0.5..2 of the profile when
   there is one), the API server's `request_overhead_ms` and
   `token_overhead_ms` (latency outside the engine), fitted *jointly* by
   bounded Nelder-Mead (`scipy.optimize.minimize`, restarted once from its
   optimum with a smaller simplex) on the unit cube of their bounds.
   Objective, per control then averaged: mean |log(sim / real)| of the p25,
   p50, p75 and p95 E2E, the p50 and p95 TTFT and the p10, p50 and p90
   decode pace ((E2E - TTFT) / (tokens - 1)), and the median per-request
   |log(sim / real)| of each (requests paired by id: each brings its own
   prompt, output and batch, which is what tells the engine's cost, growing
   with the batch, from the per-token overhead, which does not). The
   first pass runs the deterministic model (`residual_sigma` 0).
   `pressure_slowdown` joins the search only when the fit replays *applied*
   inference pressure (`ReplayRecord.pressure_applied`); the vLLM arm
   applies none, so it is fixed at 0 and the diagnostics say so
   (`NO_PRESSURE`).
3. **Jitter** (`estimate_sigma`), not searched: the measured within-replay
   spread. Residual of a request: log of its real decode pace (requests with
   two tokens or more and `merge_active` false) over the fitted model's
   deterministic pace for the same request, centred on its replay's median
   (a replay uniformly slower than another is drift, not jitter); spread:
   1.4826 x the median absolute residual, pooled over the controls (a
   robust sigma). The simulator's jitter is drawn per `jitter_step_s` and a
   pace averages it over the request's decode, so the spread is matched
   through the simulator: `residual_sigma` solves spread(simulated at
   sigma, `JITTER_DRAWS` jitter draws per control) = spread(real)
   (`scipy.optimize.brentq` on [0, SIGMA_MAX]); 0 when the model explains
   the real paces exactly. Jitter's queues lift the latency quantiles, so
   the costs are fitted again at that sigma and sigma measured again around
   them, until it moves less than `SIGMA_TOL` (at most `JITTER_ROUNDS`).
4. **Merge** (`fit_calibration`), on the replays with merges:
   `merge_compute_share` (bounded 1-D search on [0, 1]: 1 is a full stall)
   for each `merge_share_skew` of a small grid (objective: mean |log| of
   simulated / real p50 and p95 E2E and p50 TTFT per replay and, weighted
   double, p95 of the twin-defined merge-active requests).

`max_batch` is the server's `--max-num-seqs`. The diagnostics carry the
per-replay residuals of every fit replay (`residuals`: p95 E2E and SLO-rate,
simulated vs real, by the replay's own SLO) and their summary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import brentq, minimize, minimize_scalar

from syncsafe.analysis.calibration.mechanism import active_pairs, nominal_life_s
from syncsafe.analysis.calibration.records import (
    ReplayRecord,
    control_records,
    no_sync_records,
    ok_mask,
    p95,
    simulate_record,
)
from syncsafe.control.serving_model import MAX_MERGE_SHARE, Calibration
from syncsafe.realarm.engine_profile import ServerProfile, profile_prior
from syncsafe.realarm.gate import merge_active
from syncsafe.serving.metrics import derive_slo, violation_mask

#: Fewest no-sync requests the replay step accepts.
MIN_SERVICE_ROWS = 10
SKEW_GRID = (-0.5, 0.0, 0.5)
SCALE_BOUNDS = (math.log(0.1), math.log(10.0))
PROFILED_SCALE_BOUNDS = (math.log(0.5), math.log(2.0))
PRESSURE_BOUNDS = (0.0, 2.0)
#: Largest jitter sigma the spread match may return.
SIGMA_MAX = 1.0
#: Jitter draws per control the simulated spread averages over, and the seed step between them.
JITTER_DRAWS = 4
JITTER_SEED_STEP = 7919
#: MAD -> sigma of a normal.
MAD_TO_SIGMA = 1.4826
E2E_QUANTILES = (25, 50, 75, 95)
TTFT_QUANTILES = (50, 95)
PACE_QUANTILES = (10, 50, 90)
#: Nelder-Mead's budget per start (two starts).
MAX_EVALS = 300
#: Most rounds of (sigma from the residuals, costs at that sigma); they stop once sigma moves less than SIGMA_TOL.
JITTER_ROUNDS = 4
SIGMA_TOL = 0.01
NO_PRESSURE = "not fitted: the real replays applied no inference pressure"


@dataclass(frozen=True)
class CalibrationFit:
    """A fitted calibration and how the fit went (`diagnostics["residuals"]`: one dict per fit replay)."""

    calibration: Calibration
    diagnostics: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class _Target:
    """A real replay's columns in the row order of its simulation (request ids sorted, cut at the span)."""

    rec: ReplayRecord
    ok: np.ndarray
    e2e: np.ndarray
    ttft: np.ndarray
    tokens: np.ndarray
    no_merge: np.ndarray

    @classmethod
    def of(cls, rec: ReplayRecord) -> _Target:
        ids = rec.by_id()
        if rec.span_s is not None:
            ids = ids[ids["arrival_s"] < rec.span_s]
        col = lambda name: ids[name].to_numpy(dtype=float)  # noqa: E731
        return cls(rec, ok_mask(ids), col("e2e_ms"), col("ttft_ms"), col("output_tokens_received"),
                   ~ids["merge_active"].to_numpy(dtype=bool))


def _inputs_key(rec: ReplayRecord) -> object:
    """Records with equal keys simulate identically: the no-sync controls of a seed (same arrivals)."""
    if not rec.is_no_sync:
        return id(rec)
    ids = rec.by_id()
    return (rec.key, rec.time_scale, rec.span_s, id(rec.timeline), ids.index.to_numpy().tobytes(),
            ids["arrival_s"].to_numpy(dtype=float).tobytes(), ids["output_tokens"].to_numpy().tobytes())


def simulate_all(records: Sequence[ReplayRecord], cal: Calibration) -> list[ReplayRecord]:
    """Each record simulated (`simulate_record`), the controls of a seed once; the records' own metadata kept."""
    done: dict[object, ReplayRecord] = {}
    out = []
    for rec in records:
        key = _inputs_key(rec)
        if key not in done:
            done[key] = simulate_record(rec, cal)
        out.append(replace(rec, results=done[key].results))
    return out


def _sim_columns(targets: Sequence[_Target], cal: Calibration) -> list[tuple[np.ndarray, np.ndarray]]:
    """Simulated (E2E, TTFT) of each target, in its row order."""
    return [(s.results["e2e_ms"].to_numpy(dtype=float), s.results["ttft_ms"].to_numpy(dtype=float))
            for s in simulate_all([t.rec for t in targets], cal)]


def _log_error(sim: float | None, real: float | None) -> float | None:
    return abs(math.log(sim / real)) if sim and real and sim > 0 and real > 0 else None


# --------------------------------------------------------------------------- service


def service_error(targets: Sequence[_Target], sims: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean over controls of the mean |log(sim / real)| of E2E, TTFT and decode-pace quantiles and of their
    paired per-request medians (the module docstring)."""
    per_control = []
    for t, (e2e, ttft) in zip(targets, sims):
        errors: list[float | None] = []
        paced = t.ok & (t.tokens >= 2)
        pace = (_pace(t.e2e, t.ttft, t.tokens)[paced], _pace(e2e, ttft, t.tokens)[paced])
        for a, b, qs in ((t.e2e[t.ok], e2e[t.ok], E2E_QUANTILES), (t.ttft[t.ok], ttft[t.ok], TTFT_QUANTILES),
                         (*pace, PACE_QUANTILES)):
            if not a.size:
                continue
            errors += [_log_error(sq, rq) for sq, rq in zip(np.percentile(b, qs), np.percentile(a, qs))]
            keep = (a > 0) & (b > 0)
            if keep.any():
                errors.append(float(np.median(np.abs(np.log(b[keep] / a[keep])))))
        known = [e for e in errors if e is not None]
        if known:
            per_control.append(float(np.mean(known)))
    return float(np.mean(per_control)) if per_control else math.inf


@dataclass(frozen=True)
class _Coordinate:
    name: str
    lo: float
    hi: float
    start: float

    def value(self, x: float) -> float:
        return self.lo + float(np.clip(x, 0.0, 1.0)) * (self.hi - self.lo)

    def unit(self, v: float) -> float:
        return float(np.clip((v - self.lo) / (self.hi - self.lo), 0.0, 1.0)) if self.hi > self.lo else 0.0


def fit_service(controls: Sequence[ReplayRecord], prior: Calibration, *, profiled: bool, fit_pressure: bool,
                sigma: float = 0.0, start: Calibration | None = None) -> tuple[Calibration, dict[str, Any]]:
    """Cost scale (of `prior`'s costs), request and token overheads (and pressure, when applied) fitted
    jointly on the controls at jitter `sigma`, from `start` (default: `prior`, no overhead)."""
    targets = [_Target.of(c) for c in controls]
    costs = (prior.iter_base_ms, prior.prefill_ms_per_token, prior.decode_ms_per_seq)
    e2e = float(np.median(np.concatenate([t.e2e[t.ok] for t in targets])))
    out = float(np.median(np.concatenate([c.results["output_tokens"].to_numpy(dtype=float) for c in controls])))
    first = start or prior.model_copy(update={"request_overhead_ms": 0.0, "token_overhead_ms": 0.0})
    scale = first.iter_base_ms / costs[0] if costs[0] > 0 else 1.0
    coords = [_Coordinate("log_scale", *(PROFILED_SCALE_BOUNDS if profiled else SCALE_BOUNDS), math.log(scale)),
              _Coordinate("request_overhead_ms", 0.0, e2e, first.request_overhead_ms),
              _Coordinate("token_overhead_ms", 0.0, e2e / max(out, 1.0), first.token_overhead_ms)]
    if fit_pressure:
        coords.append(_Coordinate("pressure_slowdown", *PRESSURE_BOUNDS, first.pressure_slowdown))
    base = prior.model_copy(update={"residual_sigma": sigma, **({} if fit_pressure else {"pressure_slowdown": 0.0})})

    def at(x: np.ndarray) -> Calibration:
        v = {c.name: c.value(xi) for c, xi in zip(coords, x)}
        k = math.exp(v.pop("log_scale"))
        return base.model_copy(update=dict(iter_base_ms=costs[0] * k, prefill_ms_per_token=costs[1] * k,
                                           decode_ms_per_seq=costs[2] * k, **v))

    def objective(x: np.ndarray) -> float:
        return service_error(targets, _sim_columns(targets, at(x)))

    x = np.array([c.unit(c.start) for c in coords])
    nfev = 0
    for step in (0.25, 0.08):  # then a restart from the optimum with a fresh, smaller simplex
        away = np.where(x > 0.5, -step, step)  # each vertex steps into the cube
        simplex = np.vstack([x, *(x + away[i] * np.eye(len(x))[i] for i in range(len(x)))])
        res = minimize(objective, x, method="Nelder-Mead", bounds=[(0.0, 1.0)] * len(x),
                       options={"initial_simplex": simplex, "xatol": 1e-3, "fatol": 1e-5, "maxfev": MAX_EVALS})
        x, nfev = np.asarray(res.x), nfev + int(res.nfev)
    diag: dict[str, Any] = {"service_log_error": float(res.fun), "service_evaluations": nfev,
                            "cost_scale": math.exp(coords[0].value(x[0]))}
    for c, xi in zip(coords, x):
        if c.name != "log_scale" and xi >= 1.0 - 1e-6:
            diag[f"{c.name}_at_bound"] = c.hi
    return at(x), diag


# --------------------------------------------------------------------------- jitter


def _pace(e2e: np.ndarray, ttft: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return (e2e - ttft) / np.maximum(tokens - 1.0, 1.0)


def pace_residuals(t: _Target, e2e: np.ndarray, ttft: np.ndarray) -> np.ndarray:
    """log(real / model decode pace) per no-merge request with two tokens or more, centred on its median."""
    keep = t.ok & t.no_merge & (t.tokens >= 2)
    real, model = _pace(t.e2e, t.ttft, t.tokens)[keep], _pace(e2e, ttft, t.tokens)[keep]
    fine = (real > 0) & (model > 0) & np.isfinite(real) & np.isfinite(model)
    r = np.log(real[fine] / model[fine])
    return r - np.median(r) if r.size else r


def residual_spread(targets: Sequence[_Target], models: Sequence[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """Robust sigma (1.4826 x median |residual|) of the pooled `pace_residuals`; None without residuals."""
    pooled = np.concatenate([pace_residuals(t, *m) for t, m in zip(targets, models)] or [np.empty(0)])
    return MAD_TO_SIGMA * float(np.median(np.abs(pooled))) if pooled.size else None


def estimate_sigma(controls: Sequence[ReplayRecord], cal: Calibration) -> tuple[float, dict[str, Any]]:
    """`residual_sigma` whose simulated pace spread matches the real one (see the module docstring)."""
    targets = [_Target.of(c) for c in controls]
    deterministic = _sim_columns(targets, cal.model_copy(update={"residual_sigma": 0.0}))
    real = residual_spread(targets, deterministic)
    diag: dict[str, Any] = {"pace_residual_spread_real": real}
    if not real:
        return 0.0, diag
    # the same statistic with the jittered model's latencies as the real ones, over JITTER_DRAWS jitter draws
    # per control (the jitter stream is seeded by the record's seed: one draw would be one realisation's spread)
    draws = [replace(t, rec=replace(t.rec, seed=t.rec.seed + JITTER_SEED_STEP * k))
             for k in range(JITTER_DRAWS) for t in targets]
    models = deterministic * JITTER_DRAWS

    def gap(sigma: float) -> float:
        sims = _sim_columns(draws, cal.model_copy(update={"residual_sigma": sigma}))
        jittered = [replace(t, e2e=e, ttft=f) for t, (e, f) in zip(draws, sims)]
        return (residual_spread(jittered, models) or 0.0) - real

    if gap(SIGMA_MAX) < 0:
        diag["residual_sigma_at_bound"] = SIGMA_MAX
        return SIGMA_MAX, diag
    return float(brentq(gap, 0.0, SIGMA_MAX, xtol=1e-3)), diag


# --------------------------------------------------------------------------- merges


@dataclass(frozen=True)
class _MergeTargets:
    """The merge replays' real quantiles and twin-defined merge-active p95, and where the simulated
    merge-active rows are (membership by arrival and the simulated first control's median life: fixed
    while only the merge share and skew move)."""

    targets: list[_Target]
    active_p95_real: float | None
    active_rows: list[np.ndarray]

    @classmethod
    def of(cls, merges: Sequence[ReplayRecord], controls: Sequence[ReplayRecord], cal: Calibration) -> _MergeTargets:
        firsts = no_sync_records(simulate_all(controls, cal))
        rows = []
        for rec in merges:
            twin = firsts[rec.key].by_id()
            ids = rec.by_id()
            if rec.span_s is not None:
                ids = ids[ids["arrival_s"] < rec.span_s]
            shared = np.isin(ids.index.to_numpy(), twin.index.to_numpy())
            life = nominal_life_s(firsts[rec.key])
            active = merge_active(rec.replayed_schedule(), ids["arrival_s"].to_numpy(dtype=float), life)
            rows.append(np.flatnonzero(shared & active))
        return cls([_Target.of(m) for m in merges], p95(active_pairs([*merges, *controls]).mine), rows)

    def error(self, cal: Calibration) -> float:
        """Mean |log(sim / real)| of p50 and p95 E2E and p50 TTFT per merge replay and, weighted double,
        of the p95 of the merge-active requests pooled over the replays."""
        sims = _sim_columns(self.targets, cal)
        errors: list[float | None] = []
        for t, (e2e, ttft) in zip(self.targets, sims):
            if t.ok.any():
                real = np.percentile(t.e2e[t.ok], (50, 95)).tolist() + [float(np.percentile(t.ttft[t.ok], 50))]
                sim = np.percentile(e2e, (50, 95)).tolist() + [float(np.percentile(ttft, 50))]
                errors += [_log_error(a, b) for a, b in zip(sim, real)]
        active = _log_error(p95(np.concatenate([s[0][r] for s, r in zip(sims, self.active_rows)])),
                            self.active_p95_real)
        known = [e for e in [*errors, active, active] if e is not None]
        return float(np.mean(known)) if known else math.inf


def _search(objective: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """Bounded 1-D minimum, after a coarse grid (bounds included) so a flat start cannot trap it."""
    grid = np.linspace(lo, hi, 9)
    values = [objective(float(g)) for g in grid]
    i = int(np.argmin(values))
    left, right = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    best = minimize_scalar(objective, bounds=(left, right), method="bounded", options={"xatol": 1e-3})
    return (float(best.x), float(best.fun)) if best.fun < values[i] else (float(grid[i]), float(values[i]))


# --------------------------------------------------------------------------- the fit


def fit_calibration(
    real: Sequence[ReplayRecord],
    base: Calibration | None = None,
    *,
    profile: ServerProfile | None = None,
    max_batch: int | None = None,
    fit_merge_share: bool = True,
) -> CalibrationFit:
    """The calibration fitted to the profile and every real replay of the fit seeds (`fitted=True`).

    `real` must hold each seed's no-sync replay and at least one replay with
    merge-active requests. Raises ValueError when the data cannot support a fit.
    """
    real = list(real)
    if not real:
        raise ValueError("no replays to fit the calibration to")
    no_sync_records(real)  # raises, naming any seed without a no-sync control
    cal = base or Calibration()
    if max_batch:
        cal = cal.model_copy(update={"max_batch": int(max_batch)})
    controls = [c for _, cs in sorted(control_records(real).items()) for c in cs]
    merges = [r for r in real if r.has_merges and not r.is_no_sync]
    diag: dict[str, Any] = {"n_replays": len(real), "n_controls": len(controls),
                            "fit_seeds": sorted({r.seed for r in real})}
    if profile is not None:
        cal, prior = profile_prior(profile, cal)
        diag.update(prior)
    n_rows = sum(int(ok_mask(r.results).sum()) for r in controls)
    if n_rows < MIN_SERVICE_ROWS:
        raise ValueError(f"only {n_rows} completed no-sync requests: too few to fit the server (need {MIN_SERVICE_ROWS})")
    if fit_merge_share and not merges:
        raise ValueError("no replay with merges among the fit seeds: the merge's compute share cannot be fitted")

    pressured = any(r.pressure_applied for r in real)
    how = dict(profiled=profile is not None, fit_pressure=pressured)
    fitted, service = fit_service(controls, cal, **how)
    sigma, rounds = 0.0, 0
    while rounds < JITTER_ROUNDS:  # sigma from the residuals around the costs, then the costs at that sigma
        rounds += 1
        previous, (sigma, jitter) = sigma, estimate_sigma(controls, fitted)
        if abs(sigma - previous) < SIGMA_TOL:
            break
        fitted, service = fit_service(controls, cal, **how, sigma=sigma, start=fitted)
    diag.update(jitter, jitter_rounds=rounds)
    cal = fitted.model_copy(update={"residual_sigma": sigma})
    diag.update(service)
    diag["pressure_slowdown"] = "fitted: the replays applied inference pressure" if pressured else NO_PRESSURE
    targets = [_Target.of(c) for c in controls]
    diag["no_sync_log_error"] = service_error(targets, _sim_columns(targets, cal))
    if fit_merge_share:
        merge_targets = _MergeTargets.of(merges, controls, cal)
        best: tuple[float, Calibration] | None = None
        for skew in SKEW_GRID:
            c_k = cal.model_copy(update={"merge_share_skew": skew})
            s, err = _search(lambda v: merge_targets.error(c_k.model_copy(update={"merge_compute_share": v})),
                             0.0, MAX_MERGE_SHARE)
            if best is None or err < best[0] - 1e-9:
                best = (err, c_k.model_copy(update={"merge_compute_share": s}))
        assert best is not None
        cal = best[1]
        diag["merge_log_error"] = best[0]
        if cal.full_stall:
            diag["merge_share_note"] = "a full stall: the server makes no progress for (at least half of) a merge"
    cal = cal.model_copy(update={"capacity_rps": cal.full_batch_capacity_rps(), "fitted": True})
    cal = Calibration.model_validate(cal.model_dump())  # re-validated: every field within its bounds
    residuals = fit_residuals(real, cal)
    diag["residuals"] = residuals
    diag.update(residual_summary(residuals))
    return CalibrationFit(cal, diag)


def fit_residuals(real: Sequence[ReplayRecord], cal: Calibration, slo_multiplier: float = 1.5) -> list[dict[str, Any]]:
    """Per fit replay (every control included): real and simulated p95 E2E and SLO-violation % (the replay's own
    SLO, else its seed's first control's), with the p95 relative error and the SLO-rate error in pp."""
    twins = no_sync_records(real)
    out = []
    for rec, sim in zip(real, simulate_all(real, cal)):
        real_p95 = p95(rec.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(rec.results)])
        sim_p95 = p95(sim.results["e2e_ms"].to_numpy(dtype=float))
        slo = rec.slo or derive_slo(twins[rec.key].results, slo_multiplier)
        slo_real = 100.0 * float(violation_mask(rec.results, slo).mean())
        slo_sim = 100.0 * float(violation_mask(sim.results, slo).mean())
        out.append({"replay": rec.name, "regime": rec.regime, "seed": rec.seed, "label": rec.label,
                    "control": rec.control, "position": rec.position, "p95_ms_real": real_p95, "p95_ms_sim": sim_p95,
                    "p95_rel_error": sim_p95 / real_p95 - 1.0 if real_p95 and sim_p95 else None,
                    "slo_pct_real": slo_real, "slo_pct_sim": slo_sim, "slo_error_pp": slo_sim - slo_real})
    return out


def residual_summary(residuals: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Mean and max |p95 relative error| and |SLO-rate error| over the fit replays."""
    out: dict[str, float | None] = {}
    for key in ("p95_rel_error", "slo_error_pp"):
        values = np.abs([r[key] for r in residuals if r[key] is not None])
        out[f"fit_{key}_mean"] = float(values.mean()) if values.size else None
        out[f"fit_{key}_max"] = float(values.max()) if values.size else None
    return out
