"""One writer at a time on a SQLite MLflow store, and a retry when it is busy anyway.

SQLite admits one writer at a time: MLflow's SQL store gives up with
``database is locked`` once its busy timeout passes, and processes that open a
fresh store at the same moment race to create its tables (``table ... already
exists``). Parallel stage processes on one machine (Airflow tasks, ``dvc exp
run --jobs``) therefore make every call on a SQLite store under an advisory
lock file beside the database (``<db>.lock``, :func:`file_lock`), and a call
that still meets a locked database (a writer outside syncsafe such as
``mlflow ui``, or a lock wait that timed out) is retried with backoff
(:func:`call_locked`). :class:`LockedClient` is an ``MlflowClient`` whose every
method goes through both. Other stores (an MLflow server, Postgres) serve
concurrent writers themselves: their calls pass straight through.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from syncsafe.tracking.settings import sqlite_path

T = TypeVar("T")

LOCK_SUFFIX = ".lock"
#: How long a call waits for the lock before it goes on unlocked (the retry still guards it).
LOCK_TIMEOUT_S = 120.0
#: How long a call keeps retrying a locked database.
RETRY_FOR_S = 120.0
_LOCKED = ("database is locked", "database table is locked", "database schema is locked")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[bool]:
    """An exclusive advisory lock (``flock``) on ``path`` for the block.

    Yields True when held. A holder that hangs must not stop every other
    process for ever: after ``timeout_s`` of waiting the block runs without the
    lock (yields False); so does it where the file cannot be opened or
    ``flock`` does not exist. A holder that dies releases the lock at once.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield False
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + timeout_s
        held = False
        while not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02 + random.random() * 0.03)
        yield held
    finally:
        os.close(fd)  # releases the lock


def store_lock_path(uri: str) -> Path | None:
    """The lock file of a SQLite store (``<db>.lock``); None for any other store."""
    db = sqlite_path(uri)
    return None if db is None else db.resolve().with_name(db.name + LOCK_SUFFIX)


def is_locked_error(err: BaseException) -> bool:
    """True for SQLite's busy errors, however MLflow or SQLAlchemy wrapped them."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if any(text in str(err).lower() for text in _LOCKED):
            return True
        err = err.__cause__ or err.__context__
    return False


def call_locked(uri: str, fn: Callable[..., T], *args: Any, retry_for_s: float = RETRY_FOR_S, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` under the store's lock, retried while the database is locked.

    For a store other than a SQLite file, just the call.
    """
    lock = store_lock_path(uri)
    if lock is None:
        return fn(*args, **kwargs)
    deadline = time.monotonic() + retry_for_s
    delay = 0.05
    while True:
        try:
            with file_lock(lock):
                return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - only busy errors are retried
            if not is_locked_error(err) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 2.0)


class LockedClient:
    """An ``MlflowClient`` for ``uri`` whose method calls go through :func:`call_locked`.

    Creating the client opens the store (MLflow creates and migrates a new
    SQLite database there), so that happens under the lock as well.
    """

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        self.uri = uri
        self.client = call_locked(uri, MlflowClient, tracking_uri=uri)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            return call_locked(self.uri, attr, *args, **kwargs)

        locked.__name__ = name
        return locked
