"""What each pipeline stage reports to MLflow, read back from the files it wrote.

A collector is ``fn(root, params, regime) -> Collected``: after its stage has
written its outputs (tracking never holds results the disk does not have) it
reads them through :mod:`syncsafe.artifacts` and returns the item runs plus
stage-level scalars and files. An item run is the unit people compare: per
seed for traces; per regime x policy x seed for training, schedules and
replays (`units`: a controller's matched-random draws and references, or a
no-sync replay's repeated controls, are a table and summary metrics of its
run, never runs of their own); per regime x policy for the analysis. :data:`COLLECTORS` maps a stage name (as
declared in :mod:`syncsafe.pipeline.declarations`) to its collector.

The collectors import :mod:`syncsafe.artifacts` (and the one computation they
need, the busy overlap of a schedule) but no stage's code: every stage process
imports this module, so what it imports becomes every stage's code deps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.tracking.records import Collected, TrackedRun

Collector = Callable[[Path, Any, "str | None"], Collected]

COLLECTORS: dict[str, Collector] = {}


def register(stage: str) -> Callable[[Collector], Collector]:
    """Register the decorated function as the collector of ``stage``."""

    def add(fn: Collector) -> Collector:
        COLLECTORS[stage] = fn
        return fn

    return add


def collect_stage(stage: str, root: Path, params: Any, regime: str | None) -> Collected:
    """What the stage's collector reads from its outputs (nothing for a stage without one)."""
    fn = COLLECTORS.get(stage)
    return Collected() if fn is None else fn(Path(root), params, regime)


def _na(value: Any) -> Any:
    return None if pd.isna(value) else value


def _scalars(mapping: dict[str, Any]) -> dict[str, float | int]:
    return {k: v for k, v in mapping.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _present(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.exists()]


#: Where a unit's rows come from: the unit's own row (a controller or no-sync), or rows derived from it.
CONTROLLER_SOURCES = ("train", "harness", "live")


def units(rows: list[dict[str, Any]], backend: str = "") -> list[TrackedRun]:
    """One run per (regime, policy, seed) from per-schedule rows (keys regime, policy, seed, draw, matched_to,
    source, metrics, artifacts; optional `table`: extra table columns of the row).

    A row with ``matched_to`` (a draw, a reference) joins its controller's run: as a row of the run's
    ``derived`` table (every figure), and in its metrics (the `SUMMARISED` ones) as ``<policy>.<metric>``
    (one reference) or ``<policy>.<metric>.min/mean/max`` with ``<policy>.n`` (numbered draws). A row marked ``control`` (a
    repeated no-sync replay) joins its no-sync run the same way, under ``controls``.
    """
    own: dict[tuple, dict[str, Any]] = {}
    attached: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        seed = int(row["seed"])
        if row.get("control"):
            attached.setdefault((row["regime"], row["policy"], seed), []).append({**row, "policy": "controls"})
        elif row.get("matched_to"):
            attached.setdefault((row["regime"], row["matched_to"], seed), []).append(row)
        else:
            own[(row["regime"], row["policy"], seed)] = row
    runs = []
    for key, row in own.items():
        extra = attached.get(key, [])
        metrics = {**row["metrics"], **_derived_metrics(extra)}
        table = pd.DataFrame([{"policy": r["policy"], "draw": _na(r.get("draw")), "source": r["source"],
                               **r.get("table", {}), **r["metrics"]} for r in extra])
        runs.append(TrackedRun(regime=key[0], policy=key[1], seed=key[2], backend=backend, metrics=metrics,
                               tags={"source": row["source"]}, artifacts=row.get("artifacts", []),
                               tables={"derived": table} if extra else {}))  # fmt: skip
    return runs


#: What a unit's metrics summarise of the rows attached to it (all of each row's figures are in its table).
SUMMARISED = ("slo_violation_rate", "e2e_p95_ms", "ttft_p95_ms", "n_merges", "busy_overlap", "requests_during_merges")


def _derived_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_policy.setdefault(row["policy"], []).append(row)
    for policy, group in by_policy.items():
        names = sorted({k for r in group for k in r["metrics"] if k in SUMMARISED})
        if len(group) == 1 and _na(group[0].get("draw")) is None and policy != "controls":
            out.update({f"{policy}.{k}": v for k, v in group[0]["metrics"].items() if k in SUMMARISED})
            continue
        out[f"{policy}.n"] = len(group)
        for name in names:
            values = [float(r["metrics"][name]) for r in group if r["metrics"].get(name) is not None]
            if values:
                out.update({f"{policy}.{name}.min": min(values), f"{policy}.{name}.mean": sum(values) / len(values),
                            f"{policy}.{name}.max": max(values)})
    return out


# --------------------------------------------------------------------------- per stage


@register("traces")
def traces(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.traces import read_requests, read_timeline

    runs = []
    for seed in params.seeds:
        timeline = read_timeline(root, regime, seed)
        runs.append(TrackedRun(regime=regime, seed=seed, metrics={
            "n_requests": len(read_requests(root, regime, seed)), "busy_fraction": float(timeline["busy"].mean()),
            "arrival_rate_mean": float(timeline["arrival_rate"].mean()),
            "inference_pressure_mean": float(timeline["inference_pressure"].mean()),
        }))  # fmt: skip
    return Collected(runs)


@register("train")
def train(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.train_runs import complete_train_runs, read_losses, read_merges, read_timing

    runs = []
    for run in complete_train_runs(root, regime):
        if run.policy not in params.control.policies or run.seed not in params.seeds:
            continue  # an earlier run of a configuration no longer in params
        losses = read_losses(run.path).groupby("step")["loss"].mean()
        merges = read_merges(run.path)
        series = {"train_loss": [(int(s), float(v)) for s, v in losses.items()]}
        if "eval_loss" in merges:
            series["merge_eval_loss"] = [(int(r.step), float(r.eval_loss)) for r in merges.itertuples()]
        metrics = {**run.metrics, **(read_timing(run.path) or {})}  # wall-clock facts, outside the stage outputs
        runs.append(TrackedRun(
            regime=run.regime, policy=run.policy, seed=run.seed, metrics=_scalars(metrics), series=series,
            artifacts=[run.path / layout.SCHEDULE_FILE, run.path / layout.DECISIONS_FILE, run.path / layout.MERGES_FILE],
        ))  # fmt: skip
    return Collected(runs)


@register("schedules")
def schedules(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.schedule_sets import read_set_index
    from syncsafe.artifacts.schedules import read_schedule
    from syncsafe.artifacts.traces import read_timeline
    from syncsafe.schedules.schedule import LoadIntegral, busy_overlap_fraction

    index = read_set_index(root, regime)
    loads = {seed: LoadIntegral(read_timeline(root, regime, seed)) for seed in sorted(set(index["seed"].astype(int)))}
    rows = []
    for rec in index.itertuples(index=False):
        path = layout.at(root, rec.path)
        schedule = read_schedule(path)
        rows.append({"regime": regime, "policy": rec.policy, "seed": int(rec.seed), "draw": _na(rec.draw),
                     "matched_to": _na(rec.matched_to), "source": rec.source, "artifacts": [path],
                     "metrics": {"n_merges": schedule.n_merges,
                                 "busy_overlap": busy_overlap_fraction(schedule, loads[int(rec.seed)])},
                     "table": {"merge_starts_s": " ".join(f"{s:g}" for s in schedule.merge_starts_s)}})
    return Collected(units(rows))


def _replay_rows(root: Path, index: pd.DataFrame, files: tuple[str, ...] = (layout.SUMMARY_FILE,)
                 ) -> list[dict[str, Any]]:
    from syncsafe.artifacts.replay_sets import read_summary

    rows = []
    for rec in index.to_dict("records"):
        out = layout.at(root, rec["path"])
        rows.append({"regime": rec["regime"], "policy": rec["policy"], "seed": int(rec["seed"]),
                     "draw": _na(rec["draw"]), "matched_to": _na(rec["matched_to"]), "source": rec["source"],
                     "control": bool(rec.get("_repeat", False)), "metrics": _scalars(read_summary(out)),
                     "artifacts": [out / name for name in files]})
    return rows


@register("replay-simulator")
def replay_simulator(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.replay_sets import read_set_index

    index = read_set_index(layout.replay_set_dir(root, layout.SIMULATOR, regime) / layout.INDEX_FILE)
    return Collected(units(_replay_rows(root, index), backend=layout.SIMULATOR))


@register("profile-vllm")
def profile_vllm(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.base import read_json

    server = layout.at(root, layout.VLLM_SERVER_FILE)
    metrics: dict[str, float] = {}
    for name, load in read_json(server, "server profile").get("loads", {}).items():
        for key in ("capacity_rps", "time_scale", "utilisation", "ttft_bound_ms"):
            metrics[f"{name}.{key}"] = float(load[key])
    files = [server, layout.at(root, layout.VLLM_PROFILE), layout.at(root, layout.PROFILE_SERVER_LOG)]
    return Collected(metrics=metrics, artifacts=_present(files))


@register("replay-vllm")
def replay_vllm(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.replay_sets import read_vllm_index

    plan = layout.at(root, layout.VLLM_PLAN)
    files = (layout.SUMMARY_FILE, layout.REQUESTS_FILE, layout.WINDOWS_FILE)
    runs = units(_replay_rows(root, read_vllm_index(root), files), backend=layout.VLLM)
    return Collected(runs, artifacts=_present([layout.at(root, layout.VLLM_SERVER_LOG), plan]))


@register("live")
def live(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.base import read_csv

    path = layout.at(root, layout.LIVE_INDEX)
    index = read_csv(path, "live index", ("regime", "seed", "condition", "slo_violation_rate", "n_merges"))
    seeds = params.live.seeds or params.seeds
    metrics: dict[str, float] = {}
    for row in index[(index["regime"] == regime) & index["seed"].isin(seeds)].itertuples():
        metrics[f"{row.condition}.seed-{row.seed}.slo_violation_rate"] = float(row.slo_violation_rate)
        metrics[f"{row.condition}.seed-{row.seed}.n_merges"] = int(row.n_merges)
    return Collected(metrics=metrics, artifacts=[path])


@register("calibrate-fit")
def calibrate_fit(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.base import read_json

    calibration = read_json(layout.at(root, layout.FITTED_CALIBRATION), "calibration file")
    metrics = {f"calibration.{k}": float(v) for k, v in _scalars(calibration).items() if k != "fitted"}
    names = (layout.CALIBRATION_FILE, layout.MECHANISM_FILE, layout.FIT_FILE, layout.TRANSFER_FILE, layout.REPORT_FILE)
    return Collected(metrics=metrics, artifacts=_present([layout.at(root, layout.CALIBRATION) / n for n in names]))


_FIDELITY_METRICS = ("p95_rel_error_max", "p95_rel_error_mean", "slo_abs_error_pp_max", "slo_abs_error_pp_mean",
                     "sync_ratio_paired_sim_over_real")


@register("fidelity")
def fidelity(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.base import read_json

    evidence = read_json(layout.at(root, layout.FIDELITY_EVIDENCE), "fidelity evidence file")
    metrics = {f"fidelity.{k}": float(evidence[k]) for k in _FIDELITY_METRICS if evidence.get(k) is not None}
    names = (layout.FIDELITY_FILE, layout.FIDELITY_TABLE_FILE, layout.REPORT_FILE, layout.CDF_FIGURE_FILE)
    return Collected(metrics=metrics, artifacts=_present([layout.at(root, layout.FIDELITY) / n for n in names]))


_POLICY_METRICS = ("slo_pct_mean", "sync_excess_pct_mean", "p_vs_matched_random", "seeds_won", "n_seeds")


@register("analyze")
def analyze(root: Path, params: Any, regime: str | None) -> Collected:
    from syncsafe.artifacts.reports import read_policy_table

    reports = layout.at(root, layout.REPORTS)
    table = read_policy_table(root)
    runs = [
        TrackedRun(regime=rec["regime"], policy=rec["policy"], tags={"tier": rec["tier"]},
                   # the real-only block (rows judged on vLLM replays alone) repeats a policy: its own backend
                   backend="vllm" if rec.get("block") == "vllm" else "",
                   metrics={k: rec[k] for k in _POLICY_METRICS if k in rec and pd.notna(rec[k])})
        for rec in table.to_dict("records")
    ]  # fmt: skip
    return Collected(runs, artifacts=sorted(p for p in reports.iterdir() if not p.name.startswith(".")))
