"""Stage schedules: controller schedules plus matched-random, offline-bound and no-sync baselines of one regime."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.schedules.stage import build_schedules


def run(params: Params, root: Path, regime: str, params_path: Path) -> str:
    return f"schedules {regime}: {len(build_schedules(params, regime, root))} schedules"
