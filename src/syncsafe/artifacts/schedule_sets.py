"""Schedule sets and the schedule index.

Each regime's set lives in runs/schedule-sets/<regime>/ (schedules at
`layout.schedule_rel`, decision logs of harness controllers beside them)
with its own `index.csv`; the schedule index runs/schedules/index.csv joins
the sets of the regimes in params. Both indexes have the columns
`INDEX_COLUMNS`; `path` is the schedule file, relative to the project root.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_csv
from syncsafe.artifacts.layout import PathLike

INDEX_COLUMNS = ("regime", "policy", "seed", "draw", "matched_to", "source", "n_merges", "path")


def index_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows as a schedule index table (column order and dtypes of the contract)."""
    df = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    return df.astype({"draw": "Int64", "seed": "int64", "n_merges": "int64"})


def read_index(path: PathLike) -> pd.DataFrame:
    """A schedule index (a set's or the joined one) at `path`, its columns checked."""
    return read_csv(Path(path), "schedule index", INDEX_COLUMNS, hint="run the schedules stage first",
                    dtype={"draw": "Int64"}, keep_default_na=True)


def read_set_index(root: PathLike, regime: str) -> pd.DataFrame:
    """runs/schedule-sets/<regime>/index.csv."""
    return read_index(layout.schedule_set_index(root, regime))


def write_set_index(root: PathLike, regime: str, rows: list[dict]) -> pd.DataFrame:
    """Write runs/schedule-sets/<regime>/index.csv from its rows; return the table."""
    index = index_frame(rows)
    io.write_csv(layout.schedule_set_index(root, regime), index)
    return index


def read_schedule_index(root: PathLike) -> pd.DataFrame:
    """runs/schedules/index.csv (the contract path)."""
    return read_index(layout.at(root, layout.SCHEDULE_INDEX))


def write_schedule_index(root: PathLike, rows: list[dict]) -> pd.DataFrame:
    """Write runs/schedules/index.csv from its rows; return the table."""
    index = index_frame(rows)
    io.write_csv(layout.at(root, layout.SCHEDULE_INDEX), index)
    return index
