"""Stage schedule-index: join the per-regime schedule indexes into runs/schedules/index.csv."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.schedules.stage import build_index


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    return f"runs/schedules/index.csv: {len(build_index(params, root))} schedules"
