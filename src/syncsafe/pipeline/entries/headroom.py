"""Stage headroom: per regime, each headroom policy's matched-random -> oracle gap split into its online bound
and what only foresight buys (syncsafe.tuning.stage)."""

from __future__ import annotations

from pathlib import Path

from syncsafe.config import Params
from syncsafe.tuning.search import describe_headroom
from syncsafe.tuning.stage import write_headroom


def run(params: Params, root: Path, regime: str, params_path: Path) -> str:
    return "\n".join(f"headroom {describe_headroom(regime, policy, table)}"
                     for policy, table in write_headroom(params, regime, root).items())
