"""What every artifact reader shares: its errors and the checked JSON/CSV/Parquet reads.

A reader either returns what the file promises or raises an
:class:`ArtifactError` (a :class:`syncsafe.errors.BadInput`, exit 2) whose
one-line message names the file and what was expected:

- :class:`ArtifactMissing` for a file that is not there (also a
  `FileNotFoundError`, so callers that test for a missing file keep working);
- :class:`ArtifactMalformed` for one that does not parse or lacks a column/key.

Writers go through :mod:`syncsafe.io` (atomic: a complete file or none).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from pydantic import BaseModel, ValidationError

from syncsafe.errors import BadInput

M = TypeVar("M", bound=BaseModel)


class ArtifactError(BadInput):
    """An artifact file that is not what its reader expects (the message names the file)."""


class ArtifactMissing(ArtifactError, FileNotFoundError):
    """An artifact file that does not exist (usually: its stage has not run)."""


class ArtifactMalformed(ArtifactError):
    """An artifact file that exists but does not parse, or lacks a key or column."""


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def require_file(path: Path, what: str, hint: str = "") -> Path:
    """`path` if it is a file, else ArtifactMissing naming it, what it should hold and how to make it."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactMissing(f"{path}: no {what}" + (f"; {hint}" if hint else ""))
    return path


def missing_columns(frame: pd.DataFrame, columns: Iterable[str]) -> list[str]:
    return [c for c in columns if c not in frame.columns]


def check_columns(frame: pd.DataFrame, columns: Iterable[str], path: Path, what: str) -> pd.DataFrame:
    """`frame` if it has every column of `columns`, else ArtifactMalformed naming the file and the columns."""
    missing = missing_columns(frame, columns)
    if missing:
        raise ArtifactMalformed(f"{path}: not a {what}: missing column(s) {', '.join(map(repr, missing))}; "
                                f"found {list(frame.columns)}")
    return frame


def read_json(path: Path, what: str, hint: str = "", keys: Iterable[str] = ()) -> dict[str, Any]:
    """A JSON object with at least `keys`."""
    require_file(path, what, hint)
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactMalformed(f"{path}: not a {what} (expected JSON): {_one_line(err)}") from None
    if not isinstance(value, Mapping):
        raise ArtifactMalformed(f"{path}: not a {what} (expected a JSON object, got {type(value).__name__})")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ArtifactMalformed(f"{path}: not a {what}: missing key(s) {', '.join(map(repr, missing))}")
    return dict(value)


def read_model(path: Path, model: type[M], what: str, hint: str = "",
               error: type[ArtifactError] = ArtifactMalformed,
               missing: type[ArtifactError] = ArtifactMissing) -> M:
    """A JSON file validated as the pydantic `model` (`error`/`missing`: the subclasses to raise)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise missing(f"{path}: no {what}" + (f"; {hint}" if hint else "")) from None
    try:
        return model.model_validate_json(text)
    except ValidationError as err:
        raise error(f"{path}: not a {what}: {_one_line(err)}") from None


def read_csv(path: Path, what: str, columns: Iterable[str] = (), hint: str = "", **kwargs: Any) -> pd.DataFrame:
    """A CSV table with at least `columns` (kwargs go to `pd.read_csv`)."""
    require_file(path, what, hint)
    try:
        frame = pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as err:
        raise ArtifactMalformed(f"{path}: not a {what} (expected CSV): {_one_line(err)}") from None
    return check_columns(frame, columns, path, what)


def read_parquet(path: Path, what: str, columns: Iterable[str] = (), hint: str = "") -> pd.DataFrame:
    """A Parquet table with at least `columns`."""
    require_file(path, what, hint)
    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as err:  # pyarrow raises ArrowInvalid (a ValueError) on a non-Parquet file
        raise ArtifactMalformed(f"{path}: not a {what} (expected Parquet): {_one_line(err)}") from None
    return check_columns(frame, columns, path, what)


def read_json_lines(path: Path, what: str, hint: str = "") -> list[dict[str, Any]]:
    """One JSON object per line."""
    require_file(path, what, hint)
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ArtifactMalformed(f"{path}: line {n}: not a {what} line (expected JSON): {_one_line(err)}") from None
        if not isinstance(row, Mapping):
            raise ArtifactMalformed(f"{path}: line {n}: not a {what} line (expected a JSON object)")
        rows.append(dict(row))
    return rows
