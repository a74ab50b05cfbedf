"""The merge-schedule contract: one JSON per schedule.

Keys `regime, policy, seed, draw, matched_to, source, duration_s, window_s,
min_gap_s, merge_starts_s`. `source` is one of harness, train, live,
matched_random, matched_random_free, even_cadence, no_sync, offline_bound,
slo_oracle; `draw` is set only for the draws of the two matched-random
envelopes and `matched_to` names the controller whose budget a derived
schedule copies. (`syncsafe.schedules.schedule` re-exports this and adds how a
schedule meets the load.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from syncsafe import io
from syncsafe.artifacts.base import ArtifactMalformed, ArtifactMissing

Source = Literal[
    "harness", "train", "live", "matched_random", "matched_random_free", "even_cadence", "no_sync", "offline_bound",
    "slo_oracle",
]
#: Sources whose schedules are numbered draws of an envelope.
DRAW_SOURCES = ("matched_random", "matched_random_free")


class ScheduleError(ValueError):
    """A schedule breaks the contract."""


class ScheduleFileError(ScheduleError, ArtifactMalformed):
    """A schedule file that does not parse or breaks the contract (bad input, exit 2)."""


class ScheduleFileMissing(ScheduleError, ArtifactMissing):
    """A schedule file that is not there."""


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

    def overlaps(self, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
        """True where [start_s, end_s) overlaps a merge window, or a window is active at start_s."""
        starts = np.asarray(self.merge_starts_s, dtype=float)
        if starts.size == 0:
            return np.zeros(np.shape(start_s), dtype=bool)
        last = np.searchsorted(starts, end_s, side="left") - 1  # last window opening before end_s
        overlap = (last >= 0) & (starts[np.maximum(last, 0)] + self.window_s > start_s)
        return overlap | self.windows_mask(start_s)

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
    """The schedule at `path` (ScheduleFileError naming the file when it is missing or breaks the contract)."""
    path = Path(path)
    try:
        return Schedule.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ScheduleFileMissing(f"{path}: schedule file not found") from None
    except (json.JSONDecodeError, ValidationError) as err:
        raise ScheduleFileError(f"{path}: not a valid schedule: {err}") from None
