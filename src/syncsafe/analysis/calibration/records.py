"""Real replays as records the fit, the mechanism gate and the fidelity check read.

Time. vLLM replays compress trace time: a request arriving at trace second
`a` is sent at wall second `a / time_scale`, a merge window lasts
`window_s / time_scale` wall seconds, and only arrivals in the span
`[0, span_s)` are replayed; latencies are real milliseconds. The simulator
meets them at the same time scale (`simulate_record`,
`syncsafe.serving.simulator.simulate_at_time_scale`), so a fitted
calibration describes the real server in real milliseconds.

Each seed's no-sync schedule is replayed several times, one control per
round of the seed's campaign block (`design.seed_block`; `control` 0, 1, ...;
`position` is every replay's place in the regime's order): the first is
listed in the vLLM index, the later ones in
`runs/replay-sets/vllm/repeats.csv` (`repeat`); the SLO comes from all of
them pooled.
The mechanism gate pairs each replay with its nearest controls; the fit
uses every control of every fit seed.

Inference pressure. The real arm applies none: the load generator and the
merge workers only record the timeline's `inference_pressure` column beside
each request, nothing loads the server with it. A replay summary says
`inference_pressure_applied: true` only where an arm did apply it (none
writes that today), and `ReplayRecord.pressure_applied` carries it: the fit
fits `pressure_slowdown` only on replays that applied pressure.
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
from syncsafe.serving.simulator import simulate_at_time_scale
from syncsafe.realarm.design import nearest_controls

VLLM_SET = layout.VLLM_SET
VLLM_INDEX = layout.VLLM_INDEX
#: The later no-sync controls of each seed (same columns as the index).
VLLM_REPEATS = layout.VLLM_REPEATS
#: The engine profile the profile-vllm stage writes (`syncsafe.realarm.engine_profile`).
VLLM_PROFILE = layout.VLLM_PROFILE
#: Summary key of a replay that loaded the server with the timeline's inference pressure (absent: it did not).
PRESSURE_APPLIED_KEY = "inference_pressure_applied"


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
    span_s: float | None = None
    slo: SloSpec | None = None
    #: Which no-sync control this replay is (0 = the first), None for a replay with merges.
    control: int | None = None
    #: Place in its regime's replay order (None: unknown, as in replays written before positions were kept).
    position: int | None = None
    #: The replay loaded the server with the timeline's inference pressure (the vLLM arm does not).
    pressure_applied: bool = False

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
    def repeat(self) -> bool:
        """A later no-sync control (not the seed's first no-sync replay)."""
        return bool(self.control)

    @property
    def merge_starts_s(self) -> list[float]:
        """The schedule's merge starts inside the replayed span (trace seconds)."""
        cut = self.span_s
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
    """The first no-sync control among `records` of each (regime, seed) (the first replayed one, or the
    earliest valid one when it was left out); every seed with any record must have one."""
    records = list(records)
    found: dict[tuple[str, int], ReplayRecord] = {}
    for rec in sorted((r for r in records if r.is_no_sync), key=lambda r: r.control or 0):
        if rec.key in found and (found[rec.key].control or 0) == (rec.control or 0):
            raise ValueError(f"{rec.regime} seed {rec.seed}: more than one no_sync replay of control "
                             f"{rec.control or 0}")
        found.setdefault(rec.key, rec)
    missing = sorted({rec.key for rec in records} - set(found))
    if missing:
        raise ValueError(
            "no no_sync replay for " + ", ".join(f"{r} seed {s}" for r, s in missing)
            + ": the paired ratios and the fit need each seed's no_sync replay"
        )
    return found


def without_later_controls(records: Iterable[ReplayRecord]) -> list[ReplayRecord]:
    """`records` with one no-sync control per seed (`no_sync_records`'): what the fidelity tables use, the
    later controls serving the drift check, the pairing and the fit."""
    records = list(records)
    first = {id(r) for r in no_sync_records(records).values()}
    return [r for r in records if not r.is_no_sync or id(r) in first]


def control_records(records: Iterable[ReplayRecord]) -> dict[tuple[str, int], list[ReplayRecord]]:
    """Every no-sync control of each (regime, seed), by control number."""
    out: dict[tuple[str, int], list[ReplayRecord]] = {}
    for rec in records:
        if rec.is_no_sync:
            out.setdefault(rec.key, []).append(rec)
    return {key: sorted(recs, key=lambda r: r.control or 0) for key, recs in out.items()}


def nearest_control_records(rec: ReplayRecord, controls: list[ReplayRecord]) -> list[ReplayRecord]:
    """The seed's controls by distance from `rec` in replay order (the earlier first on a tie); the first
    control alone leads when positions are unknown."""
    if rec.position is None or any(c.position is None for c in controls):
        return sorted(controls, key=lambda c: c.control or 0)
    positions = {c.control or 0: c.position for c in controls}
    order = nearest_controls(rec.position, positions)  # type: ignore[arg-type]
    by_number = {c.control or 0: c for c in controls}
    return [by_number[n] for n in order]


def simulate_record(record: ReplayRecord, calibration: Calibration) -> ReplayRecord:
    """`record` replayed by the simulator on its own span and time scale; the result in the record's units.

    The simulated table keeps the real request ids and trace-second
    `arrival_s`/`send_s` (the simulator sends on time), latencies in wall ms.
    """
    ids = record.by_id()
    if record.span_s is not None:
        ids = ids[ids["arrival_s"] < record.span_s]
    requests = pd.DataFrame({
        "arrival_s": ids["arrival_s"].to_numpy(dtype=float),
        "prompt_tokens": ids["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens": ids["output_tokens"].to_numpy(dtype=np.int64),
    })  # fmt: skip
    sim = simulate_at_time_scale(requests, record.timeline, record.replayed_schedule(), calibration, record.seed,
                                 record.time_scale)
    sim["request_id"] = ids.index.to_numpy()
    return replace(record, results=sim)


def read_vllm_records(params: Params, root: Path, seeds: Iterable[int] | None = None) -> list[ReplayRecord]:
    """Every complete vLLM replay (index and repeats) of the given seeds (None: all) as a `ReplayRecord`.

    A replay marked invalid (too many failures, a late load generator, a busy
    machine: `valid: false` in its summary) licenses nothing and is left out,
    with a warning naming it (`invalid_replays` lists them for the reports).
    The seed's valid replays stand: a replay with merges is paired with the
    nearest *valid* no-sync controls, and the fidelity sign check of a
    controller needs it and one of its draws valid. A seed none of whose
    no-sync controls is valid has nothing to pair with and is left out whole.
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
    timelines: dict[tuple[str, int], pd.DataFrame] = {}
    for row in index.to_dict("records"):
        out = layout.at(root, row["path"])
        for name in (layout.REQUESTS_FILE, layout.SUMMARY_FILE):
            if not (out / name).is_file():
                raise CalibrationInputError(f"{out / name}: missing (an incomplete vLLM replay); "
                                            "rerun the replay-vllm stage")
        summary = read_summary(out)
        regime, seed = str(row["regime"]), int(row["seed"])
        control = summary.get("control", (1 if row["_repeat"] else 0) if row["source"] == "no_sync" else None)
        if not summary.get("valid", True):
            warnings.warn(f"{out}: invalid replay ({summary.get('invalid_reason', 'marked invalid')}): "
                          "left out of calibration and fidelity", stacklevel=2)
            continue
        if (regime, seed) not in timelines:
            timelines[regime, seed] = read_timeline(root, regime, seed)
        records.append(ReplayRecord(
            regime=regime, seed=seed, label=record_label(str(row["path"])), results=read_requests(out),
            schedule=read_schedule(layout.at(root, row["schedule"])), timeline=timelines[regime, seed],
            time_scale=float(summary.get("time_scale", cfg.pinned_time_scale(regime) or 1.0)),
            span_s=_span(summary), slo=SloSpec(**summary["slo"]) if summary.get("slo") else None,
            control=None if control is None else int(control), position=summary.get("position"),
            pressure_applied=bool(summary.get(PRESSURE_APPLIED_KEY, False)),
        ))  # fmt: skip
    controlled = {r.key for r in records if r.is_no_sync}
    for regime, seed in sorted({r.key for r in records} - controlled):
        warnings.warn(f"{regime} seed {seed}: no valid no-sync control, so nothing to pair its replays with: "
                      "the seed is left out of calibration and fidelity", stacklevel=2)
    return [r for r in records if r.key in controlled]


def _span(summary: dict) -> float | None:
    """The replayed span of a summary (`span_s`; `max_trace_s` in replays written before the span was planned)."""
    value = summary.get("span_s", summary.get("max_trace_s"))
    return None if value is None else float(value)


def invalid_replays(root: Path) -> list[dict]:
    """Every vLLM replay marked invalid: regime, seed, replay path and why (empty without a vLLM index)."""
    if not layout.at(root, VLLM_INDEX).is_file():
        return []
    index = read_vllm_index(root, columns=("regime", "seed", "path"))
    out = []
    for row in index.to_dict("records"):
        replay = layout.at(root, row["path"])
        if not (replay / layout.SUMMARY_FILE).is_file():
            continue
        summary = read_summary(replay)
        if not summary.get("valid", True):
            out.append({"regime": str(row["regime"]), "seed": int(row["seed"]), "path": str(row["path"]),
                        "reason": str(summary.get("invalid_reason") or "marked invalid")})
    return out


def record_label(path: str) -> str:
    """`fixed_h` or `matched_random/fixed_h-000` from runs/replay-sets/vllm/<regime>/seed-S/<label>."""
    return layout.replay_label(path)
