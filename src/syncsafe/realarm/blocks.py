"""The real arm's campaign blocks: each (regime, seed) is a unit that is kept once finished, so a stopped
campaign replays only the blocks it lacks.

A block holds one seed's no-sync controls, its controllers, their span-matched draws and cadences, in the
seeded order of `design.seed_block`, replayed on one warmed server. When its last replay is taken, the
block's measurements (per replay: the per-request table, the server's gauges, the merge windows as they ran
and the summary fields) are written under `runs/real-blocks/<regime>/<label>-<fingerprint>/` in one atomic
step (`io.replace_directory`). A later run of the replay-vllm stage (after Ctrl-C, a reboot, a machine too
busy for a replay) takes every finished block whose fingerprint it plans again instead of replaying it; a
block stopped mid-way left nothing behind and is replayed whole. What follows the replays (the drift test,
the pooled SLO, the intervals, the replay set) is computed from the blocks, kept or new, alike.

The fingerprint hashes everything a block's measurements depend on: the regime's plan and load, the CPU
placement, `replay.vllm` and `merge`, the block's replays in order (position, round, control, schedule), the
requests they send and the timelines they are judged on, and the served model's weights. The same fingerprint is the same experiment;
anything else is a different block, replayed anew. Blocks the current plan does not name are removed when a
stage run finishes (`prune_blocks`), so the cache holds one campaign.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_json, read_parquet
from syncsafe.config import Params
from syncsafe.realarm.arm import Measured, PlannedReplay
from syncsafe.realarm.design import RealPlan

BLOCK_FILE = "block.json"
#: The label of the block of one more no-sync control per seed that a failed drift test asks for.
EXTRA_CONTROLS = "extra-controls"
_TABLES = ("results", "signals", "windows")


@dataclass(frozen=True)
class Block:
    """One campaign unit of a regime: its label (`seed-<S>`, or `extra-controls`), its replays in order and the
    fingerprint of what they measure."""

    regime: str
    label: str
    items: tuple[PlannedReplay, ...]
    fingerprint: str

    @property
    def name(self) -> str:
        return f"{self.label}-{self.fingerprint[:16]}"

    def directory(self, root: Path) -> Path:
        return layout.at(root, layout.REAL_BLOCKS) / self.regime / self.name

    def record(self, resumed: bool) -> dict[str, object]:
        """Its line of blocks.json: what it is and whether this run kept it from an earlier one."""
        return {"regime": self.regime, "label": self.label, "replays": len(self.items),
                "fingerprint": self.fingerprint, "resumed": resumed}


def _frame_digest(frame: pd.DataFrame) -> bytes:
    return pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes()


def model_digest(model: Path | str) -> bytes:
    """sha256 of the served model's weights (a hub id or a folder without them: its name); taken once per run."""
    weights = Path(model) / "model.safetensors"
    if not weights.is_file():
        return str(model).encode()
    with open(weights, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").digest()


def make_block(params: Params, root: Path, plan: RealPlan, regime: str, label: str, items: list[PlannedReplay],
               inputs: Mapping[int, tuple[pd.DataFrame, pd.DataFrame]], weights: bytes) -> Block:
    """The block of `items` (in replay order) with its fingerprint (the module docstring). `inputs`: per seed,
    the requests the replays send and the timeline they are judged on; `weights`: `model_digest` of the model."""
    what = {
        "regime_plan": plan.regimes[regime].model_dump(mode="json"),
        "load": plan.loads[regime].model_dump(mode="json") if regime in plan.loads else None,
        "placement": plan.placement,
        "vllm": params.replay.vllm.model_dump(mode="json"),
        "merge": params.merge.model_dump(mode="json"),
        "replays": [{"position": i.position, "round": i.round, "control": i.control,
                     "out": os.path.relpath(i.out, root), "schedule": i.schedule.model_dump(mode="json")}
                    for i in items],
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
    for seed in sorted({int(i.row["seed"]) for i in items}):
        for frame in inputs[seed]:
            digest.update(_frame_digest(frame))
    digest.update(weights)
    return Block(regime, label, tuple(items), digest.hexdigest())


def save_block(root: Path, block: Block, measured: list[Measured]) -> Path:
    """Write a finished block's measurements in one atomic step (its block.json last inside)."""
    if [m.item.position for m in measured] != [i.position for i in block.items]:
        raise ValueError(f"{block.regime}/{block.label}: measured replays do not match the block's replays")

    def build(tmp: Path) -> None:
        for k, m in enumerate(measured):
            for name, frame in zip(_TABLES, (m.results, m.signals, m.windows)):
                io.write_parquet(tmp / f"{k:04d}" / f"{name}.parquet", frame)
            io.write_json(tmp / f"{k:04d}" / "extra.json", m.extra)
        io.write_json(tmp / BLOCK_FILE, {**block.record(resumed=False), "positions": [i.position for i in block.items]})

    return io.replace_directory(block.directory(root), build)


def load_block(root: Path, block: Block) -> list[Measured] | None:
    """The block's measurements when a finished block with its fingerprint is kept, else None."""
    where = block.directory(root)
    if not (where / BLOCK_FILE).is_file():
        return None
    record = read_json(where / BLOCK_FILE, "campaign block record", keys=("fingerprint", "positions"))
    if record["fingerprint"] != block.fingerprint or record["positions"] != [i.position for i in block.items]:
        return None
    out = []
    for k, item in enumerate(block.items):
        tables = [read_parquet(where / f"{k:04d}" / f"{name}.parquet", f"block {name} table") for name in _TABLES]
        extra = read_json(where / f"{k:04d}" / "extra.json", "block replay summary fields")
        out.append(Measured(item, *tables, extra))
    return out


def prune_blocks(root: Path, keep: list[Block]) -> list[Path]:
    """Remove every kept block the current plan does not name (and every regime folder left empty)."""
    base = layout.at(root, layout.REAL_BLOCKS)
    wanted = {b.directory(root) for b in keep}
    removed = []
    for folder in sorted(base.glob("*/*")) if base.is_dir() else []:
        if folder not in wanted:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    for regime in sorted(base.glob("*")) if base.is_dir() else []:
        if regime.is_dir() and not any(regime.iterdir()):
            regime.rmdir()
    return removed


__all__ = ["BLOCK_FILE", "EXTRA_CONTROLS", "Block", "load_block", "make_block", "model_digest", "prune_blocks", "save_block"]
