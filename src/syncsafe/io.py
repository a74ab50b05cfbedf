"""Atomic file writes shared by every stage.

A stage either leaves a complete file or none: each writer writes to a
temporary file in the destination's directory, flushes it to disk and then
renames it over the destination (`os.replace` is atomic on POSIX).
Directories (model exports, tokenizer caches) are built in a temporary
sibling and renamed over the target the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
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
    fsync_directory(dest.parent)


def fsync_directory(directory: Path) -> None:
    """Persist a rename or create in `directory` (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - filesystems that refuse directory fsync
        pass
    finally:
        os.close(fd)


def replace_directory(target: str | os.PathLike[str], build: Callable[[Path], None]) -> Path:
    """Build a directory with `build(tmp_dir)`, then swap it in for `target`.

    The new content is complete before it becomes visible. An existing target
    is renamed aside first and removed after the swap, so a crash leaves the
    old or the new directory (at worst the old one under a `.old` sibling),
    never a mixture.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        build(tmp_dir)
        for path in sorted(p for p in tmp_dir.rglob("*") if p.is_file()):
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp_dir, 0o777 & ~_UMASK)  # mkdtemp creates 0700
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    aside = None
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, aside / target.name)
    try:
        os.replace(tmp_dir, target)
    except BaseException:
        if aside is not None:
            os.replace(aside / target.name, target)
            shutil.rmtree(aside, ignore_errors=True)
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    fsync_directory(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return target


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
