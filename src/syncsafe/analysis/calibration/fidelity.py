"""Held-out fidelity: the simulator against real replays of seeds the fit never saw.

Every held-out real replay (the held-out seeds' no-sync, controller and
matched-random replays) is simulated on its own wall-time inputs with the
calibration the simulator replay stage used. Per replay: the real and
simulated SLO-violation rate (judged by the replay's own SLO) and p95 E2E.
Per held-out seed and controller with matched-random draws: controller SLO %
minus the mean SLO % of its draws, on the real server and in the simulator
(`SignAgreement`). Pooled over the held-out seeds: the paired sync ratio
(twin-defined merge-active, `mechanism.active_pairs`) simulated / real.
Each judged figure carries 95 % bounds under the server's replay-to-replay
wander (`fidelity_bounds`) on the held-out side and, through refits of the
calibration on shocked fit replays (`refits`), on the fitted side, so a
figure is met, missed or undecided.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from syncsafe.analysis.calibration.fidelity_bounds import (
    Bounds,
    critical_factors,
    p95_error_bounds,
    replay_shocks,
    slo_error_bounds,
    sync_ratio_bounds,
)
from syncsafe.analysis.calibration.mechanism import active_pairs
from syncsafe.analysis.calibration.records import (
    ReplayRecord,
    no_sync_records,
    ok_mask,
    p95,
    simulate_record,
    without_later_controls,
)
from syncsafe.analysis.evidence import FidelityEvidence, RegimeFidelity, SignAgreement
from syncsafe.analysis.figures import write_png
from syncsafe.config import FidelityTargets
from syncsafe.io import atomic_path
from syncsafe.control.serving_model import Calibration
from syncsafe.realarm.gate import GatePairs, ReplayNoise
from syncsafe.serving.metrics import SloSpec, derive_slo, p95_ratio, violation_mask

FIDELITY_COLUMNS = (
    "regime", "seed", "policy", "draw", "matched_to", "source", "label", "n_requests",
    "slo_pct_real", "slo_pct_sim", "slo_abs_error_pp", "p95_ms_real", "p95_ms_sim", "p95_rel_error",
)  # fmt: skip


def _slo_for(rec: ReplayRecord, twins: Mapping[tuple[str, int], ReplayRecord], multiplier: float) -> SloSpec:
    return rec.slo if rec.slo is not None else derive_slo(twins[rec.key].results, multiplier)


def _judged(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord]) -> list[tuple[ReplayRecord, ReplayRecord]]:
    """The (real, simulated) records the table judges: repeats of a seed's no-sync control left out."""
    first = {id(r) for r in without_later_controls(real)}
    return [(rec, sim) for rec, sim in zip(real, sims) if id(rec) in first]


def fidelity_table(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord], slo_multiplier: float = 1.5
                   ) -> pd.DataFrame:
    """Per held-out replay (repeats left out): real vs simulated SLO % and p95 E2E, with the errors."""
    twins = no_sync_records(real)
    rows = []
    for rec, sim in _judged(real, sims):
        slo = _slo_for(rec, twins, slo_multiplier)
        real_pct = 100.0 * float(violation_mask(rec.results, slo).mean())
        sim_pct = 100.0 * float(violation_mask(sim.results, slo).mean())
        a = p95(rec.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(rec.results)])
        b = p95(sim.results["e2e_ms"].to_numpy(dtype=float))
        rows.append({
            "regime": rec.regime, "seed": rec.seed, "policy": rec.schedule.policy, "draw": rec.schedule.draw,
            "matched_to": rec.schedule.matched_to, "source": rec.schedule.source, "label": rec.label, "n_requests": len(rec.results),
            "slo_pct_real": real_pct, "slo_pct_sim": sim_pct, "slo_abs_error_pp": abs(sim_pct - real_pct),
            "p95_ms_real": a, "p95_ms_sim": b,
            "p95_rel_error": abs(b - a) / a if a and b is not None else None,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(FIDELITY_COLUMNS)).astype({"draw": "Int64"})


def sign_agreement(table: pd.DataFrame) -> list[SignAgreement]:
    """Per (regime, seed, controller) with draws: controller minus mean-of-draws SLO %, real and simulated."""
    out = []
    controllers = table[table["source"].isin(["train", "harness", "live"])]
    for row in controllers.itertuples(index=False):
        draws = table[(table["source"] == "matched_random") & (table["regime"] == row.regime)
                      & (table["seed"] == row.seed) & (table["matched_to"] == row.policy)]
        if draws.empty:
            continue
        out.append(SignAgreement(
            regime=row.regime, policy=row.policy, seed=int(row.seed), n_draws=len(draws),
            real_delta_pct=float(row.slo_pct_real - draws["slo_pct_real"].mean()),
            sim_delta_pct=float(row.slo_pct_sim - draws["slo_pct_sim"].mean()),
        ))  # fmt: skip
    return out


def _errors(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(p95 relative errors, SLO-rate errors) of fidelity-table rows; a p95 error that could not be computed
    (no real or simulated p95) is infinite, so it fails its target instead of dropping out."""
    p95_err = table["p95_rel_error"].to_numpy(dtype=float)
    return np.where(np.isfinite(p95_err), p95_err, np.inf), table["slo_abs_error_pp"].to_numpy(dtype=float)


@dataclass(frozen=True)
class _Figures:
    """One set of held-out records' judged figures, and the paired sync ratios behind the third."""

    fidelity: RegimeFidelity
    real_ratio: float | None
    sim_ratio: float | None


@dataclass(frozen=True)
class _Simulated:
    """What the simulator predicts for a set of held-out records, per calibration (the judged one, or each
    refit): per judged replay its p95 and SLO %, and the paired sync ratio."""

    p95_ms: np.ndarray
    slo_pct: np.ndarray
    ratio: float | None

    @classmethod
    def of(cls, real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord], slo_multiplier: float) -> _Simulated:
        table, pairs = fidelity_table(real, sims, slo_multiplier), active_pairs(list(sims))
        return cls(table["p95_ms_sim"].to_numpy(dtype=float), table["slo_pct_sim"].to_numpy(dtype=float),
                   p95_ratio(pairs.mine, pairs.twin))


def _error_bounds(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord], table: pd.DataFrame,
                  real_pairs: GatePairs, point: _Simulated, refits: Sequence[_Simulated], noise: ReplayNoise | None,
                  slo_multiplier: float, seed: int = 0) -> dict[str, Bounds]:
    """95 % bounds of the judged figures of `table` (the fidelity table of these records; `real_pairs` their
    gate rows; `point` the judged calibration's predictions, `refits` each refit's) under the replay wander
    `noise` (`fidelity_bounds`); the finite ones, by field name. Empty without noise. A refit whose prediction
    of a figure is missing is left out of that figure's bounds; with none left, the judged calibration's stands."""
    if noise is None or table.empty:
        return {}
    judged, twins = _judged(real, sims), no_sync_records(real)
    shocks = replay_shocks(noise, len(judged), seed)
    factors = [critical_factors(rec.results, _slo_for(rec, twins, slo_multiplier)) for rec, _ in judged]
    p95_rows = [s.p95_ms for s in refits if np.isfinite(s.p95_ms).all()] or [point.p95_ms]
    slo_rows = [s.slo_pct for s in refits if np.isfinite(s.slo_pct).all()] or [point.slo_pct]
    out = {"p95_rel_error_max": p95_error_bounds(table["p95_ms_real"].tolist(), np.stack(p95_rows), shocks),
           "slo_abs_error_pp_max": slo_error_bounds(factors, np.stack(slo_rows), shocks)}
    ratios = [s.ratio for s in refits if s.ratio is not None] or [r for r in (point.ratio,) if r is not None]
    if real_pairs.replay is not None and ratios:
        shocks_of = replay_shocks(noise, real_pairs.replay_columns()[0], seed + 1)
        ratio = sync_ratio_bounds(real_pairs, ratios, shocks_of)
        if ratio is not None:
            out["sync_ratio_paired_sim_over_real"] = ratio
    return {k: v for k, v in out.items() if all(math.isfinite(x) for x in v)}


def _figures(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord], table: pd.DataFrame,
             noise: ReplayNoise | None, slo_multiplier: float,
             refit_sims: Sequence[Sequence[ReplayRecord]] = ()) -> _Figures:
    """The errors of `table` (the fidelity table of these real and simulated records), the paired sync ratios,
    and the bounds of the judged figures (through the refits' simulations of the same records, when given)."""
    p95_err, slo_err = _errors(table)
    real_pairs, sim_pairs = active_pairs(list(real)), active_pairs(list(sims))
    real_ratio, sim_ratio = p95_ratio(real_pairs.mine, real_pairs.twin), p95_ratio(sim_pairs.mine, sim_pairs.twin)
    point = _Simulated(table["p95_ms_sim"].to_numpy(dtype=float), table["slo_pct_sim"].to_numpy(dtype=float), sim_ratio)
    refits = [_Simulated.of(real, refit, slo_multiplier) for refit in refit_sims]
    fidelity = RegimeFidelity(
        n_held_out_replays=len(table), p95_rel_error_max=float(p95_err.max()) if p95_err.size else None,
        slo_abs_error_pp_max=float(slo_err.max()) if slo_err.size else None,
        sync_ratio_paired_sim_over_real=sim_ratio / real_ratio if real_ratio and sim_ratio else None,
        bounds=_error_bounds(real, sims, table, real_pairs, point, refits, noise, slo_multiplier))
    return _Figures(fidelity, real_ratio, sim_ratio)


def fidelity_evidence(
    held_out: Sequence[ReplayRecord], calibration: Calibration, *, fit_seeds: Sequence[int],
    held_out_seeds: Sequence[int], targets: FidelityTargets, slo_multiplier: float = 1.5,
    notes: Sequence[str] = (), noise: ReplayNoise | None = None, refits: Sequence[Calibration] = (),
) -> tuple[FidelityEvidence, pd.DataFrame, list[ReplayRecord]]:
    """FidelityEvidence of `calibration` on the held-out replays, the per-replay table and the simulated records;
    `noise`: the server's replay-to-replay wander the figures' bounds carry (None: judged as measured);
    `refits`: `calibration` refitted on shocked fit replays (`refits`), whose spread the bounds carry too."""
    sims = [simulate_record(r, calibration) for r in held_out]
    refit_sims = [[simulate_record(r, cal) for r in held_out] for cal in refits] if noise is not None else []
    table = fidelity_table(held_out, sims, slo_multiplier)

    def of(regime: str, records: Sequence[ReplayRecord]) -> list[ReplayRecord]:
        return [r for r in records if r.regime == regime]

    per_regime = {
        regime: _figures(of(regime, held_out), of(regime, sims), table[table["regime"] == regime], noise,
                         slo_multiplier, [of(regime, refit) for refit in refit_sims])
        for regime in sorted({r.regime for r in held_out})
    }
    # one regime: its figures are the pooled ones (same records, same table)
    pooled = (next(iter(per_regime.values())) if len(per_regime) == 1
              else _figures(held_out, sims, table, noise, slo_multiplier, refit_sims))
    p95_err, slo_err = _errors(table)
    finite = p95_err[np.isfinite(p95_err)]
    evidence = FidelityEvidence(
        calibration="fitted" if calibration.fitted else "default", targets=targets,
        fit_seeds=sorted(fit_seeds), held_out_seeds=sorted(held_out_seeds), n_held_out_replays=len(table),
        p95_rel_error_max=pooled.fidelity.p95_rel_error_max,
        p95_rel_error_mean=float(finite.mean()) if finite.size else None,
        slo_abs_error_pp_max=pooled.fidelity.slo_abs_error_pp_max,
        slo_abs_error_pp_mean=float(slo_err.mean()) if slo_err.size else None,
        sync_ratio_paired_real=pooled.real_ratio, sync_ratio_paired_sim=pooled.sim_ratio,
        sync_ratio_paired_sim_over_real=pooled.fidelity.sync_ratio_paired_sim_over_real,
        bounds=pooled.fidelity.bounds,
        replay_sd=None if noise is None else noise.sd, replay_sd_df=None if noise is None else noise.df,
        refits=len(refit_sims),
        regimes={regime: figures.fidelity for regime, figures in per_regime.items()},
        sign_agreement=sign_agreement(table), notes=list(notes),
    )  # fmt: skip
    return evidence, table, sims


def cdf_figure(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord]) -> Figure:
    """Real vs simulated E2E CDFs of merge-active and inactive requests (their no-sync twin's life), per replay."""
    pairs = [(r, s) for r, s in zip(real, sims) if r.has_merges and not r.is_no_sync]
    cols = min(4, max(len(pairs), 1))
    rows = max(math.ceil(len(pairs) / cols), 1)
    figure = Figure(figsize=(3.6 * cols, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    twins = no_sync_records(real)
    for ax, (rec, sim) in zip(axes.flat, pairs):
        twin = twins[rec.key].by_id()
        for label, table, style in (("real", rec.by_id(), "-"), ("sim", sim.by_id(), "--")):
            ids = table.index.intersection(twin.index)
            start = twin.loc[ids, "arrival_s"].to_numpy(dtype=float)
            end = start + twin.loc[ids, "e2e_ms"].to_numpy(dtype=float) / 1000.0 * rec.time_scale
            active = rec.replayed_schedule().overlaps(start, end)
            e2e = table.loc[ids, "e2e_ms"].to_numpy(dtype=float)
            for group, mask, color in (("merge-active", active, "C3"), ("inactive", ~active, "C0")):
                values = np.sort(e2e[mask & np.isfinite(e2e)])
                if values.size:
                    ax.plot(values, np.arange(1, values.size + 1) / values.size, style, color=color,
                            label=f"{group} {label}")
        ax.set_xscale("log")
        ax.set_title(rec.name, fontsize="small")
        ax.set_xlabel("E2E ms")
    for ax in list(axes.flat)[len(pairs):]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=4, fontsize="small")
    return figure


def save_cdf_figure(real: Sequence[ReplayRecord], sims: Sequence[ReplayRecord], path: str | os.PathLike[str]) -> Path:
    with atomic_path(path) as tmp:
        write_png(cdf_figure(real, sims), tmp)
    return Path(path)
