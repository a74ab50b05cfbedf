"""The merge-schedule contract and how a schedule meets the load.

The contract itself (`Schedule`, `read_schedule`, `write_schedule`, the
sources) lives in :mod:`syncsafe.artifacts.schedules` and is re-exported
here; this module adds the load integrals and busy-overlap measures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from syncsafe.artifacts.schedule_sets import INDEX_COLUMNS
from syncsafe.artifacts.schedules import (
    DRAW_SOURCES,
    Schedule,
    ScheduleError,
    ScheduleFileError,
    ScheduleFileMissing,
    Source,
    read_schedule,
    write_schedule,
)

__all__ = [
    "DRAW_SOURCES", "INDEX_COLUMNS", "LoadIntegral", "Schedule", "ScheduleError", "ScheduleFileError",
    "ScheduleFileMissing", "Source", "busy_overlap_fraction", "busy_overlap_s", "read_schedule", "write_schedule",
]


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
