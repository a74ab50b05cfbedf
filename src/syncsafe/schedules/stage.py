"""The schedules stage: controller schedules and the baselines derived from them.

Per regime and seed: one controller schedule per policy (`schedules.source`:
from real DiLoCo training runs, or from the stress harness's
learner-progress model for fast sweeps), its matched-random draws (from the
controller's action space; the free-placement reference draws beside them),
its evenly spaced twin, its offline bound, and the seed's no_sync schedule.
Decision logs go beside the controller schedules. Each regime's set lives in
runs/schedule-sets/<regime>/ with its own index; `build_index` joins them into
runs/schedules/index.csv (the contract path). Paths and index tables:
`syncsafe.artifacts.layout` and `syncsafe.artifacts.schedule_sets`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm import tqdm

from syncsafe.artifacts import layout
from syncsafe.artifacts.schedule_sets import read_index, read_set_index, write_schedule_index, write_set_index
from syncsafe.artifacts.train_runs import read_train_schedule, write_decisions
from syncsafe.config import Params
from syncsafe.control.controller import ControlPlan, ControlResult, run_controller
from syncsafe.control.harness import ProgressModelLearners
from syncsafe.control.policies import build_policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import even_cadence, matched_random, matched_random_free, no_sync, offline_bound
from syncsafe.schedules.schedule import LoadIntegral, Schedule, write_schedule
from syncsafe.control.serving_model import policy_calibration
from syncsafe.traces.stage import load_timeline

#: Per-regime schedule sets (one DVC output each) and the joined index (contract path).
SCHEDULE_SETS_DIR = layout.SCHEDULE_SETS
SCHEDULE_INDEX = layout.SCHEDULE_INDEX

__all__ = ["SCHEDULE_INDEX", "SCHEDULE_SETS_DIR", "build_index", "build_schedules", "control_plan", "in_params",
           "read_index", "run_harness", "trained_schedule"]


def control_plan(params: Params, regime: str) -> ControlPlan:
    c = params.control
    return ControlPlan(
        step_s=c.step_s,
        min_h=c.min_h,
        max_h=c.max_h,
        window_s=params.merge.window_s,
        min_gap_s=params.merge.min_gap_s,
        duration_s=params.regimes[regime].duration_s,
    )


def run_harness(params: Params, regime: str, policy: str, seed: int, timeline: pd.DataFrame) -> tuple[Schedule, ControlResult]:
    """Run `policy` on the learner-progress model over one seed's timeline."""
    plan = control_plan(params, regime)
    signals = TimelineSignals(timeline)
    calibration = policy_calibration(params.control.calibrated.calibration,
                                     params.control.calibrated.merge_link)
    agent = build_policy(policy, params.control, params.merge, seed, calibration, signals.step_s)
    result = run_controller(agent, ProgressModelLearners(params.harness, seed), signals, plan)
    schedule = Schedule(
        regime=regime,
        policy=policy,
        seed=seed,
        source="harness",
        duration_s=plan.duration_s,
        window_s=plan.window_s,
        min_gap_s=plan.min_gap_s,
        merge_starts_s=result.merge_starts_s,
    )
    return schedule, result


def trained_schedule(root: Path, regime: str, policy: str, seed: int) -> Schedule:
    """The controller schedule a real training run produced (its decision log stays beside it)."""
    return read_train_schedule(root, regime, policy, seed)


def build_schedules(params: Params, regime: str, root: Path = Path(".")) -> pd.DataFrame:
    """Write every schedule of `regime` and its index; return the index."""
    cfg = params.regimes[regime]
    rows: list[dict] = []

    def emit(schedule: Schedule, rel: Path) -> None:
        write_schedule(Path(root) / rel, schedule)
        row = {k: getattr(schedule, k) for k in ("regime", "policy", "seed", "draw", "matched_to", "source")}
        rows.append({**row, "n_merges": schedule.n_merges, "path": rel.as_posix()})

    jobs = [(seed, policy) for seed in params.seeds for policy in params.control.policies]
    timelines = {seed: load_timeline(root, regime, seed) for seed in params.seeds}
    source = params.schedules.source
    space = ActionSpace.of_params(params, regime)
    for seed in params.seeds:
        emit(no_sync(regime, seed, cfg.duration_s, params.merge.window_s, params.merge.min_gap_s),
             layout.schedule_rel(regime, seed, "no_sync", "no_sync"))
    for seed, policy in tqdm(jobs, desc=f"schedules {regime}", unit="run", leave=False):
        if source == "train":
            controller = trained_schedule(root, regime, policy, seed)
        else:
            controller, result = run_harness(params, regime, policy, seed, timelines[seed])
            write_decisions(layout.at(root, layout.schedule_decisions_rel(regime, seed, policy)), result.decisions)
        emit(controller, layout.schedule_rel(regime, seed, controller.source, policy))
        for derived in (offline_bound(controller, LoadIntegral(timelines[seed])), even_cadence(controller, space)):
            emit(derived, layout.schedule_rel(regime, seed, derived.source, policy))
        for draw in range(params.schedules.random_draws):
            for derived in (matched_random(controller, draw, space), matched_random_free(controller, draw)):
                emit(derived, layout.schedule_rel(regime, seed, derived.source, policy, draw))
    return write_set_index(root, regime, rows)


def in_params(index: pd.DataFrame, params: Params) -> pd.DataFrame:
    """The rows params still describe: its regimes and seeds, its controller policies and the
    schedules derived from them, and no_sync. A set left on disk by a regime, seed or policy
    since removed from params is never indexed (nor analysed)."""
    policies = list(params.control.policies)
    keep = (index["regime"].isin(list(params.regimes)) & index["seed"].isin(params.seeds)
            & ((index["source"] == "no_sync") | index["policy"].isin(policies) | index["matched_to"].isin(policies)))
    return index[keep].reset_index(drop=True)


def build_index(params: Params, root: Path = Path(".")) -> pd.DataFrame:
    """Join the per-regime indexes of the regimes in params into runs/schedules/index.csv."""
    frames = [read_set_index(root, regime) for regime in params.regimes]
    return write_schedule_index(root, in_params(pd.concat(frames, ignore_index=True), params).to_dict("records"))
