"""Stage profile-vllm: the server profile the real arm plans from (replay.vllm), measured on a real vLLM server."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.realarm.server_profile import profile_vllm


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    measured = profile_vllm(params, root)
    loads = ", ".join(f"{r} {load.capacity_rps:.3g} req/s at time scale {load.time_scale:g}"
                      for r, load in measured.loads.items())
    return f"profile vllm: {loads}"
