"""Stage live: the controller as a sidecar beside a real vLLM server on the wall clock, gating real DiLoCo merges.

One call per regime (live.regimes, or the chosen ones); with live.enabled false the stage only writes
an empty runs/live/index.csv (`off`).
"""

from __future__ import annotations

from pathlib import Path

from syncsafe.artifacts.live_runs import build_live_index
from syncsafe.config import ConfigError, Params, split_policy


def run(params: Params, root: Path, regime: str, params_path: Path, *, policy: str | None = None,
        seeds: list[int] | None = None) -> str:
    name = policy or params.live.policy
    try:
        split_policy(name)
    except ValueError as exc:
        raise ConfigError(f"--policy: {exc}") from None
    chosen = seeds or params.live.seeds or params.seeds
    for value in chosen:
        if value not in params.seeds:
            raise ConfigError(f"--seed {value}: not in seeds ({params.seeds})")
    # imported here: the live runner pulls in torch, transformers and the islands, which the stage switched
    # off (`off`, the cpu default) does not need (about 8 s of imports per stage process)
    from syncsafe.live.sidecar import run_live

    index = run_live(params, params_path, regime, name, chosen, root)
    return f"live {regime}: {len(index)} runs in runs/live/index.csv"


def off(params: Params, root: Path) -> str:
    return f"live: off (live.enabled: false); {len(build_live_index(root))} runs in runs/live/index.csv"
