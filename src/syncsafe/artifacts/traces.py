"""Trace sets: data/traces/<regime>/seed-<S>/.

`timeline.parquet` (the load timeline, `TIMELINE_COLUMNS`, one row per
`traces.step_s`), `requests.parquet` (the request list, at least
`REQUEST_COLUMNS`) and, for regimes cut from a recorded trace, `trace.json`
(segment bounds, token limit, number of requests clipped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMissing, read_json, read_parquet
from syncsafe.artifacts.layout import PathLike

TIMELINE_COLUMNS = (
    "t_s",
    "busy",
    "arrival_rate",
    "inference_pressure",
    "network_pressure",
    "checkpoint_pressure",
)
REQUEST_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_timeline(root: PathLike, regime: str, seed: int) -> pd.DataFrame:
    """The load timeline of one regime and seed."""
    path = layout.trace_dir(root, regime, seed) / layout.TIMELINE_FILE
    if not path.is_file():
        raise ArtifactMissing(f"{path}: no timeline; run the traces stage for regime {regime!r} first")
    return read_parquet(path, "load timeline", TIMELINE_COLUMNS)


def read_requests(root: PathLike, regime: str, seed: int) -> pd.DataFrame:
    """The request list of one regime and seed."""
    path = layout.trace_dir(root, regime, seed) / layout.REQUESTS_FILE
    return read_parquet(path, "request list", REQUEST_COLUMNS, hint=f"run the traces stage for regime {regime!r} first")


def read_trace_info(root: PathLike, regime: str, seed: int) -> dict[str, Any] | None:
    """trace.json of a regime cut from a recorded trace (None for a synthetic regime)."""
    path = layout.trace_dir(root, regime, seed) / layout.TRACE_INFO_FILE
    return read_json(path, "trace segment description") if path.is_file() else None


def write_trace_set(root: PathLike, regime: str, seed: int, timeline: pd.DataFrame, requests: pd.DataFrame,
                    info: dict[str, Any] | None = None) -> list[Path]:
    """timeline.parquet, requests.parquet and (with `info`) trace.json of one seed; the paths written."""
    out = layout.trace_dir(root, regime, seed)
    written = [io.write_parquet(out / layout.TIMELINE_FILE, timeline),
               io.write_parquet(out / layout.REQUESTS_FILE, requests)]
    if info is not None:
        written.append(io.write_json(out / layout.TRACE_INFO_FILE, info))
    return written
