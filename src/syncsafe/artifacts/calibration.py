"""Calibration and fidelity: runs/calibration/ and runs/fidelity/, and the vLLM server profile.

runs/calibration/ (swapped in whole by the calibrate-fit stage):
`calibration.json` (the simulator's `Calibration`), `mechanism.json`
(`MechanismEvidence`), `fit.json` (why or why not fitted, diagnostics),
`refits.json` (`CalibrationRefits`), `transfer.csv` and `report.md`. runs/fidelity/ (the fidelity stage):
`fidelity.json` (`FidelityEvidence`), `fidelity.csv`, `cdf.png`, `report.md`.
The models themselves live with the code that computes them
(`syncsafe.control.serving_model`, `syncsafe.analysis.evidence`,
`syncsafe.realarm.engine_profile`); the readers here take the model class and
validate the file against it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from pydantic import BaseModel

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactError, ArtifactMalformed, ArtifactMissing, read_json, read_model
from syncsafe.artifacts.layout import PathLike

M = TypeVar("M", bound=BaseModel)


def model_json(model: BaseModel) -> str:
    """How every evidence model is written: indented JSON and a final newline."""
    return model.model_dump_json(indent=2) + "\n"


def write_model(path: PathLike, model: BaseModel) -> Path:
    return io.write_text(path, model_json(model))


def read_calibration(path: PathLike, model: type[M], error: type[ArtifactError] = ArtifactMalformed,
                     missing: type[ArtifactError] = ArtifactMissing) -> M:
    """A calibration file (runs/calibration/calibration.json or one named in params)."""
    return read_model(Path(path), model, "calibration file",
                      hint="run the calibrate-fit stage or set it to null", error=error, missing=missing)


def read_optional(path: PathLike, model: type[M], what: str) -> M | None:
    """The model at `path`, or None when the file does not exist (malformed: ArtifactMalformed)."""
    return read_model(Path(path), model, what) if Path(path).is_file() else None


def read_mechanism(root: PathLike, model: type[M]) -> M | None:
    """runs/calibration/mechanism.json (None when the calibrate-fit stage has not run)."""
    return read_optional(layout.at(root, layout.MECHANISM), model, "mechanism evidence file")


def read_fidelity(root: PathLike, model: type[M]) -> M | None:
    """runs/fidelity/fidelity.json (None when the fidelity stage has not run)."""
    return read_optional(layout.at(root, layout.FIDELITY_EVIDENCE), model, "fidelity evidence file")


def read_server_profile(root: PathLike, model: type[M]) -> M | None:
    """runs/server-profile/profile.json: the engine profile (None when the profile-vllm stage measured none)."""
    return read_optional(layout.at(root, layout.VLLM_PROFILE), model, "server profile")


def read_vllm_plan(root: PathLike, model: type[M]) -> M | None:
    """runs/replay-sets/vllm/plan.json: the real arm's plan and measured loads (None before the vLLM replay)."""
    return read_optional(layout.at(root, layout.VLLM_PLAN), model, "real-arm plan")


def read_fit(root: PathLike) -> dict[str, Any] | None:
    """runs/calibration/fit.json (None when absent)."""
    path = layout.at(root, layout.FIT)
    return read_json(path, "calibration fit file") if path.is_file() else None


def write_calibration_dir(root: PathLike, calibration: BaseModel, mechanism: BaseModel, fit: dict[str, Any],
                          transfer: pd.DataFrame, report: str, refits: BaseModel) -> dict[str, Path]:
    """Swap in runs/calibration/ whole; return its files by name."""

    def build(tmp: Path) -> None:
        write_model(tmp / layout.CALIBRATION_FILE, calibration)
        write_model(tmp / layout.MECHANISM_FILE, mechanism)
        io.write_text(tmp / layout.FIT_FILE, json.dumps(fit, indent=2, default=str) + "\n")
        io.write_csv(tmp / layout.TRANSFER_FILE, transfer)
        io.write_text(tmp / layout.REPORT_FILE, report)
        write_model(tmp / layout.REFITS_FILE, refits)

    out = io.replace_directory(layout.calibration_dir(root), build)
    names = (layout.CALIBRATION_FILE, layout.MECHANISM_FILE, layout.FIT_FILE, layout.TRANSFER_FILE, layout.REPORT_FILE,
             layout.REFITS_FILE)
    return {n: out / n for n in names}


def read_refits(root: PathLike, model: type[M]) -> M | None:
    """runs/calibration/refits.json (None when the calibrate-fit stage has not run, or ran before refits)."""
    return read_optional(layout.at(root, layout.REFITS), model, "calibration refits file")


def write_fidelity_dir(root: PathLike, evidence: BaseModel, table: pd.DataFrame, report: str,
                       cdf_figure: Callable[[Path], object]) -> dict[str, Path]:
    """Swap in runs/fidelity/ whole (`cdf_figure(path)` draws cdf.png); return its files by name."""

    def build(tmp: Path) -> None:
        write_model(tmp / layout.FIDELITY_FILE, evidence)
        io.write_csv(tmp / layout.FIDELITY_TABLE_FILE, table)
        io.write_text(tmp / layout.REPORT_FILE, report)
        cdf_figure(tmp / layout.CDF_FIGURE_FILE)

    out = io.replace_directory(layout.fidelity_dir(root), build)
    names = (layout.FIDELITY_FILE, layout.FIDELITY_TABLE_FILE, layout.REPORT_FILE, layout.CDF_FIGURE_FILE)
    return {n: out / n for n in names}
