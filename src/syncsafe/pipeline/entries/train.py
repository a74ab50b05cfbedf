"""Stage train: DiLoCo islands as processes, merges gated by each policy, per policy x seed of one regime."""

from __future__ import annotations

from pathlib import Path

from syncsafe.artifacts import layout
from syncsafe.config import ConfigError, Params
from syncsafe.diloco.launch import train_regime
from syncsafe.diloco.nodes import NodeLaunch, train_node
from syncsafe.io import replace_directory


def run(params: Params, root: Path, regime: str, params_path: Path, *, policies: list[str] | None = None,
        seeds: list[int] | None = None, resume: bool = False, nodes: NodeLaunch | None = None) -> str:
    """All of the regime's runs, or the chosen `policies` x `seeds`; `resume` skips complete runs.
    With `nodes`, this process is one node of a run across hosts (`syncsafe.diloco.nodes`).

    With `schedules.source: harness` nothing reads training runs: the output is left empty, not trained.
    """
    for name in policies or []:
        if name not in params.control.policies:
            raise ConfigError(f"--policy {name!r}: not in control.policies ({params.control.policies})")
    for value in seeds or []:
        if value not in params.seeds:
            raise ConfigError(f"--seed {value}: not in seeds ({params.seeds})")
    if params.schedules.source != "train":
        out = replace_directory(layout.at(root, layout.train_rel(regime)), lambda _: None)
        return f"train {regime}: off (schedules.source: {params.schedules.source}); {out} left empty"
    if nodes is not None:
        dirs = train_node(params, params_path, regime, root, nodes, policies=policies, seeds=seeds, resume=resume)
        return f"train {regime}: this node's islands of {len(dirs)} runs in {layout.at(root, layout.train_rel(regime))}"
    dirs = train_regime(params, params_path, regime, root, resume=resume, policies=policies, seeds=seeds)
    return f"train {regime}: {len(dirs)} runs in {layout.at(root, layout.train_rel(regime))}"
