"""Stage schedule-index: join the per-regime schedule indexes into the schedule index."""

from __future__ import annotations

from pathlib import Path

from syncsafe.artifacts import layout
from syncsafe.config import Params
from syncsafe.schedules.stage import build_index


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    return f"{layout.SCHEDULE_INDEX.as_posix()}: {len(build_index(params, root))} schedules"
