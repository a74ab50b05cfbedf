"""One DiLoCo training run (regime × policy × seed) inside an island process.

Every island process of the group calls `train_run` for the same run. Rank 0
runs the controller loop and writes the run's outputs; all ranks train and
merge. Outputs in `runs/train/<regime>/<policy>/seed-<S>/`:

- `schedule.json`   merge starts in trace seconds (schedule contract, source `train`)
- `decisions.jsonl` every control cycle: reports, signals, decision, reason, score; a merge's sync event
                    (its window in trace time, the fragment synced, the bytes of its all-reduce)
- `losses.csv`      step, island, training loss (per-island loss curves)
- `merges.csv`      per merge: trace time, step, eval loss of the merged model,
                    bytes communicated
- `model/`          Hugging Face export of the final global model (+ tokenizer)
- `metrics.json`    final eval loss, tokens, merges, bytes; written last, so its
                    presence marks a complete run

Every output is a function of params and code alone (a rerun writes the same
bytes). Wall-clock facts (train and island-loop time, throughput, merge wall
time, policy decision latency) go to `logs/train/<regime>/<policy>/seed-<S>/timing.json`,
outside the stage's outputs, and from there to MLflow.

While a run is in flight, `checkpoints/merge-<K>/` holds every island's state
and the controller's after merge K, and `checkpoints/LATEST` names the newest
complete one; `resume` continues from there and reproduces the same losses.
Checkpoints are removed once the run is complete.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_json
from syncsafe.artifacts.layout import timing_path
from syncsafe.artifacts.train_runs import (
    is_complete,
    write_decisions,
    write_losses,
    write_merges,
    write_metrics,
    write_timing,
)
from syncsafe.config import Params
from syncsafe.errors import BadInput
from syncsafe.control.controller import ControlResult, run_controller
from syncsafe.control.policies import Policy, build_policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.diloco.checkpoint import load_checkpoint, save_checkpoint
from syncsafe.diloco.export import export_global_model
from syncsafe.diloco.fragments import FragmentError
from syncsafe.diloco.islands import DistributedLearners, Fault, Island, follow
from syncsafe.diloco.outer import MergeStats, OuterOptimizer, assign_parameters
from syncsafe.schedules.schedule import Schedule, write_schedule
from syncsafe.schedules.stage import control_plan
from syncsafe.control.serving_model import policy_calibration
from syncsafe.traces.stage import load_timeline

TRAIN_DIR = layout.TRAIN
#: Island logs and wall-clock facts of each run: not reproducible, so outside the stage outputs (gitignored).
TRAIN_LOG_DIR = layout.TRAIN_LOGS
train_dir = layout.train_run_dir

__all__ = ["TRAIN_DIR", "TRAIN_LOG_DIR", "Resources", "World", "is_complete", "make_island", "timing_path",
           "train_dir", "train_run"]


@dataclass(frozen=True)
class World:
    """This process's place in the island group."""

    rank: int
    world_size: int
    #: Island id of every rank (ids survive a restart on fewer islands).
    island_ids: tuple[int, ...]
    #: Islands the run was configured with (shards are cut for this many).
    num_islands: int
    device: torch.device

    @property
    def island_id(self) -> int:
        return self.island_ids[self.rank]


@dataclass
class Resources:
    """What every run of a process shares: tokenizer, data access and builders."""

    tokenizer: Any
    build_model: Any  # (seed) -> model on device
    batches_for: Any  # (island_id, num_islands, seed, start_step) -> step -> batch
    eval_batches: list[torch.Tensor]


def _latest_merge(run_dir: Path) -> int | None:
    latest = layout.latest_checkpoint_pointer(run_dir)
    return int(latest.read_text().strip()) if latest.is_file() else None


def make_island(params: Params, world: World, res: Resources, seed: int, fault: Fault | None = None) -> Island:
    """This process's island for a run of `seed`: model, inner AdamW, outer Nesterov step, batches."""
    cfg = params.train
    model = res.build_model(seed)
    inner = torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, weight_decay=cfg.weight_decay)
    try:
        outer = OuterOptimizer(model, num_islands=world.world_size, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                               fragments=cfg.sync.fragments)
    except FragmentError as err:
        raise BadInput(str(err)) from None
    overlapped = cfg.sync.mode == "overlapped"
    return Island(island_id=world.island_id, model=model, inner=inner, outer=outer,
                  batches=res.batches_for(world.island_id, world.num_islands, seed, 0),
                  tokens_per_step=cfg.batch_size * cfg.seq_len, fault=fault, alpha=cfg.sync.fragment_update_alpha,
                  sync_delay=cfg.sync.fragment_sync_delay, overlapped=overlapped,
                  overlap_rounds=cfg.sync.overlap_rounds if overlapped else 0)


def train_run(params: Params, regime: str, policy_name: str, seed: int, root: Path, world: World,
              res: Resources, resume: bool, fault: Fault | None = None) -> None:
    """Train one run to the end of the regime's trace (all ranks call this together)."""
    cfg = params.train
    run_dir = train_dir(root, regime, policy_name, seed)
    plan = control_plan(params, regime)
    island = make_island(params, world, res, seed, fault)
    start = _latest_merge(run_dir) if resume else None
    state: ControlResult | None = None
    saved_policy: dict[str, Any] | None = None
    merge_log: list[dict[str, Any]] = []
    if start is None:
        shutil.rmtree(run_dir / layout.CHECKPOINTS_DIR, ignore_errors=True)
    else:
        checkpoint = layout.merge_checkpoint_dir(run_dir, start)
        island.restore(load_checkpoint(layout.island_state_file(checkpoint, world.island_id)))
        island.batches = res.batches_for(world.island_id, world.num_islands, seed, island.step)
        if world.rank == 0:
            saved = read_json(layout.controller_state_file(checkpoint), "controller state")
            state, merge_log, saved_policy = ControlResult.from_dict(saved["state"]), saved["merges"], saved["policy_state"]

    started = time.perf_counter()

    def save_island(stats: MergeStats) -> None:
        merge_log.append({"merge": island.merges_launched, "step": island.step, **stats.to_dict()})
        save_checkpoint(layout.island_state_file(layout.merge_checkpoint_dir(run_dir, island.merges_launched),
                                                world.island_id),
                        island.checkpoint())
        dist.barrier()

    def log_applied(stats: MergeStats) -> None:
        """A merge applied after its launch (`fragment_sync_delay`, overlapped): complete its merge_log row."""
        row = next(r for r in merge_log if r["merge_index"] == stats.merge_index)
        row.update(averaged_pseudo_gradient_norm=stats.averaged_pseudo_gradient_norm,
                   wall_time_s=stats.wall_time_s, applied_step=stats.applied_step)

    if world.rank == 0:
        island.on_applied = log_applied
        signals = TimelineSignals(load_timeline(root, regime, seed))
        policy = _policy(params, policy_name, seed, signals.step_s)
        if saved_policy is not None:
            policy.restore(saved_policy)

        def after_merge(result: ControlResult) -> None:
            record = merge_log[-1]
            record["t_s"] = result.merge_starts_s[-1]
            if cfg.merge_eval_batches:
                record["eval_loss"] = island.eval_loss(res.eval_batches[: cfg.merge_eval_batches])
            k = island.merges_launched
            io.write_text(layout.controller_state_file(layout.merge_checkpoint_dir(run_dir, k)), json.dumps(
                {"state": result.to_dict(), "policy": policy.name, "policy_state": policy.state(), "merges": merge_log},
                default=_plain) + "\n")
            io.write_text(layout.latest_checkpoint_pointer(run_dir), f"{k}\n")
            _prune_checkpoints(run_dir, keep=k)

        learners = DistributedLearners(island, cfg.token_weighted, save_island)
        result = run_controller(policy, learners, signals, plan, state=state, on_merge=after_merge)
        learners.stop()
        loop_s = learners.cycle_wall_s
    else:
        follow(island, cfg.token_weighted, save_island)

    losses: list[list[tuple[int, float]]] = [[] for _ in range(world.world_size)]
    dist.all_gather_object(losses, (world.island_id, island.losses))
    tokens = [0] * world.world_size
    dist.all_gather_object(tokens, island.tokens_seen)
    if world.rank == 0:
        wall = time.perf_counter() - started
        _write_outputs(params, regime, policy_name, seed, run_dir, world, res, island, result, merge_log, losses,
                       sum(tokens), wall, loop_s, resumed=start is not None)
    dist.barrier()


def _policy(params: Params, name: str, seed: int, grid_s: float) -> Policy:
    """The run's policy as params build it (a resumed run then restores its state from the checkpoint)."""
    calibration = policy_calibration(params.control.calibrated.calibration,
                                     params.control.calibrated.merge_link)
    return build_policy(name, params.control, params.merge, seed, calibration, grid_s)


def _plain(value: Any) -> Any:
    """JSON for the numpy scalars of merge statistics."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _prune_checkpoints(run_dir: Path, keep: int) -> None:
    for merge, old in layout.merge_checkpoint_dirs(run_dir):
        if merge < keep:
            shutil.rmtree(old, ignore_errors=True)


def _write_outputs(params: Params, regime: str, policy: str, seed: int, run_dir: Path, world: World, res: Resources,
                   island: Island, result: ControlResult, merge_log: list[dict[str, Any]],
                   losses: list[tuple[int, list[tuple[int, float]]]], tokens: int, wall_s: float, loop_s: float,
                   resumed: bool) -> None:
    plan = control_plan(params, regime)
    schedule = Schedule(regime=regime, policy=policy, seed=seed, source="train", duration_s=plan.duration_s,
                        window_s=plan.window_s, min_gap_s=plan.min_gap_s, merge_starts_s=result.merge_starts_s)
    write_schedule(run_dir / layout.SCHEDULE_FILE, schedule)
    write_decisions(run_dir / layout.DECISIONS_FILE, result.decisions)
    write_losses(run_dir, [(step, island_id, loss) for island_id, curve in losses for step, loss in curve])
    merges = pd.DataFrame(merge_log)
    merge_wall = merges.pop("wall_time_s") if "wall_time_s" in merges else pd.Series(dtype=float)
    write_merges(run_dir, merges)
    # The final global model is the state after the last merge (local steps since are not merged).
    assign_parameters(island.model, island.outer.global_flat.detach())
    final_eval = island.eval_loss(res.eval_batches)
    export_global_model(island.model, island.outer, res.tokenizer, run_dir / layout.MODEL_DIR)
    metrics = {
        "final_eval_loss": final_eval,
        "n_merges": len(result.merge_starts_s),
        "tokens_processed": tokens,
        "inner_steps": result.step,
        "islands": world.world_size,
        "islands_configured": world.num_islands,
        "island_ids": list(world.island_ids),
        "bytes_per_merge": int(merges["bytes_communicated"].iloc[0]) if len(merges) else 0,
        "bytes_communicated": int(merges["bytes_communicated"].sum()) if len(merges) else 0,
        "resumed": resumed,
    }
    decide_us = pd.Series(result.decide_us, dtype=float)
    write_timing(run_dir, {
        "merge_wall_s_mean": float(merge_wall.mean()) if len(merge_wall) else 0.0,
        "train_wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        # the island loop between merges: training plus per-cycle command/report collectives
        "island_loop_s": loop_s,
        "island_tokens_per_s": island.tokens_seen / loop_s if loop_s > 0 and not resumed else None,
        "decide_us_p50": float(decide_us.quantile(0.5)) if len(decide_us) else None,
        "decide_us_p99": float(decide_us.quantile(0.99)) if len(decide_us) else None,
    })
    write_metrics(run_dir, metrics)
    shutil.rmtree(run_dir / layout.CHECKPOINTS_DIR, ignore_errors=True)
