"""Stage replay-vllm: the configured subset of schedules against a real vLLM server (replay.vllm)."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.realarm.replays import replay_vllm


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    return f"replay vllm: {len(replay_vllm(params, root))} replays"
