"""Real replays as records the fit, the mechanism gate and the fidelity check read.

Time. vLLM replays compress trace time: a request arriving at trace second
`a` is sent at wall second `a / time_scale`, a merge window lasts
`window_s / time_scale` wall seconds, and only arrivals `< max_trace_s` are
replayed; latencies are real milliseconds. Everything that meets the
simulator therefore runs on *wall* time (`wall_inputs`), so a fitted
calibration describes the real server in real milliseconds.

Each seed has one no-sync replay run first (`repeat=False`, the twin every
replay of the seed is paired with, and the SLO's source) and, when the replay
plan repeats it last, a second one (`repeat=True`, listed in
`runs/replay-sets/vllm/repeats.csv`), the drift control of the mechanism gate.
"""

from __future__ import annotations

import warnings
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMissing
from syncsafe.artifacts.replay_sets import read_requests, read_summary, read_vllm_index
from syncsafe.artifacts.traces import read_timeline
from syncsafe.config import Params
from syncsafe.schedules.schedule import Schedule, read_schedule
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, SloSpec, failed_mask, require_columns
from syncsafe.serving.simulator import simulate_replay

VLLM_SET = layout.VLLM_SET
VLLM_INDEX = layout.VLLM_INDEX
#: Second no-sync replay of each seed, run last (same columns as the index).
VLLM_REPEATS = layout.VLLM_REPEATS
#: Server profile written by the vLLM replay stage (`syncsafe.serving.engine_profile`).
VLLM_PROFILE = layout.VLLM_PROFILE


class CalibrationInputError(ArtifactMissing):
    """The vLLM replays the calibration stages need are missing or incomplete (also a FileNotFoundError)."""


@dataclass(frozen=True)
class ReplayRecord:
    """One real (or simulated) replay: per-request table, schedule, load and time scale.

    `results` has the per-request contract columns; `arrival_s` and `send_s`
    are in *trace* seconds, latencies in real milliseconds. `schedule` and
    `timeline` are in trace seconds too. `slo` is the SLO the replay was
    judged by (None: derive from the seed's no-sync replay when needed).
    """

    regime: str
    seed: int
    label: str
    results: pd.DataFrame
    schedule: Schedule
    timeline: pd.DataFrame
    time_scale: float = 1.0
    max_trace_s: float | None = None
    slo: SloSpec | None = None
    repeat: bool = False

    def __post_init__(self) -> None:
        require_columns(self.results, REQUEST_RESULT_COLUMNS, f"replay {self.name}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"replay {self.name}: time_scale must be a positive number (got {self.time_scale})")
        if self.results["request_id"].duplicated().any():
            raise ValueError(f"replay {self.name}: request_id repeats")

    @property
    def name(self) -> str:
        return f"{self.regime}/seed-{self.seed}/{self.label}"

    @property
    def key(self) -> tuple[str, int]:
        return self.regime, self.seed

    @property
    def is_no_sync(self) -> bool:
        return self.schedule.source == "no_sync"

    @property
    def merge_starts_s(self) -> list[float]:
        """The schedule's merge starts inside the replayed span (trace seconds)."""
        cut = self.max_trace_s
        return [s for s in self.schedule.merge_starts_s if cut is None or s < cut]

    @property
    def has_merges(self) -> bool:
        return bool(self.merge_starts_s)

    def by_id(self) -> pd.DataFrame:
        """`results` indexed by request_id, sorted."""
        return self.results.set_index("request_id").sort_index()

    def replayed_schedule(self) -> Schedule:
        """The schedule cut to the replayed span (trace seconds)."""
        return self.schedule.model_copy(update={"merge_starts_s": self.merge_starts_s})


def ok_mask(results: pd.DataFrame) -> np.ndarray:
    """Requests that completed with a finite E2E."""
    return ~failed_mask(results) & np.isfinite(results["e2e_ms"].to_numpy(dtype=float))


def p95(values: np.ndarray) -> float | None:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 95)) if values.size else None


def no_sync_records(records: Iterable[ReplayRecord]) -> dict[tuple[str, int], ReplayRecord]:
    """The (first) no-sync record of each (regime, seed); every seed with any record must have exactly one."""
    records = list(records)
    found: dict[tuple[str, int], ReplayRecord] = {}
    for rec in records:
        if rec.is_no_sync and not rec.repeat:
            if rec.key in found:
                raise ValueError(f"{rec.regime} seed {rec.seed}: more than one no_sync replay")
            found[rec.key] = rec
    missing = sorted({rec.key for rec in records} - set(found))
    if missing:
        raise ValueError(
            "no no_sync replay for " + ", ".join(f"{r} seed {s}" for r, s in missing)
            + ": the paired ratios and the fit need each seed's no_sync replay"
        )
    return found


def repeat_records(records: Iterable[ReplayRecord]) -> dict[tuple[str, int], ReplayRecord]:
    """The repeated (last) no-sync record of each (regime, seed) that has one."""
    return {rec.key: rec for rec in records if rec.repeat}


def wall_inputs(record: ReplayRecord) -> tuple[pd.DataFrame, pd.DataFrame, Schedule]:
    """The simulator's inputs for `record` on wall time: requests, timeline, schedule.

    Requests are the record's (sorted by request_id, cut at `max_trace_s`)
    with `arrival_s / time_scale`; the timeline's `t_s / time_scale`; merge
    windows starting before `max_trace_s`, every time field divided by
    `time_scale`.
    """
    scale = record.time_scale
    req = record.by_id()
    if record.max_trace_s is not None:
        req = req[req["arrival_s"] < record.max_trace_s]
    requests = pd.DataFrame({
        "arrival_s": req["arrival_s"].to_numpy(dtype=float) / scale,
        "prompt_tokens": req["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens": req["output_tokens"].to_numpy(dtype=np.int64),
    })  # fmt: skip
    timeline = record.timeline.copy()
    timeline["t_s"] = timeline["t_s"].to_numpy(dtype=float) / scale
    s = record.schedule
    schedule = s.model_copy(update=dict(
        duration_s=s.duration_s / scale, window_s=s.window_s / scale, min_gap_s=s.min_gap_s / scale,
        merge_starts_s=[x / scale for x in record.merge_starts_s],
    ))  # fmt: skip
    return requests, timeline, schedule


def simulate_record(record: ReplayRecord, calibration: Calibration) -> ReplayRecord:
    """`record` replayed by the simulator on its wall-time inputs; the result in the record's units.

    The simulated table keeps the real request ids and trace-second
    `arrival_s`/`send_s` (the simulator sends on time), latencies in ms.
    """
    requests, timeline, schedule = wall_inputs(record)
    sim = simulate_replay(requests, timeline, schedule, calibration, record.seed)
    ids = record.by_id()
    if record.max_trace_s is not None:
        ids = ids[ids["arrival_s"] < record.max_trace_s]
    sim["request_id"] = ids.index.to_numpy()
    sim["arrival_s"] = ids["arrival_s"].to_numpy(dtype=float)
    sim["send_s"] = sim["arrival_s"]
    return replace(record, results=sim)


def read_vllm_records(params: Params, root: Path, seeds: Iterable[int] | None = None) -> list[ReplayRecord]:
    """Every complete vLLM replay (index and repeats) of the given seeds (None: all) as a `ReplayRecord`.

    A replay marked invalid (too many failures or a late load generator,
    `valid: false` in its summary) licenses nothing, and neither does the rest
    of its seed: the paired measures need every replay of a seed, so the whole
    seed is left out, with a warning naming it.
    """
    root = Path(root)
    index_path = layout.at(root, VLLM_INDEX)
    if not index_path.is_file():
        why = (
            "replay.vllm.enabled is false in params.yaml, so the replay-vllm stage writes none; enable it and run it"
            if not params.replay.vllm.enabled
            else "run the replay-vllm stage first (`syncsafe replay run --backend vllm`)"
        )
        raise CalibrationInputError(f"{index_path}: no vLLM replays; {why}")
    index = read_vllm_index(root, columns=("regime", "seed", "path", "schedule", "source"))
    if seeds is not None:
        index = index[index["seed"].isin(list(seeds))]
    cfg = params.replay.vllm
    records = []
    invalid: set[tuple[str, int]] = set()
    timelines: dict[tuple[str, int], pd.DataFrame] = {}
    for row in index.to_dict("records"):
        out = layout.at(root, row["path"])
        for name in (layout.REQUESTS_FILE, layout.SUMMARY_FILE):
            if not (out / name).is_file():
                raise CalibrationInputError(f"{out / name}: missing (an incomplete vLLM replay); "
                                            "rerun the replay-vllm stage")
        summary = read_summary(out)
        regime, seed = str(row["regime"]), int(row["seed"])
        if not summary.get("valid", True):
            invalid.add((regime, seed))
            warnings.warn(f"{out}: invalid replay ({summary.get('invalid_reason', 'marked invalid')}): "
                          f"seed {seed} of {regime} is left out of calibration and fidelity", stacklevel=2)
        if (regime, seed) not in timelines:
            timelines[regime, seed] = read_timeline(root, regime, seed)
        records.append(ReplayRecord(
            regime=regime, seed=seed, label=record_label(str(row["path"])), results=read_requests(out),
            schedule=read_schedule(layout.at(root, row["schedule"])), timeline=timelines[regime, seed],
            time_scale=float(summary.get("time_scale", cfg.time_scale)),
            max_trace_s=float(summary.get("max_trace_s", cfg.max_trace_s)),
            slo=SloSpec(**summary["slo"]) if summary.get("slo") else None, repeat=bool(row["_repeat"]),
        ))  # fmt: skip
    return [r for r in records if (r.regime, r.seed) not in invalid]


def record_label(path: str) -> str:
    """`fixed_h` or `matched_random/fixed_h-000` from runs/replay-sets/vllm/<regime>/seed-S/<label>."""
    return layout.replay_label(path)
