"""Atomic file writes shared by every stage.

A stage either leaves a complete file or none: each writer writes to a
temporary file in the destination's directory, flushes it to disk and then
renames it over the destination (`os.replace` is atomic on POSIX).
Directories (model exports, tokenizer caches) are built in a temporary
sibling and renamed over the target the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
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
def atomic_path(dest: str | os.PathLike[str], mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; rename it onto `dest` on success.

    On any exception the temporary file is removed and `dest` is untouched.
    `mode`: the file's permissions from its creation on (0o600 for secrets: never readable by others,
    not even for a moment); default: shared like any other output.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_UMASK if mode is None else mode)  # mkstemp creates 0600
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


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _load_renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # no glibc renameat2: the two-step swap below
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


_RENAMEAT2 = _load_renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux `renameat2(RENAME_EXCHANGE)`); False where unsupported."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_directory(target: str | os.PathLike[str], build: Callable[[Path], None]) -> Path:
    """Build a directory with `build(tmp_dir)`, then swap it in for `target`.

    The new content is complete before it becomes visible. An existing target
    is exchanged with it in one atomic step (`exchange`), so a kill at any
    point leaves the old or the new directory at `target`, never none and
    never a mixture; the old content, left in the temporary sibling, is
    removed after (or by `reap_leftovers` at the next stage start). Where the
    file system cannot exchange, the target is renamed aside first: a crash
    between the two renames leaves it under a `.old` sibling, which
    `reap_leftovers` puts back.
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
    if target.exists() and exchange(tmp_dir, target):
        fsync_directory(target.parent)
        shutil.rmtree(tmp_dir, ignore_errors=True)  # the old content
        return target
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


def reap_leftovers(output: str | os.PathLike[str]) -> list[Path]:
    """Clean up after writers that were killed: beside `output` and inside it, remove temporary files and
    folders (`.<name>.<random>.tmp`) and the `.old` folders of an interrupted swap, first putting an old
    directory back where its target is missing. Returns what was removed."""
    output = Path(output)
    found: list[Path] = []
    if output.parent.is_dir():
        found += [p for p in output.parent.iterdir() if p.name.startswith(f".{output.name}.")]
    if output.is_dir():
        found += [p for p in output.rglob(".*") if p.name.endswith((".tmp", ".old"))]
    removed = []
    for path in sorted(found, key=lambda p: len(p.parts), reverse=True):
        if not path.exists() or not path.name.endswith((".tmp", ".old")):
            continue
        if path.name.endswith(".old") and path.is_dir():
            for kept in path.iterdir():
                if not (path.parent / kept.name).exists():
                    os.replace(kept, path.parent / kept.name)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def write_text(dest: str | os.PathLike[str], text: str, mode: int | None = None) -> Path:
    """Atomically write `text` (UTF-8) to `dest` (`mode`: see `atomic_path`)."""
    with atomic_path(dest, mode) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(dest)


def write_json(dest: str | os.PathLike[str], obj: Any, mode: int | None = None) -> Path:
    """Atomically write `obj` as indented, key-sorted JSON (stable diffs; `mode`: see `atomic_path`)."""
    return write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n", mode)


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
