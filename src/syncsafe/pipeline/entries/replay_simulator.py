"""Stage replay-simulator: every schedule of one regime against the (calibrated) simulator."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.realarm.design import simulator_time_scale
from syncsafe.serving.replay import replay_simulator


def run(params: Params, root: Path, regime: str, params_path: Path) -> str:
    replays = replay_simulator(params, regime, root, time_scale=simulator_time_scale(root, regime))
    return f"replay simulator {regime}: {len(replays)} replays"
