"""The merge-schedule contract and how a schedule meets the load.

One JSON per schedule with keys `regime, policy, seed, draw, matched_to,
source, duration_s, window_s, min_gap_s, merge_starts_s`. `source` is one of
harness, train, live, matched_random, matched_random_free, even_cadence,
no_sync, offline_bound, slo_oracle; `draw` is set only for the draws of the
two matched-random envelopes and `matched_to` names the controller whose budget a
derived schedule copies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from syncsafe import io

Source = Literal[
    "harness", "train", "live", "matched_random", "matched_random_free", "even_cadence", "no_sync", "offline_bound",
    "slo_oracle",
]
#: Sources whose schedules are numbered draws of an envelope.
DRAW_SOURCES = ("matched_random", "matched_random_free")
INDEX_COLUMNS = ("regime", "policy", "seed", "draw", "matched_to", "source", "n_merges", "path")


class ScheduleError(ValueError):
    """A schedule file breaks the contract."""


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    regime: str
    policy: str
    seed: int
    draw: int | None = None
    matched_to: str | None = None
    source: Source
    duration_s: float = Field(gt=0)
    window_s: float = Field(gt=0)
    min_gap_s: float = Field(ge=0)
    merge_starts_s: list[float]

    @model_validator(mode="after")
    def _feasible(self) -> Schedule:
        starts = self.merge_starts_s
        if any(b < a for a, b in zip(starts, starts[1:])):
            raise ValueError("merge_starts_s must be sorted")
        if starts and (starts[0] < 0 or starts[-1] + self.window_s > self.duration_s + 1e-6):
            raise ValueError("every merge window must lie inside [0, duration_s]")
        gaps = np.diff(starts) - self.window_s
        if gaps.size and gaps.min() < self.min_gap_s - 1e-6:
            raise ValueError(f"merges closer than min_gap_s ({self.min_gap_s}): smallest gap {gaps.min():.3f}")
        if (self.draw is not None) != (self.source in DRAW_SOURCES):
            raise ValueError(f"draw is set exactly for {' and '.join(DRAW_SOURCES)} schedules")
        return self

    @property
    def n_merges(self) -> int:
        return len(self.merge_starts_s)

    def windows_mask(self, t_s: np.ndarray) -> np.ndarray:
        """True at each time in `t_s` that lies inside a merge window."""
        starts = np.asarray(self.merge_starts_s)
        if starts.size == 0:
            return np.zeros(np.shape(t_s), dtype=bool)
        i = np.searchsorted(starts, t_s, side="right") - 1
        return (i >= 0) & (np.asarray(t_s) < starts[np.maximum(i, 0)] + self.window_s)


def write_schedule(path: Path, schedule: Schedule) -> Path:
    return io.write_json(path, schedule.model_dump())


def read_schedule(path: str | Path) -> Schedule:
    path = Path(path)
    try:
        return Schedule.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ScheduleError(f"{path}: schedule file not found") from None
    except (json.JSONDecodeError, ValidationError) as err:
        raise ScheduleError(f"{path}: not a valid schedule: {err}") from None


class LoadIntegral:
    """Exact integrals of the timeline's step functions over any window.

    Row i of the timeline holds over [t_i, t_i + step). `over(column, starts,
    window)` gives the integral of that column over [s, s + window) for each
    start: seconds of busy overlap for `busy`, pressure-seconds for pressures.
    """

    def __init__(self, timeline: pd.DataFrame) -> None:
        t = timeline["t_s"].to_numpy(dtype=float)
        self.step_s = float(t[1] - t[0]) if t.size > 1 else 1.0
        self._edges = np.append(t, t[-1] + self.step_s)
        self._cum = {
            col: np.concatenate([[0.0], np.cumsum(timeline[col].to_numpy(dtype=float) * self.step_s)])
            for col in timeline.columns
            if col != "t_s"
        }

    def over(self, column: str, starts: np.ndarray | list[float], window_s: float) -> np.ndarray:
        starts = np.asarray(starts, dtype=float)
        cum = self._cum[column]
        return np.interp(starts + window_s, self._edges, cum) - np.interp(starts, self._edges, cum)


def busy_overlap_s(schedule: Schedule, load: LoadIntegral) -> float:
    """Total seconds of merge windows that fall in serving bursts."""
    return float(load.over("busy", schedule.merge_starts_s, schedule.window_s).sum())


def busy_overlap_fraction(schedule: Schedule, load: LoadIntegral) -> float:
    """Share of merge-window time spent in serving bursts (0 when there are no merges)."""
    total = schedule.n_merges * schedule.window_s
    return busy_overlap_s(schedule, load) / total if total else 0.0
