"""Parallel writers on the laptop default store (SQLite): the lock file and the busy retry.

Several stage processes creating and writing one fresh SQLite store at once used
to lose runs ("table ... already exists" while creating it, "database is locked"
while writing); every call now holds the store's lock file and retries a busy
database (syncsafe.tracking.store_lock).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from parallel_writers import item_runs, run_writers

from syncsafe.tracking import store_lock

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.mark.slow
def test_six_processes_on_one_fresh_sqlite_store_lose_no_run(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    run_writers(uri, n=6, items=8, workdir=tmp_path / "work", pipeline_run_id="parallel-sqlite")
    runs = item_runs(uri, "parallel-sqlite")
    assert len(runs["pipeline"]) == 1  # the six converged on one parent
    assert sorted(r.data.tags["stage"] for r in runs["stage"]) == [f"parallel-{i}" for i in range(6)]
    items = runs["item"]
    assert len(items) == 6 * 8
    assert {r.info.status for r in runs["stage"] + items} == {"FINISHED"}
    assert sorted(r.data.metrics["value"] for r in items) == sorted(i * 100 + s for i in range(6) for s in range(8))
    assert (tmp_path / "store" / "mlflow.db.lock").exists()


def test_store_lock_is_beside_a_sqlite_file_only(tmp_path: Path) -> None:
    assert store_lock.store_lock_path(f"sqlite:///{tmp_path}/m.db") == tmp_path / "m.db.lock"
    for uri in ("http://127.0.0.1:5000", "postgresql://u@127.0.0.1/mlflow", "sqlite:///:memory:"):
        assert store_lock.store_lock_path(uri) is None


def test_a_busy_database_is_retried_and_other_errors_are_not(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/m.db"
    calls: list[int] = []

    def busy_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            try:
                raise sqlite3.OperationalError("database is locked")
            except sqlite3.OperationalError as err:  # wrapped, as SQLAlchemy and MLflow do
                raise RuntimeError("(sqlalchemy.exc.OperationalError) see cause") from err
        return "done"

    assert store_lock.call_locked(uri, busy_twice) == "done" and len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise ValueError("no such run")

    calls.clear()
    with pytest.raises(ValueError, match="no such run"):
        store_lock.call_locked(uri, broken)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(RuntimeError):  # a database that stays busy fails after the retry window
        store_lock.call_locked(uri, busy_twice, retry_for_s=0.0)
    assert len(calls) == 1


def test_file_lock_excludes_another_process(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    probe = (
        "import sys; from syncsafe.tracking.store_lock import file_lock\n"
        "with file_lock(sys.argv[1], timeout_s=float(sys.argv[2])) as held: print(held)"
    )
    with store_lock.file_lock(lock) as held:
        assert held
        other = subprocess.run([sys.executable, "-c", probe, str(lock), "0.3"], capture_output=True, text=True)
        assert other.stdout.strip() == "False", other.stderr  # waited 0.3 s, then went on unlocked
    other = subprocess.run([sys.executable, "-c", probe, str(lock), "5"], capture_output=True, text=True)
    assert other.stdout.strip() == "True", other.stderr
