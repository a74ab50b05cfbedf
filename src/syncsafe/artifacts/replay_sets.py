"""Replay sets, their indexes and the replay index.

One replay per directory `runs/replay-sets/<backend>/<regime>/seed-<S>/<schedule>/`
(`layout.replay_dir_for_schedule`): `requests.parquet` (one row per request),
`summary.json` (written last, only for a complete replay) and, for vLLM,
`signals.parquet` and `windows.csv`. Each set has an `index.csv` (the
simulator one per regime, the vLLM one per backend, plus the vLLM
`repeats.csv`); the replay index runs/replay/index.csv joins them. Every
index has `INDEX_COLUMNS` then `EXTRA_COLUMNS`; `path` is the replay
directory and `schedule` the schedule file, both relative to the project root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMissing, read_csv, read_json, read_parquet
from syncsafe.artifacts.layout import PathLike

INDEX_COLUMNS = ("regime", "policy", "seed", "draw", "backend", "slo_violation_rate", "p95_ms", "p99_ms",
                 "n_requests", "n_failed", "path")
EXTRA_COLUMNS = ("matched_to", "source", "n_merges", "schedule", "ttft_p95_ms", "sync_ratio_unpaired", "pressure_ratio",
                 "requests_during_merges", "tokens_per_s", "goodput_rps", "valid")
#: What every summary.json holds (see `syncsafe.serving.metrics.summarize`); plus the SLO and backend facts.
SUMMARY_KEYS = ("slo_violation_rate", "e2e_p95_ms", "e2e_p99_ms", "n_requests", "n_failed")


def write_set_index(path: PathLike, rows: list[dict]) -> pd.DataFrame:
    """A set index (or the vLLM repeats table) from its rows; return the table."""
    df = pd.DataFrame(rows, columns=[*INDEX_COLUMNS, *EXTRA_COLUMNS]).astype({"draw": "Int64"})
    io.write_csv(path, df)
    return df


def read_set_index(path: PathLike, what: str = "replay set index",
                   columns: tuple[str, ...] = INDEX_COLUMNS) -> pd.DataFrame:
    """A set index (or repeats.csv) at `path` with `columns` checked (default: the contract columns)."""
    return read_csv(Path(path), what, columns, hint="run the replay stage first", dtype={"draw": "Int64"})


def set_index_paths(root: PathLike) -> list[Path]:
    """Every set index under runs/replay-sets: per backend and regime, then per backend."""
    base = layout.at(root, layout.REPLAY_SETS)
    index = layout.INDEX_FILE
    return sorted(base.glob(f"*/*/{index}")) + sorted(base.glob(f"*/{index}"))


def write_replay_index(root: PathLike, index: pd.DataFrame) -> Path:
    """runs/replay/index.csv."""
    return io.write_csv(layout.at(root, layout.REPLAY_INDEX), index)


def read_replay_index(root: PathLike = Path(".")) -> pd.DataFrame:
    """runs/replay/index.csv, its contract columns checked."""
    return read_csv(layout.at(root, layout.REPLAY_INDEX), "replay index", INDEX_COLUMNS,
                    hint="run the replay stages first", dtype={"draw": "Int64"})


def read_vllm_index(root: PathLike, repeats: bool = True, columns: tuple[str, ...] = INDEX_COLUMNS) -> pd.DataFrame:
    """runs/replay-sets/vllm/index.csv with a `_repeat` column (False), followed by the rows of
    repeats.csv (`_repeat` True) when `repeats` and the file exists; `columns` checked in both."""
    frames = [read_set_index(layout.at(root, layout.VLLM_INDEX), "vLLM replay index", columns).assign(_repeat=False)]
    path = layout.at(root, layout.VLLM_REPEATS)
    if repeats and path.is_file():
        frames.append(read_set_index(path, "vLLM repeats table", columns).assign(_repeat=True))
    return pd.concat(frames, ignore_index=True)


# --------------------------------------------------------------------------- one replay


def write_replay_files(out: PathLike, requests: pd.DataFrame, summary: dict[str, Any]) -> dict[str, Any]:
    """requests.parquet, then summary.json last (its presence marks a complete replay)."""
    io.write_parquet(Path(out) / layout.REQUESTS_FILE, requests)
    io.write_json(Path(out) / layout.SUMMARY_FILE, summary)
    return summary


def is_complete(replay_dir: PathLike) -> bool:
    return (Path(replay_dir) / layout.SUMMARY_FILE).is_file()


def read_summary(replay_dir: PathLike, keys: tuple[str, ...] = SUMMARY_KEYS) -> dict[str, Any]:
    """summary.json of one replay (with at least `keys`)."""
    return read_json(Path(replay_dir) / layout.SUMMARY_FILE, "replay summary", keys=keys,
                     hint="an incomplete replay; rerun its replay stage")


def read_requests(replay_dir: PathLike, columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """requests.parquet of one replay (with at least `columns`)."""
    return read_parquet(Path(replay_dir) / layout.REQUESTS_FILE, "per-request replay table", columns,
                        hint="an incomplete replay; rerun its replay stage")


def require_replay(replay_dir: PathLike, hint: str) -> None:
    """ArtifactMissing naming the first of requests.parquet, summary.json that `replay_dir` lacks."""
    for name in (layout.REQUESTS_FILE, layout.SUMMARY_FILE):
        path = Path(replay_dir) / name
        if not path.is_file():
            raise ArtifactMissing(f"{path}: missing ({hint})")


def write_signals(out: PathLike, signals: pd.DataFrame) -> Path:
    return io.write_parquet(Path(out) / layout.SIGNALS_FILE, signals)


def write_windows(out: PathLike, windows: pd.DataFrame) -> Path:
    return io.write_csv(Path(out) / layout.WINDOWS_FILE, windows)
