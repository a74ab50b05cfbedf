"""Stage fidelity: the simulator's calibration judged on the held-out seeds' real replays (runs/fidelity/)."""

from __future__ import annotations

from pathlib import Path

from syncsafe.analysis.calibration import fidelity_stage
from syncsafe.config import Params


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    e = fidelity_stage(params, root).evidence
    return f"fidelity ({e.calibration}): " + ("licensed" if e.licenses() else "not licensed") + f": {e.describe()}"
