"""Stage replay-index: join the replay sets of the regimes, seeds and policies in params into the replay index."""

from __future__ import annotations

from pathlib import Path

from syncsafe.artifacts import layout
from syncsafe.config import Params
from syncsafe.serving.replay import build_replay_index


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    return f"{layout.REPLAY_INDEX.as_posix()}: {len(build_replay_index(root, params))} replays"
