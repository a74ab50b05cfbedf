"""The replay stage: merge schedules replayed against a serving backend under the seed's load.

Backends:
- `simulator`: every schedule of the schedule index (controllers, matched-
  random draws, even cadences, no_sync, offline bounds) through the
  discrete-event model, then per controller schedule its SLO oracle
  (`syncsafe.serving.oracle`; schedule, requests and summary in
  `seed-<S>/slo_oracle/<controller>/`).
- `vllm`: a subset (`replay.vllm`: regimes, seeds, controllers, draws) against
  one real vLLM server for the whole stage run, open loop, with the merge
  workload running beside it during each merge window and the server's
  Prometheus gauges scraped throughout.

Each seed's no_sync schedule is replayed first: the SLO every schedule of
that seed is judged by is the no-sync p95 times `replay.slo.multiplier`
(unless fixed bounds are set). Per replay, in
`runs/replay-sets/<backend>/<regime>/seed-<S>/<schedule>/`: `requests.parquet`
(one row per request), `summary.json` (written last, only for a complete
replay), and for vLLM `signals.parquet` and `windows.csv` (the intervals the
merge workload actually ran). `build_replay_index` joins the per-set indexes
into `runs/replay/index.csv`. Paths and tables: `syncsafe.artifacts.layout` and
`syncsafe.artifacts.replay_sets`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from syncsafe.artifacts import layout
from syncsafe.artifacts.replay_sets import (
    EXTRA_COLUMNS,
    INDEX_COLUMNS,
    read_replay_index,
    read_set_index,
    set_index_paths,
    write_replay_files,
    write_replay_index,
    write_set_index,
)
from syncsafe.artifacts.schedule_sets import read_set_index as read_schedule_set_index
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule, read_schedule, write_schedule
from syncsafe.schedules.stage import in_params
from syncsafe.control.serving_model import simulator_calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, SloSpec, derive_slo, summarize, violation_mask
from syncsafe.serving.oracle import slo_oracle
from syncsafe.serving.simulator import PressureLookup, simulate_at_time_scale

REPLAY_SETS_DIR = layout.REPLAY_SETS
REPLAY_INDEX = layout.REPLAY_INDEX
#: Schedule sources a controller produced (each gets an SLO oracle in the simulator replay).
CONTROLLER_SOURCES = ("train", "harness")
set_dir = layout.replay_set_dir
replay_path = layout.replay_dir_for_schedule

__all__ = ["CONTROLLER_SOURCES", "EXTRA_COLUMNS", "INDEX_COLUMNS", "REPLAY_INDEX", "REPLAY_SETS_DIR",
           "build_replay_index", "index_row", "read_replay_index", "replay_path", "replay_simulator",
           "request_results", "resolve_slo", "seed_schedules", "set_dir", "wall_windows", "write_replay",
           "write_set_index"]


def seed_schedules(root: Path, index: pd.DataFrame) -> Iterable[tuple[int, list[pd.Series]]]:
    """Per seed, its schedule rows with no_sync first."""
    for seed, group in index.groupby("seed", sort=True):
        rows = [r for _, r in group.iterrows()]
        rows.sort(key=lambda r: r["source"] != "no_sync")
        if rows[0]["source"] != "no_sync":
            raise ValueError(f"seed {seed}: the schedule index has no no_sync schedule to derive the SLO from")
        yield int(seed), rows


def resolve_slo(params: Params, no_sync_results: pd.DataFrame) -> SloSpec:
    slo = params.replay.slo
    if slo.ttft_ms is not None or slo.e2e_ms is not None:
        return SloSpec(ttft_ms=slo.ttft_ms, e2e_ms=slo.e2e_ms)
    return derive_slo(no_sync_results, slo.multiplier)


def index_row(row: pd.Series, backend: str, schedule: Schedule, summary: dict, path: Path, root: Path) -> dict:
    return {
        "regime": row["regime"], "policy": row["policy"], "seed": int(row["seed"]),
        "draw": row["draw"], "backend": backend,
        "slo_violation_rate": summary["slo_violation_rate"], "p95_ms": summary["e2e_p95_ms"],
        "p99_ms": summary["e2e_p99_ms"], "n_requests": summary["n_requests"], "n_failed": summary["n_failed"],
        "path": path.relative_to(root).as_posix(),
        "matched_to": row["matched_to"], "source": row["source"], "n_merges": schedule.n_merges,
        "schedule": row["path"], "ttft_p95_ms": summary["ttft_p95_ms"], "sync_ratio_unpaired": summary["sync_ratio_unpaired"],
        "pressure_ratio": summary["pressure_ratio"], "requests_during_merges": summary["requests_during_merges"],
        "tokens_per_s": summary["tokens_per_s"], "goodput_rps": summary["goodput_rps"],
        # false: too many failures or a late load generator (serving.metrics.replay_validity); licenses nothing
        "valid": bool(summary.get("valid", True)),
    }  # fmt: skip


def write_replay(out: Path, results: pd.DataFrame, slo: SloSpec, params: Params, extra: dict) -> dict:
    """requests.parquet, then summary.json last (its presence marks a complete replay)."""
    summary = summarize(results, slo, params.replay.high_pressure).model_dump()
    summary.update({"slo": slo.model_dump(), **extra})
    return write_replay_files(out, results, summary)


# --------------------------------------------------------------------------- simulator


def replay_simulator(params: Params, regime: str, root: Path, *, time_scale: float) -> pd.DataFrame:
    """Every schedule of `regime` through the simulator, plus each controller's SLO oracle; returns the set's index.

    The load is the real arm's: trace time runs at `time_scale` (the stage passes the one the real arm's plan
    replayed the regime at, `realarm.design.simulator_time_scale`), latencies are wall milliseconds of that
    replay pace.
    """
    index = read_schedule_set_index(root, regime)
    calibration = simulator_calibration(params.replay.simulator.calibration, root)
    space = ActionSpace.of_params(params, regime)
    extra = {"backend": "simulator", "calibration": calibration.model_dump(), "time_scale": time_scale}
    rows: list[dict] = []
    n_controllers = int(index["source"].isin(CONTROLLER_SOURCES).sum())
    with tqdm(total=len(index) + n_controllers, desc=f"replay simulator {regime}", unit="replay", leave=False) as bar:
        for seed, schedules in seed_schedules(root, index):
            requests = read_requests(root, regime, seed)
            timeline = read_timeline(root, regime, seed)
            slo = None
            controllers: list[Schedule] = []
            draws: dict[str, list[tuple[Schedule, int]]] = {}
            for row in schedules:
                schedule = read_schedule(layout.at(root, row["path"]))
                results = simulate_at_time_scale(requests, timeline, schedule, calibration, seed, time_scale)
                slo = slo or resolve_slo(params, results)
                out = replay_path(root, "simulator", row["path"])
                summary = write_replay(out, results, slo, params, extra)
                rows.append(index_row(row, "simulator", schedule, summary, out, Path(root)))
                if row["source"] in CONTROLLER_SOURCES:
                    controllers.append(schedule)
                elif row["source"] == "matched_random":
                    draws.setdefault(row["matched_to"], []).append((schedule, int(violation_mask(results, slo).sum())))
                bar.update()
            for controller in controllers:
                found = slo_oracle(controller, space, requests, timeline, calibration, seed, slo,
                                   draws.get(controller.policy, []), max_evals=params.replay.simulator.oracle_evals,
                                   time_scale=time_scale)
                out = layout.slo_oracle_dir(root, regime, seed, controller.policy)
                schedule_path = write_schedule(out / layout.SCHEDULE_FILE, found.schedule)
                results = simulate_at_time_scale(requests, timeline, found.schedule, calibration, seed, time_scale)
                summary = write_replay(out, results, slo, params, {**extra, "oracle_evaluations": found.evaluations,
                                                                   "oracle_start": found.start})
                row = pd.Series({"regime": regime, "policy": "slo_oracle", "seed": seed, "draw": pd.NA,
                                 "matched_to": controller.policy, "source": "slo_oracle",
                                 "path": schedule_path.relative_to(root).as_posix()})
                rows.append(index_row(row, "simulator", found.schedule, summary, out, Path(root)))
                bar.update()
    return write_set_index(layout.replay_set_dir(root, layout.SIMULATOR, regime) / layout.INDEX_FILE, rows)


# --------------------------------------------------------------------------- index


def build_replay_index(root: Path = Path("."), params: Params | None = None) -> pd.DataFrame:
    """Join every backend's set indexes into runs/replay/index.csv (with `params`: only the
    regimes, seeds and policies it names; sets left on disk by removed ones are not indexed)."""
    frames = [read_set_index(p) for p in set_index_paths(root)]
    if not frames:
        raise FileNotFoundError(f"{layout.at(root, REPLAY_SETS_DIR)}: no replay sets; run the replay stage first")
    index = pd.concat(frames, ignore_index=True)
    if params is not None:
        index = in_params(index, params)
    write_replay_index(root, index)
    return index


def request_results(raw: pd.DataFrame, timeline: pd.DataFrame, worked: list[tuple[float, float, int]],
                    start_epoch: float, time_scale: float) -> pd.DataFrame:
    """Load-generator rows → the per-request contract table (+ send lag and cap wait).

    Latencies run from the scheduled arrival; a request is merge-active when its life on the
    server (send to completion) overlaps a window the merge work actually ran.
    """
    send = raw["send_epoch"].to_numpy(dtype=float)
    end = raw["scheduled_epoch"].to_numpy(dtype=float) + raw["e2e_ms"].fillna(0.0).to_numpy(dtype=float) / 1000.0
    end = np.maximum(end, send)
    active = np.zeros(len(raw), dtype=bool)
    for began, finished, _ in worked:
        active |= (send < finished) & (end >= began)
    table = pd.DataFrame({
        "request_id": raw["request_id"], "arrival_s": raw["arrival_s"],
        "send_s": (send - start_epoch) * time_scale, "prompt_tokens": raw["prompt_tokens"],
        "output_tokens": raw["output_tokens"], "ttft_ms": raw["ttft_ms"], "e2e_ms": raw["e2e_ms"],
        "output_tokens_received": raw["output_tokens_received"], "merge_active": active,
        "inference_pressure": PressureLookup(timeline).at(raw["arrival_s"].to_numpy(dtype=float)),
        "error": raw["error"],
    }, columns=list(REQUEST_RESULT_COLUMNS))  # fmt: skip
    table["send_lag_ms"] = (send - raw["scheduled_epoch"].to_numpy(dtype=float)) * 1000.0
    table["cap_wait_ms"] = raw["cap_wait_ms"]
    return table


def wall_windows(schedule: Schedule, start_epoch: float, time_scale: float, span_s: float) -> list[tuple[float, float]]:
    """The schedule's merge windows inside the replayed span [0, span_s), as wall-clock intervals."""
    return [
        (start_epoch + s / time_scale, start_epoch + min(s + schedule.window_s, span_s) / time_scale)
        for s in schedule.merge_starts_s
        if s < span_s
    ]
