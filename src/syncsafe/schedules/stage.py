"""The schedules stage: controller schedules and the baselines derived from them.

Per regime and seed: one controller schedule per policy (`schedules.source`:
from real DiLoCo training runs, or from the stress harness's
learner-progress model for fast sweeps), its matched-random draws (from the
controller's action space; the free-placement reference draws beside them),
its evenly spaced twin, its offline bound, and the seed's no_sync schedule.
Decision logs go beside the controller schedules. Each regime's set lives in
runs/schedule-sets/<regime>/ with its own index; `build_index` joins them into
runs/schedules/index.csv (the contract path).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from syncsafe import io
from syncsafe.config import Params
from syncsafe.control.controller import ControlPlan, ControlResult, run_controller
from syncsafe.control.harness import ProgressModelLearners
from syncsafe.control.policies import build_policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import even_cadence, matched_random, matched_random_free, no_sync, offline_bound
from syncsafe.schedules.schedule import INDEX_COLUMNS, LoadIntegral, Schedule, ScheduleError, read_schedule, write_schedule
from syncsafe.control.serving_model import load_calibration
from syncsafe.traces.stage import load_timeline

#: Per-regime schedule sets (one DVC output each) and the joined index (contract path).
SCHEDULE_SETS_DIR = Path("runs") / "schedule-sets"
SCHEDULE_INDEX = Path("runs") / "schedules" / "index.csv"


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
    calibration = load_calibration(params.control.calibrated.calibration)
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
    path = Path(root) / "runs" / "train" / regime / policy / f"seed-{seed}" / "schedule.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no trained schedule; run the train stage for regime {regime!r} "
                                "(or set schedules.source: harness)")
    schedule = read_schedule(path)
    if (schedule.regime, schedule.policy, schedule.seed, schedule.source) != (regime, policy, seed, "train"):
        raise ScheduleError(f"{path}: expected the train schedule of {regime}/{policy}/seed-{seed}")
    return schedule


def _write_decisions(path: Path, result: ControlResult) -> None:
    io.write_text(path, "".join(json.dumps(asdict(d), sort_keys=True) + "\n" for d in result.decisions))


def build_schedules(params: Params, regime: str, root: Path = Path(".")) -> pd.DataFrame:
    """Write every schedule of `regime` and its index; return the index."""
    out = Path(root) / SCHEDULE_SETS_DIR / regime
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
             SCHEDULE_SETS_DIR / regime / f"seed-{seed}" / "no_sync.json")
    for seed, policy in tqdm(jobs, desc=f"schedules {regime}", unit="run", leave=False):
        seed_dir = SCHEDULE_SETS_DIR / regime / f"seed-{seed}"
        if source == "train":
            controller = trained_schedule(root, regime, policy, seed)
        else:
            controller, result = run_harness(params, regime, policy, seed, timelines[seed])
            _write_decisions(Path(root) / seed_dir / f"{policy}.decisions.jsonl", result)
        emit(controller, seed_dir / f"{policy}.json")
        emit(offline_bound(controller, LoadIntegral(timelines[seed])), seed_dir / "offline_bound" / f"{policy}.json")
        emit(even_cadence(controller, space), seed_dir / "even_cadence" / f"{policy}.json")
        for draw in range(params.schedules.random_draws):
            emit(matched_random(controller, draw, space), seed_dir / "matched_random" / f"{policy}-{draw:03d}.json")
            emit(matched_random_free(controller, draw), seed_dir / "matched_random_free" / f"{policy}-{draw:03d}.json")
    index = _index_frame(rows)
    io.write_csv(out / "index.csv", index)
    return index


def _index_frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    return df.astype({"draw": "Int64", "seed": "int64", "n_merges": "int64"})


def read_index(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no schedule index; run the schedules stage first")
    return pd.read_csv(path, dtype={"draw": "Int64"}, keep_default_na=True)


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
    frames = [read_index(Path(root) / SCHEDULE_SETS_DIR / regime / "index.csv") for regime in params.regimes]
    index = _index_frame(in_params(pd.concat(frames, ignore_index=True), params).to_dict("records"))
    io.write_csv(Path(root) / SCHEDULE_INDEX, index)
    return index
