"""Importers that turn public LLM request traces into the request table.

Each reads its columns by exact name. The result has the same columns as
generated requests (`arrival_s, prompt_tokens, output_tokens`), in file
order, with arrivals shifted so the first request arrives at 0 s.

- `azure`: Azure LLM inference traces, `TIMESTAMP,ContextTokens,GeneratedTokens`.
- `burstgpt`: `Timestamp` (s), `Request tokens`, `Response tokens`; failed
  requests (0 response tokens) are dropped.
- `mooncake`: `timestamp` (ms), `input_length`, `output_length`.
- `requests`: the request table itself, `arrival_s` (s), `prompt_tokens`, `output_tokens`.

The file's suffix picks the reader: `.parquet`, `.jsonl`/`.json` (JSON lines),
anything else CSV. A file that is not a usable trace raises
`TraceImportError` (a `BadInput`, exit 2) with one line naming the file and
the column: no rows, a missing column, a time that is not a number/date,
negative or decreasing, token counts that are missing, infinite, negative or
not whole numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from syncsafe.errors import BadInput
from syncsafe.traces.requests import REQUEST_COLUMNS

#: Formats a trace regime or `syncsafe import-trace` can read.
TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "requests")


class TraceImportError(BadInput):
    """A trace file is not a usable request trace; the message names the file and column."""


def read_table(path: Path) -> pd.DataFrame:
    """The raw table of `path`, read by suffix (Parquet, JSON lines or CSV)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".jsonl", ".json"):
            return pd.read_json(path, lines=True)
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError, OSError) as err:
        kind = {".parquet": "Parquet", ".jsonl": "JSON lines", ".json": "JSON lines"}.get(suffix, "CSV")
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TraceImportError(f"{path}: cannot read as {kind}: {first}") from None


def _require(df: pd.DataFrame, path: Path, columns: tuple[str, ...], fmt: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceImportError(
            f"{path}: not a {fmt} trace: missing column(s) {missing}; expected {list(columns)}, found {list(df.columns)}"
        )
    if df.empty:
        raise TraceImportError(f"{path}: no rows (a {fmt} trace needs at least one request)")


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _show(value: object) -> str:
    """A cell as the file shows it: strings quoted, numbers and dates plain."""
    return repr(value) if isinstance(value, str) else str(value)


def _times(path: Path, column: str, seconds: pd.Series, raw: pd.Series) -> np.ndarray:
    """Arrival seconds: finite numbers, never decreasing, >= 0."""
    t = seconds.to_numpy(dtype=float)
    bad = ~np.isfinite(t)
    if bad.any():
        row = _first_bad(bad)
        raise TraceImportError(f"{path}: column {column!r} row {row}: not a finite time ({_show(raw.iloc[row])})")
    down = np.diff(t) < 0
    if down.any():
        row = _first_bad(down) + 1
        raise TraceImportError(
            f"{path}: column {column!r} row {row}: time goes backwards ({_show(raw.iloc[row])} after {_show(raw.iloc[row - 1])}); "
            "the trace must be sorted by time"
        )
    if (t < 0).any():
        row = _first_bad(t < 0)
        raise TraceImportError(f"{path}: column {column!r} row {row}: negative time ({_show(raw.iloc[row])})")
    return t


def _tokens(path: Path, column: str, raw: pd.Series) -> np.ndarray:
    """Token counts: whole numbers >= 0 (checked in this order, so NaN is reported first)."""
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    for bad, what in (
        (np.isnan(values), "not a number"),
        (np.isinf(values), "infinite"),
        (values < 0, "negative"),
        (values != np.rint(values), "not a whole number"),
    ):
        if bad.any():
            row = _first_bad(bad)
            raise TraceImportError(f"{path}: column {column!r} row {row}: token count is {what} ({_show(raw.iloc[row])})")
    return values.astype(np.int64)


def _to_requests(path: Path, df: pd.DataFrame, time_col: str, seconds: pd.Series, prompt: str, output: str) -> pd.DataFrame:
    t = _times(path, time_col, seconds, df[time_col])
    return pd.DataFrame(
        {
            "arrival_s": t - t[0],
            "prompt_tokens": _tokens(path, prompt, df[prompt]),
            "output_tokens": _tokens(path, output, df[output]),
        },
        columns=list(REQUEST_COLUMNS),
    )


def _numeric_seconds(df: pd.DataFrame, column: str, scale: float = 1.0) -> pd.Series:
    return pd.to_numeric(df[column], errors="coerce") / scale


def import_azure(path: Path) -> pd.DataFrame:
    """Azure LLM inference trace (2023/2024 releases)."""
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    df = read_table(path)
    _require(df, path, cols, "Azure LLM inference")
    stamps = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
    seconds = (stamps - stamps.iloc[0]).dt.total_seconds()
    return _to_requests(path, df, "TIMESTAMP", seconds, "ContextTokens", "GeneratedTokens")


def import_burstgpt(path: Path) -> pd.DataFrame:
    """BurstGPT trace; rows with 0 response tokens (failed requests) are dropped."""
    cols = ("Timestamp", "Request tokens", "Response tokens")
    df = read_table(path)
    _require(df, path, cols, "BurstGPT")
    df = df[pd.to_numeric(df["Response tokens"], errors="coerce") != 0].reset_index(drop=True)
    if df.empty:
        raise TraceImportError(f"{path}: column 'Response tokens': no successful requests (every row has 0)")
    return _to_requests(path, df, "Timestamp", _numeric_seconds(df, "Timestamp"), "Request tokens", "Response tokens")


def import_mooncake(path: Path) -> pd.DataFrame:
    """Mooncake trace; `timestamp` is in milliseconds."""
    cols = ("timestamp", "input_length", "output_length")
    df = read_table(path)
    _require(df, path, cols, "Mooncake")
    return _to_requests(path, df, "timestamp", _numeric_seconds(df, "timestamp", 1000.0), "input_length", "output_length")


def import_requests(path: Path) -> pd.DataFrame:
    """A request table (`arrival_s` in seconds), e.g. one `import-trace` wrote."""
    df = read_table(path)
    _require(df, path, REQUEST_COLUMNS, "request-table")
    return _to_requests(path, df, "arrival_s", _numeric_seconds(df, "arrival_s"), "prompt_tokens", "output_tokens")


IMPORTERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    "azure": import_azure,
    "burstgpt": import_burstgpt,
    "mooncake": import_mooncake,
    "requests": import_requests,
}


def import_trace(fmt: str, path: str | Path) -> pd.DataFrame:
    """Import `path` with the importer named `fmt` (see TRACE_FORMATS)."""
    try:
        importer = IMPORTERS[fmt]
    except KeyError:
        raise TraceImportError(f"unknown trace format {fmt!r}; expected one of {list(TRACE_FORMATS)}") from None
    path = Path(path)
    if not path.is_file():
        raise TraceImportError(f"{path}: file not found")
    return importer(path)
