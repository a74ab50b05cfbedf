"""The calibrate-fit and fidelity stages: what they read, what they write.

`calibrate_fit_stage` -> `runs/calibration/` (swapped in whole):
`calibration.json` (the fitted `Calibration`, `fitted: true`, or the shipped
defaults with `fitted: false` when no fit is possible), `fit.json` (why not,
the fit seeds, the fit replays: every replay of every fit seed, each seed's
repeated no-sync controls included; diagnostics and the per-replay fit
residuals), `refits.json` (the fit repeated on the fit replays shocked at
the server's wander, `refits`: the fit's own run-to-run variation, which
the fidelity bounds carry), `mechanism.json` (`MechanismEvidence` from every real replay),
`transfer.csv` (mechanism measures real vs simulated on the fit seeds) and
`report.md`; then `pace.png` (`report.pace_figure`, every real replay's
no-merge pace against its replay order), written atomically into the set
after the swap. It reads the vLLM replays and the server profile only: no
simulator replay, so the replay-simulator stage can depend on it without a
cycle.

`fidelity_stage` -> `runs/fidelity/`: `fidelity.json` (`FidelityEvidence`,
read by the analyze stage), `fidelity.csv` (per held-out replay), `cdf.png`
(real vs simulated latency CDFs, merge-active and inactive, per held-out
replay) and `report.md`. The calibration judged is the one the simulator
replay stage used (`replay.simulator.calibration`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from syncsafe.analysis.calibration.fidelity import FIDELITY_COLUMNS, fidelity_evidence, save_cdf_figure
from syncsafe.analysis.calibration.fit import CalibrationFit, fit_calibration
from syncsafe.analysis.calibration.mechanism import controls_noise, mechanism_evidence, transfer_table
from syncsafe.analysis.calibration.refits import CalibrationRefits, Fit, refit_calibrations
from syncsafe.analysis.calibration.records import ReplayRecord, invalid_replays, read_vllm_records, simulate_record
from syncsafe.analysis.calibration.report import (
    PACE_FIGURE_FILE,
    render_fidelity_report,
    render_fit_report,
    save_pace_figure,
)
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import (
    read_fit,
    read_refits,
    read_server_profile,
    read_vllm_plan,
    write_calibration_dir,
    write_fidelity_dir,
)
from syncsafe.artifacts.replay_sets import read_set_index, read_summary
from syncsafe.config import Params, max_num_seqs
from syncsafe.control.serving_model import Calibration, load_calibration, simulator_calibration
from syncsafe.realarm.engine_profile import ServerProfile
from syncsafe.realarm.design import RealPlan, vllm_seed_split
from syncsafe.realarm.gate import ReplayNoise

CALIBRATION_DIR = layout.CALIBRATION
FIDELITY_DIR = layout.FIDELITY
CALIBRATION_FILE = layout.CALIBRATION_FILE
MECHANISM_FILE = layout.MECHANISM_FILE
FIDELITY_FILE = layout.FIDELITY_FILE
SIMULATOR_SETS = layout.replay_set_rel(layout.SIMULATOR)


@dataclass(frozen=True)
class FitResult:
    calibration: Calibration
    mechanism: MechanismEvidence
    transfer: pd.DataFrame
    fit: dict
    files: dict[str, Path]


@dataclass(frozen=True)
class FidelityResult:
    evidence: FidelityEvidence
    table: pd.DataFrame
    files: dict[str, Path]


def calibrate_fit_stage(params: Params, root: Path = Path(".")) -> FitResult:
    """Fit the simulator to the fit seeds' real replays and the profile; measure the mechanism gate."""
    root = Path(root)
    cfg = params.replay.vllm
    fit_seeds, held = vllm_seed_split(params)
    base = Calibration()
    if not cfg.enabled:
        reason = "replay.vllm.enabled is false: nothing was replayed on a real server"
        return _write_fit(root, base, MechanismEvidence(regimes={}), pd.DataFrame(), [], [],
                          {"fitted": False, "reason": reason, "fit_seeds": fit_seeds}, reason, [],
                          CalibrationRefits(reason=reason))
    records = read_vllm_records(params, root)
    fit_records = [r for r in records if r.seed in fit_seeds]  # every replay of every fit seed, repeats included
    profile = read_server_profile(root, ServerProfile)

    def fit_on(replays: list[ReplayRecord], measured: ServerProfile | None) -> CalibrationFit:
        return fit_calibration(replays, base, profile=measured, max_batch=max_num_seqs(cfg.server_args))

    started = time.perf_counter()
    try:
        if not fit_records:
            raise ValueError(f"no vLLM replay of the fit seeds {fit_seeds}")
        fit = fit_on(fit_records, profile)
        reason = None
    except ValueError as err:  # too little real data: the defaults stand, and the files say why
        fit, reason = CalibrationFit(base, {}), str(err)
    wall_s = time.perf_counter() - started
    why_not = (f"no fit to refit: {reason}" if reason is not None
               else None if any(r.seed in held for r in records)
               else f"no real replay of the held-out seeds {held}: no fidelity figure for refits to bound")
    started = time.perf_counter()
    refits = _refits(fit_records, profile, lambda replays, measured: fit_on(replays, measured).calibration,
                     controls_noise(records), params.analysis.fidelity_refits, why_not)
    refits_wall_s = time.perf_counter() - started
    mechanism, skipped = mechanism_evidence(records, params.replay.high_pressure, params.analysis.gate_ratio_threshold,
                                            slo_multiplier=params.replay.slo.multiplier,
                                            plan=read_vllm_plan(root, RealPlan))
    mechanism = mechanism.model_copy(update={"invalid_replays": invalid_replays(root)})
    sims = [simulate_record(r, fit.calibration) for r in fit_records]
    transfer = transfer_table(fit_records, sims, params.replay.high_pressure) if fit_records else pd.DataFrame()
    info = {
        "fitted": fit.calibration.fitted, "reason": reason, "fit_seeds": fit_seeds, "held_out_seeds": held,
        "fit_replays": [r.name for r in fit_records], "profile": profile is not None,
        "fit_wall_s": wall_s, "refits": len(refits.calibrations), "refits_wall_s": refits_wall_s,
        "diagnostics": fit.diagnostics,
    }
    return _write_fit(root, fit.calibration, mechanism, transfer, skipped, info["fit_replays"], info, reason,
                      records, refits)


def _refits(fit_records: list[ReplayRecord], profile: ServerProfile | None, fit: Fit, noise: ReplayNoise | None,
            n: int, why_not: str | None) -> CalibrationRefits:
    """The fit's run-to-run variation (`refits`), or why there is none."""
    if why_not is not None:
        return CalibrationRefits(reason=why_not)
    if noise is None:
        return CalibrationRefits(reason="no seed with two no-sync controls: no replay wander to refit at")
    if n == 0:
        return CalibrationRefits(replay_sd=noise.sd, replay_sd_df=noise.df, reason="analysis.fidelity_refits is 0")
    return refit_calibrations(fit_records, profile, fit, noise, n, seed=0)


def _write_fit(root: Path, calibration: Calibration, mechanism: MechanismEvidence, transfer: pd.DataFrame,
               skipped: list[str], fit_replays: list[str], info: dict, reason: str | None,
               records: list[ReplayRecord], refits: CalibrationRefits) -> FitResult:
    report = render_fit_report(calibration, info.get("diagnostics", {}), transfer, mechanism, skipped, fit_replays,
                               reason)

    files = write_calibration_dir(root, calibration, mechanism, info, transfer, report, refits)
    # the set's writer takes no figure: the pace figure goes in after the swap, atomically on its own
    out = layout.calibration_dir(root)
    files = {**files, PACE_FIGURE_FILE: save_pace_figure(records, out / PACE_FIGURE_FILE)}
    return FitResult(calibration, mechanism, transfer, info, files)


def fidelity_stage(params: Params, root: Path = Path(".")) -> FidelityResult:
    """Judge the simulator's calibration on the held-out seeds' real replays; write runs/fidelity/."""
    root = Path(root)
    cfg = params.replay.vllm
    fit_seeds, held = vllm_seed_split(params)
    calibration = simulator_calibration(params.replay.simulator.calibration, root)
    notes = []
    used = replayed_calibrations(root)
    if used and any(c != calibration for c in used):  # judge what the simulator replays actually ran on
        notes.append(f"the simulator replays did not run on {layout.FITTED_CALIBRATION.as_posix()} "
                     "(the replay stage ran before calibrate-fit); judged: the calibration they ran on")
        calibration = next((c for c in used if not c.fitted), used[0])
    if not calibration.fitted:
        notes.append("the simulator ran on the shipped defaults (calibration: default): "
                     + _fit_reason(root))
    replayed = read_vllm_records(params, root) if cfg.enabled else []
    records = [r for r in replayed if r.seed in held]
    if not cfg.enabled:
        notes.append("replay.vllm.enabled is false: no real replay to judge the simulator on")
    elif not records:
        notes.append(f"no real replay of the held-out seeds {held}")
    targets = params.analysis.fidelity
    refits = _judged_refits(root, calibration, notes) if records else []
    if records:
        evidence, table, sims = fidelity_evidence(
            records, calibration, fit_seeds=fit_seeds, held_out_seeds=held, targets=targets,
            slo_multiplier=params.replay.slo.multiplier, notes=notes, noise=controls_noise(replayed),
            refits=refits)
    else:
        evidence = FidelityEvidence(calibration="fitted" if calibration.fitted else "default", targets=targets,
                                    fit_seeds=sorted(fit_seeds), held_out_seeds=sorted(held), notes=notes)
        table, sims = pd.DataFrame(columns=list(FIDELITY_COLUMNS)), []
    report = render_fidelity_report(evidence, table)

    files = write_fidelity_dir(root, evidence, table, report, lambda path: save_cdf_figure(records, sims, path))
    return FidelityResult(evidence, table, files)


def _judged_refits(root: Path, judged: Calibration, notes: list[str]) -> list[Calibration]:
    """The refits of the calibration being judged (`refits`); none, and a note why, when it is not the one
    calibrate-fit fitted and refitted."""
    fitted = layout.at(root, layout.FITTED_CALIBRATION)
    if not judged.fitted or not fitted.is_file() or load_calibration(fitted) != judged:
        return []
    refits = read_refits(root, CalibrationRefits)
    if refits is None or not refits.calibrations:
        why = "calibrate-fit wrote none" if refits is None else (refits.reason or "none succeeded")
        notes.append(f"the bounds carry the held-out replays' wander only, not the fit's: no refits ({why})")
        return []
    return list(refits.calibrations)


def replayed_calibrations(root: Path) -> list[Calibration]:
    """The distinct calibrations the simulator replay sets under `root` ran on (first replay of each set)."""
    found: list[Calibration] = []
    for index in sorted(layout.at(root, SIMULATOR_SETS).glob(f"*/{layout.INDEX_FILE}")):
        paths = read_set_index(index, columns=("path",))["path"]
        replay = layout.at(root, str(paths.iloc[0])) if len(paths) else None
        if replay is not None and (replay / layout.SUMMARY_FILE).is_file():
            recorded = read_summary(replay, keys=()).get("calibration")
            try:
                cal = Calibration.model_validate(recorded)
            except ValidationError:  # no calibration recorded, or one of an older model: nothing to compare
                continue
            if cal not in found:
                found.append(cal)
    return found


def _fit_reason(root: Path) -> str:
    fit = read_fit(root)
    if fit is not None and fit.get("reason"):
        return str(fit["reason"])
    return "replay.simulator.calibration is null or names an unfitted file"
