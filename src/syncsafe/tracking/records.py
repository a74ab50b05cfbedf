"""What tracking logs: an item run, what a collector read from a stage's files, what a stage left in the store."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from syncsafe.tracking.settings import _MAX_TAG_VALUE


@dataclass
class TrackedRun:
    """One item run: the unit people compare, a regime x policy x seed result the stage has written to disk.

    ``metrics`` are scalars (logged at step 0); ``series`` are curves, name ->
    ``[(step, value), ...]`` (a loss curve). ``tables`` are logged as
    ``<name>.parquet`` artifacts (a controller's matched-random draws and
    references, one row each). ``artifacts`` are files or folders already on
    disk, logged under their own names. ``params`` are the item's own (the
    stage's params are on the stage run); ``tags`` add extra tags (the
    standard ones always win).
    """

    regime: str = ""
    policy: str = ""
    seed: int | str | None = None
    draw: int | str | None = None
    matched_to: str | None = ""
    backend: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float | int | None] = field(default_factory=dict)
    series: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)
    tables: Mapping[str, Any] = field(default_factory=dict)
    artifacts: Sequence[str | os.PathLike[str]] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    status: str = "FINISHED"

    def run_name(self) -> str:
        """``regime/policy[/to-<matched>][/backend][/s<seed>][/d<draw>]`` unless ``name`` is set."""
        if self.name:
            return self.name
        parts = [self.regime, self.policy]
        if self.matched_to:
            parts.append(f"to-{self.matched_to}")
        if self.backend:
            parts.append(self.backend)
        seed, draw = tag_value(self.seed), tag_value(self.draw)
        if seed:
            parts.append(f"s{seed}")
        if draw:
            parts.append(f"d{int(draw):03d}" if draw.isdigit() else f"d{draw}")
        return "/".join(p for p in parts if p) or "run"


@dataclass
class Collected:
    """What a collector read back from a stage's outputs: item runs plus stage-level scalars and files."""

    runs: list[TrackedRun] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[os.PathLike[str] | str] = field(default_factory=list)


@dataclass(frozen=True)
class StageRecord:
    """What one tracked stage left in the store."""

    uri: str
    experiment_id: str
    pipeline_run_id: str
    parent_run_id: str
    stage_run_id: str
    run_ids: tuple[str, ...]


def tag_value(value: Any) -> str:
    """A tag value: None, NaN and pandas' NA are empty; integral floats (a seed read back
    from a DataFrame) print as integers."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return ""
    if type(value).__name__ in ("bool", "bool_"):
        return str(bool(value))
    if isinstance(value, float) or type(value).__module__ == "numpy":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return str(value)[:_MAX_TAG_VALUE]
        if math.isnan(number):
            return ""
        if number.is_integer():
            return str(int(number))
    return str(value)[:_MAX_TAG_VALUE]
