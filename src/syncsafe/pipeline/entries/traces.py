"""Stage traces: load timeline and request list per seed of one regime."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.traces.stage import build_traces


def run(params: Params, root: Path, regime: str, params_path: Path) -> str:
    written = build_traces(params, regime, root)
    return f"traces {regime}: {len(written)} files for seeds {params.seeds}"
