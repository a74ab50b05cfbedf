"""Importers that turn public LLM request traces into the request table.

Each reads its columns by exact name and fails with `TraceImportError`
naming the file and the missing columns. The result has the same columns as
generated requests (`arrival_s, prompt_tokens, output_tokens`), with arrivals
shifted to start at 0 s and sorted.

- Azure LLM inference traces: CSV `TIMESTAMP,ContextTokens,GeneratedTokens`.
- BurstGPT: CSV with `Timestamp` (s), `Request tokens`, `Response tokens`;
  failed requests (0 response tokens) are dropped.
- Mooncake: JSON lines with `timestamp` (ms), `input_length`, `output_length`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from syncsafe.traces.requests import REQUEST_COLUMNS


class TraceImportError(ValueError):
    """A public trace file does not have the expected format."""


def _require(df: pd.DataFrame, path: Path, columns: tuple[str, ...], fmt: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceImportError(
            f"{path}: not a {fmt} trace: missing column(s) {missing}; expected exactly {list(columns)}, "
            f"found {list(df.columns)}"
        )


def _to_requests(path: Path, arrival_s: pd.Series, prompt: pd.Series, output: pd.Series) -> pd.DataFrame:
    df = pd.DataFrame({"arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output})
    for col in REQUEST_COLUMNS:
        values = pd.to_numeric(df[col], errors="coerce")
        bad = values.isna()
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise TraceImportError(f"{path}: row {row}: {col} is not a number ({df[col].iloc[row]!r})")
        df[col] = values
    if (df["prompt_tokens"] < 0).any() or (df["output_tokens"] < 0).any():
        raise TraceImportError(f"{path}: token counts must be >= 0")
    df = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    df["arrival_s"] = (df["arrival_s"] - df["arrival_s"].iloc[0]).astype(float)
    return df.astype({"prompt_tokens": "int64", "output_tokens": "int64"})


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise TraceImportError(f"{path}: cannot read as CSV: {err}") from None


def import_azure(path: str | Path) -> pd.DataFrame:
    """Azure LLM inference trace (2023/2024 releases)."""
    path = Path(path)
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    df = _read_csv(path)
    _require(df, path, cols, "Azure LLM inference")
    stamps = pd.to_datetime(df["TIMESTAMP"], errors="coerce", format="mixed")
    if stamps.isna().any():
        row = int(stamps.isna().to_numpy().nonzero()[0][0])
        raise TraceImportError(f"{path}: row {row}: TIMESTAMP is not a date-time ({df['TIMESTAMP'].iloc[row]!r})")
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return _to_requests(path, seconds, df["ContextTokens"], df["GeneratedTokens"])


def import_burstgpt(path: str | Path) -> pd.DataFrame:
    """BurstGPT trace; rows with 0 response tokens (failed requests) are dropped."""
    path = Path(path)
    cols = ("Timestamp", "Request tokens", "Response tokens")
    df = _read_csv(path)
    _require(df, path, cols, "BurstGPT")
    df = df[pd.to_numeric(df["Response tokens"], errors="coerce") != 0]
    if df.empty:
        raise TraceImportError(f"{path}: no successful requests (every row has 0 Response tokens)")
    return _to_requests(path, df["Timestamp"], df["Request tokens"], df["Response tokens"])


def import_mooncake(path: str | Path) -> pd.DataFrame:
    """Mooncake JSONL trace; `timestamp` is in milliseconds."""
    path = Path(path)
    cols = ("timestamp", "input_length", "output_length")
    try:
        df = pd.read_json(path, lines=True)
    except ValueError as err:
        raise TraceImportError(f"{path}: cannot read as JSON lines: {err}") from None
    _require(df, path, cols, "Mooncake")
    return _to_requests(path, pd.to_numeric(df["timestamp"], errors="coerce") / 1000.0, df["input_length"], df["output_length"])


IMPORTERS: dict[str, Callable[[str | Path], pd.DataFrame]] = {
    "azure": import_azure,
    "burstgpt": import_burstgpt,
    "mooncake": import_mooncake,
}


def import_trace(fmt: str, path: str | Path) -> pd.DataFrame:
    """Import `path` with the importer named `fmt` (azure, burstgpt, mooncake)."""
    try:
        importer = IMPORTERS[fmt]
    except KeyError:
        raise TraceImportError(f"unknown trace format {fmt!r}; expected one of {sorted(IMPORTERS)}") from None
    if not Path(path).is_file():
        raise TraceImportError(f"{path}: file not found")
    return importer(path)
