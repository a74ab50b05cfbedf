"""The calibrate-fit and fidelity stages: what they read, what they write.

`calibrate_fit_stage` -> `runs/calibration/` (swapped in whole):
`calibration.json` (the fitted `Calibration`, `fitted: true`, or the shipped
defaults with `fitted: false` when no fit is possible), `fit.json` (why not,
the fit seeds, diagnostics and fit residuals), `mechanism.json`
(`MechanismEvidence` from every real replay), `transfer.csv` (mechanism
measures real vs simulated on the fit seeds) and `report.md`. It reads the
vLLM replays and the server profile only: no simulator replay, so the
replay-simulator stage can depend on it without a cycle.

`fidelity_stage` -> `runs/fidelity/`: `fidelity.json` (`FidelityEvidence`,
read by the analyze stage), `fidelity.csv` (per held-out replay), `cdf.png`
(real vs simulated latency CDFs, merge-active and inactive, per held-out
replay) and `report.md`. The calibration judged is the one the simulator
replay stage used (`replay.simulator.calibration`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import ValidationError

from syncsafe import io
from syncsafe.analysis.calibration.fidelity import FIDELITY_COLUMNS, fidelity_evidence, save_cdf_figure
from syncsafe.analysis.calibration.fit import CalibrationFit, fit_calibration
from syncsafe.analysis.calibration.mechanism import mechanism_evidence, transfer_table
from syncsafe.analysis.calibration.records import VLLM_PROFILE, read_vllm_records, simulate_record
from syncsafe.analysis.calibration.report import render_fidelity_report, render_fit_report
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.config import Params
from syncsafe.control.serving_model import Calibration, simulator_calibration
from syncsafe.serving.profile import ServerProfile, max_num_seqs
from syncsafe.serving.vllm_plan import vllm_seed_split

CALIBRATION_DIR = Path("runs") / "calibration"
FIDELITY_DIR = Path("runs") / "fidelity"
CALIBRATION_FILE = "calibration.json"
MECHANISM_FILE = "mechanism.json"
FIDELITY_FILE = "fidelity.json"
SIMULATOR_SETS = Path("runs") / "replay-sets" / "simulator"


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
                          {"fitted": False, "reason": reason, "fit_seeds": fit_seeds}, reason)
    records = read_vllm_records(params, root)
    fit_records = [r for r in records if r.seed in fit_seeds]
    profile_path = root / VLLM_PROFILE
    profile = ServerProfile.read(profile_path) if profile_path.is_file() else None
    started = time.perf_counter()
    try:
        if not fit_records:
            raise ValueError(f"no vLLM replay of the fit seeds {fit_seeds}")
        fit = fit_calibration(fit_records, base, profile=profile, max_batch=max_num_seqs(cfg.server_args))
        reason = None
    except ValueError as err:  # too little real data: the defaults stand, and the files say why
        fit, reason = CalibrationFit(base, {}), str(err)
    wall_s = time.perf_counter() - started
    mechanism, skipped = mechanism_evidence(records, params.replay.high_pressure)
    sims = [simulate_record(r, fit.calibration) for r in fit_records]
    transfer = transfer_table(fit_records, sims, params.replay.high_pressure) if fit_records else pd.DataFrame()
    info = {
        "fitted": fit.calibration.fitted, "reason": reason, "fit_seeds": fit_seeds, "held_out_seeds": held,
        "fit_replays": [r.name for r in fit_records if not r.repeat], "profile": profile is not None,
        "fit_wall_s": wall_s, "diagnostics": fit.diagnostics,
    }
    return _write_fit(root, fit.calibration, mechanism, transfer, skipped, info["fit_replays"], info, reason)


def _write_fit(root: Path, calibration: Calibration, mechanism: MechanismEvidence, transfer: pd.DataFrame,
               skipped: list[str], fit_replays: list[str], info: dict, reason: str | None) -> FitResult:
    report = render_fit_report(calibration, info.get("diagnostics", {}), transfer, mechanism, skipped, fit_replays,
                               reason)

    def build(tmp: Path) -> None:
        io.write_text(tmp / CALIBRATION_FILE, calibration.model_dump_json(indent=2) + "\n")
        io.write_text(tmp / MECHANISM_FILE, mechanism.model_dump_json(indent=2) + "\n")
        io.write_text(tmp / "fit.json", json.dumps(info, indent=2, default=str) + "\n")
        io.write_csv(tmp / "transfer.csv", transfer)
        io.write_text(tmp / "report.md", report)

    out = io.replace_directory(root / CALIBRATION_DIR, build)
    files = {n: out / n for n in (CALIBRATION_FILE, MECHANISM_FILE, "fit.json", "transfer.csv", "report.md")}
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
        notes.append("the simulator replays did not run on runs/calibration/calibration.json (the replay stage ran "
                     "before calibrate-fit); judged: the calibration they ran on")
        calibration = next((c for c in used if not c.fitted), used[0])
    if not calibration.fitted:
        notes.append("the simulator ran on the shipped defaults (calibration: default): "
                     + _fit_reason(root))
    records = read_vllm_records(params, root, seeds=held) if cfg.enabled else []
    if not cfg.enabled:
        notes.append("replay.vllm.enabled is false: no real replay to judge the simulator on")
    elif not records:
        notes.append(f"no real replay of the held-out seeds {held}")
    targets = params.analysis.fidelity
    if records:
        evidence, table, sims = fidelity_evidence(
            records, calibration, fit_seeds=fit_seeds, held_out_seeds=held, targets=targets,
            slo_multiplier=params.replay.slo.multiplier, notes=notes)
    else:
        evidence = FidelityEvidence(calibration="fitted" if calibration.fitted else "default", targets=targets,
                                    fit_seeds=sorted(fit_seeds), held_out_seeds=sorted(held), notes=notes)
        table, sims = pd.DataFrame(columns=list(FIDELITY_COLUMNS)), []
    report = render_fidelity_report(evidence, table)

    def build(tmp: Path) -> None:
        io.write_text(tmp / FIDELITY_FILE, evidence.model_dump_json(indent=2) + "\n")
        io.write_csv(tmp / "fidelity.csv", table)
        io.write_text(tmp / "report.md", report)
        save_cdf_figure(records, sims, tmp / "cdf.png")

    out = io.replace_directory(root / FIDELITY_DIR, build)
    files = {n: out / n for n in (FIDELITY_FILE, "fidelity.csv", "report.md", "cdf.png")}
    return FidelityResult(evidence, table, files)


def replayed_calibrations(root: Path) -> list[Calibration]:
    """The distinct calibrations the simulator replay sets under `root` ran on (first replay of each set)."""
    found: list[Calibration] = []
    for index in sorted((root / SIMULATOR_SETS).glob("*/index.csv")):
        paths = pd.read_csv(index, usecols=["path"])["path"]
        summary = root / str(paths.iloc[0]) / "summary.json" if len(paths) else None
        if summary is not None and summary.is_file():
            recorded = json.loads(summary.read_text(encoding="utf-8")).get("calibration")
            try:
                cal = Calibration.model_validate(recorded)
            except ValidationError:  # no calibration recorded, or one of an older model: nothing to compare
                continue
            if cal not in found:
                found.append(cal)
    return found


def _fit_reason(root: Path) -> str:
    path = root / CALIBRATION_DIR / "fit.json"
    if path.is_file():
        reason = json.loads(path.read_text(encoding="utf-8")).get("reason")
        if reason:
            return str(reason)
    return "replay.simulator.calibration is null or names an unfitted file"
