"""What each pipeline stage reports to MLflow, read back from the files it wrote.

Every function here runs after its stage has written its outputs (tracking
never holds results the disk does not have) and turns them into one stage run
with nested item runs: per seed for traces, per regime × policy × seed for
training, per schedule for schedules and replay (draws included), per regime ×
policy for the analysis.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from syncsafe.config import Params
from syncsafe.tracking.settings import section_params
from syncsafe.tracking.stage import TrackedRun, track_stage


def _section(params: Params, keys: list[str]) -> dict:
    return section_params(params, keys)


def _na(value):
    return None if pd.isna(value) else value


def track_traces(params: Params, regime: str, root: Path) -> None:
    from syncsafe.traces.stage import load_timeline, trace_dir

    runs = []
    for seed in params.seeds:
        timeline = load_timeline(root, regime, seed)
        n_requests = len(pd.read_parquet(trace_dir(root, regime, seed) / "requests.parquet"))
        runs.append(TrackedRun(regime=regime, seed=seed, metrics={
            "n_requests": n_requests, "busy_fraction": float(timeline["busy"].mean()),
            "arrival_rate_mean": float(timeline["arrival_rate"].mean()),
            "inference_pressure_mean": float(timeline["inference_pressure"].mean()),
        }))  # fmt: skip
    track_stage("traces", runs, root=root, profile=params.profile, regime=regime,
                params_section=_section(params, ["seeds", "traces", f"regimes.{regime}"]))


def train_runs(params: Params, regime: str, run_dirs: list[Path]) -> list[TrackedRun]:
    from syncsafe.diloco.run import timing_path

    runs = []
    for run_dir in run_dirs:
        metrics = json.loads((run_dir / "metrics.json").read_text())
        losses = pd.read_csv(run_dir / "losses.csv").groupby("step")["loss"].mean()
        merges = pd.read_csv(run_dir / "merges.csv") if (run_dir / "merges.csv").stat().st_size > 1 else pd.DataFrame()
        series = {"train_loss": [(int(s), float(v)) for s, v in losses.items()]}
        if "eval_loss" in merges:
            series["merge_eval_loss"] = [(int(r.step), float(r.eval_loss)) for r in merges.itertuples()]
        timing = timing_path(run_dir)  # wall-clock facts, kept outside the stage outputs
        if timing.is_file():
            metrics.update(json.loads(timing.read_text()))
        runs.append(TrackedRun(
            regime=regime, policy=run_dir.parent.name, seed=int(run_dir.name.removeprefix("seed-")),
            metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
            series=series,
            artifacts=[run_dir / "schedule.json", run_dir / "decisions.jsonl", run_dir / "merges.csv"],
        ))  # fmt: skip
    return runs


def track_schedules(params: Params, regime: str, index: pd.DataFrame, root: Path) -> None:
    from syncsafe.schedules.schedule import LoadIntegral, busy_overlap_fraction, read_schedule
    from syncsafe.traces.stage import load_timeline

    loads = {seed: LoadIntegral(load_timeline(root, regime, seed)) for seed in params.seeds}
    runs = []
    for rec in index.itertuples(index=False):
        schedule = read_schedule(Path(root) / rec.path)
        runs.append(TrackedRun(
            regime=regime, policy=rec.policy, seed=int(rec.seed), draw=_na(rec.draw), matched_to=_na(rec.matched_to),
            metrics={"n_merges": schedule.n_merges, "busy_overlap": busy_overlap_fraction(schedule, loads[int(rec.seed)])},
            tags={"source": rec.source},
            artifacts=[Path(root) / rec.path] if rec.source != "matched_random" else [],
        ))  # fmt: skip
    track_stage("schedules", runs, root=root, profile=params.profile, regime=regime,
                params_section=_section(params, ["seeds", "merge", "control", "schedules", f"regimes.{regime}"]))


def replay_runs(backend: str, index: pd.DataFrame, root: Path) -> list[TrackedRun]:
    runs = []
    for rec in index.itertuples(index=False):
        summary = json.loads((Path(root) / rec.path / "summary.json").read_text())
        metrics = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        artifacts = [Path(root) / rec.path / "summary.json"]
        if backend == "vllm":
            artifacts += [Path(root) / rec.path / "requests.parquet", Path(root) / rec.path / "windows.csv"]
        runs.append(TrackedRun(regime=rec.regime, policy=rec.policy, seed=int(rec.seed), draw=_na(rec.draw),
                               matched_to=_na(rec.matched_to), backend=backend, metrics=metrics, artifacts=artifacts))
    return runs


def track_analysis(params: Params, policy_table: pd.DataFrame, files: list[Path], root: Path) -> None:
    runs = [
        TrackedRun(regime=rec.regime, policy=rec.policy, metrics={
            k: getattr(rec, k) for k in ("slo_pct_mean", "sync_excess_pct_mean", "p_vs_matched_random", "seeds_won",
                                         "n_seeds") if pd.notna(getattr(rec, k))
        }, tags={"tier": rec.tier})
        for rec in policy_table.itertuples(index=False)
    ]  # fmt: skip
    track_stage("analyze", runs, root=root, profile=params.profile, artifacts=files,
                params_section=_section(params, ["seeds", "replay.slo"]))
