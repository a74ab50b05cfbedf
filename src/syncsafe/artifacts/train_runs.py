"""Training runs: runs/train/<regime>/<policy>/seed-<S>/.

Files (names in :mod:`.layout`): `schedule.json` (source `train`),
`decisions.jsonl` (one control cycle a line), `losses.csv` (step, island,
loss), `merges.csv` (per merge: merge, step, t_s, bytes_communicated, eval
loss when measured; an empty file when the run never merged), `model/` (the
Hugging Face export) and `metrics.json`, written last, so its presence marks
a complete run. Wall-clock facts sit outside the stage outputs in
logs/train/.../timing.json (`layout.timing_path`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMissing, read_csv, read_json, read_json_lines
from syncsafe.artifacts.layout import PathLike
from syncsafe.artifacts.schedules import Schedule, ScheduleFileError, read_schedule

LOSS_COLUMNS = ("step", "island", "loss")
#: Columns every non-empty merges.csv has (also t_s, pseudo-gradient norms; eval_loss with train.merge_eval_batches).
MERGE_COLUMNS = ("merge", "step", "bytes_communicated")
CURVE_KEYS = ("regime", "policy", "seed")


@dataclass(frozen=True)
class TrainRun:
    """One complete training run: where it lives and its final metrics."""

    regime: str
    policy: str
    seed: int
    path: Path
    metrics: dict[str, Any]

    @property
    def key(self) -> dict[str, Any]:
        return {"regime": self.regime, "policy": self.policy, "seed": self.seed}


def is_complete(run_dir: PathLike) -> bool:
    """Whether a run directory holds a finished run (its metrics.json)."""
    return (Path(run_dir) / layout.METRICS_FILE).is_file()


def read_metrics(run_dir: PathLike) -> dict[str, Any]:
    """metrics.json of a run (final_eval_loss, n_merges, tokens_processed, ...)."""
    return read_json(Path(run_dir) / layout.METRICS_FILE, "train run metrics file",
                     hint="run the train stage (the run is incomplete)")


def read_losses(run_dir: PathLike) -> pd.DataFrame:
    """losses.csv: step, island, loss."""
    return read_csv(Path(run_dir) / layout.LOSSES_FILE, "train loss table", LOSS_COLUMNS)


def read_merges(run_dir: PathLike) -> pd.DataFrame:
    """merges.csv (an empty table when the run never merged)."""
    path = Path(run_dir) / layout.MERGES_FILE
    if path.is_file() and path.stat().st_size <= 1:  # a run without merges writes an empty CSV
        return pd.DataFrame()
    return read_csv(path, "train merge table", MERGE_COLUMNS)


def read_decisions(run_dir: PathLike) -> list[dict[str, Any]]:
    """decisions.jsonl: one control cycle a line."""
    return read_json_lines(Path(run_dir) / layout.DECISIONS_FILE, "decision log")


def read_timing(run_dir: PathLike) -> dict[str, Any] | None:
    """The run's wall-clock facts (logs/train/.../timing.json), or None when there are none."""
    path = layout.timing_path(run_dir)
    return read_json(path, "train timing file") if path.is_file() else None


def read_train_schedule(root: PathLike, regime: str, policy: str, seed: int) -> Schedule:
    """The controller schedule a training run produced, checked to be that run's."""
    path = layout.train_run_dir(root, regime, policy, seed) / layout.SCHEDULE_FILE
    if not path.is_file():
        raise ArtifactMissing(f"{path}: no trained schedule; run the train stage for regime {regime!r} "
                              "(or set schedules.source: harness)")
    schedule = read_schedule(path)
    if (schedule.regime, schedule.policy, schedule.seed, schedule.source) != (regime, policy, seed, "train"):
        raise ScheduleFileError(f"{path}: expected the train schedule of {regime}/{policy}/seed-{seed}")
    return schedule


def read_train_run(run_dir: PathLike) -> TrainRun:
    """A complete run from its directory (ArtifactMissing while it is incomplete)."""
    regime, policy, seed = layout.train_run_key(run_dir)
    return TrainRun(regime, policy, seed, Path(run_dir), read_metrics(run_dir))


def complete_train_runs(root: PathLike, regime: str | None = None) -> list[TrainRun]:
    """Every complete run under runs/train (of `regime`, else of all regimes), sorted by path."""
    return [read_train_run(d) for d in layout.train_run_dirs(root, regime) if is_complete(d)]


def eval_losses(root: PathLike) -> pd.DataFrame:
    """regime, policy, seed, eval_loss: the final eval loss of every complete run that has one."""
    rows = [{**run.key, "eval_loss": float(run.metrics["final_eval_loss"])}
            for run in complete_train_runs(root) if "final_eval_loss" in run.metrics]
    return pd.DataFrame(rows, columns=[*CURVE_KEYS, "eval_loss"]).astype({"seed": "int64"})


def loss_curves(root: PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Mean training loss per step (regime, policy, seed, step, loss) and the merged model's eval loss
    (regime, policy, seed, step, eval_loss) of every complete run; empty tables when there is none."""
    losses, merges = [], []
    for run in complete_train_runs(root):
        losses.append(read_losses(run.path).groupby("step", as_index=False)["loss"].mean().assign(**run.key))
        merged = read_merges(run.path)
        if "eval_loss" in merged:
            merges.append(merged[["step", "eval_loss"]].assign(**run.key))
    cols = [*CURVE_KEYS, "step"]
    loss_df = pd.concat(losses, ignore_index=True)[[*cols, "loss"]] if losses else pd.DataFrame(columns=[*cols, "loss"])
    merge_df = pd.concat(merges, ignore_index=True) if merges else pd.DataFrame(columns=[*cols, "eval_loss"])
    return loss_df, merge_df


# --------------------------------------------------------------------------- writers


def write_decisions(path: PathLike, decisions: Iterable[Any]) -> Path:
    """A decision log: one sorted-key JSON object a line (dataclasses are written as their fields)."""
    return io.write_text(path, "".join(json.dumps(asdict(d) if is_dataclass(d) else d, sort_keys=True) + "\n"
                                       for d in decisions))


def write_losses(run_dir: PathLike, rows: Iterable[tuple[int, int, float]]) -> Path:
    """losses.csv from (step, island, loss) rows, sorted by step and island."""
    frame = pd.DataFrame(list(rows), columns=list(LOSS_COLUMNS)).sort_values(["step", "island"])
    return io.write_csv(Path(run_dir) / layout.LOSSES_FILE, frame)


def write_merges(run_dir: PathLike, merges: pd.DataFrame) -> Path:
    """merges.csv (per merge; an empty frame writes the empty file a run without merges has)."""
    return io.write_csv(Path(run_dir) / layout.MERGES_FILE, merges)


def write_timing(run_dir: PathLike, timing: dict[str, Any]) -> Path:
    """logs/train/.../timing.json for a run directory."""
    return io.write_json(layout.timing_path(run_dir), timing)


def write_metrics(run_dir: PathLike, metrics: dict[str, Any]) -> Path:
    """metrics.json: write it last, it marks the run complete."""
    return io.write_json(Path(run_dir) / layout.METRICS_FILE, metrics)
