"""Atomic file writes shared by every stage.

A stage either leaves a complete file or none: each writer writes to a
temporary file in the destination's directory, flushes it to disk and then
renames it over the destination (`os.replace` is atomic on POSIX).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; rename it onto `dest` on success.

    On any exception the temporary file is removed and `dest` is untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; outputs are shared like any other file
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(dest: str | os.PathLike[str], text: str) -> Path:
    """Atomically write `text` (UTF-8) to `dest`."""
    with atomic_path(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def write_json(dest: str | os.PathLike[str], obj: Any) -> Path:
    """Atomically write `obj` as indented, key-sorted JSON (stable diffs)."""
    return write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_parquet(dest: str | os.PathLike[str], df: pd.DataFrame) -> Path:
    """Atomically write a DataFrame as Parquet (no index)."""
    with atomic_path(dest) as tmp:
        df.to_parquet(tmp, index=False)
    return Path(dest)


def write_csv(dest: str | os.PathLike[str], df: pd.DataFrame) -> Path:
    """Atomically write a DataFrame as CSV (no index)."""
    with atomic_path(dest) as tmp:
        df.to_csv(tmp, index=False)
    return Path(dest)
