"""Fixtures of the integration tests: an empty, migrated MLflow SQLite store to copy; the session's one
`dvc repro` with the real vLLM server (`real_repro`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from real_repro import ReproRun, repro_once
from tracking_store import TRACKING_ENV


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated, empty MLflow database per session; tests copy it (migrations take seconds)."""
    import mlflow

    path = tmp_path_factory.mktemp("template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def fresh_store(tmp_path: Path, empty_db: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tracking on with no environment of the caller's, and an empty store at <tmp_path>/mlflow.db
    (the default store of project root tmp_path)."""
    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    shutil.copy(empty_db, tmp_path / "mlflow.db")
    return tmp_path


@pytest.fixture(scope="session")
def real_repro(tmp_path_factory: pytest.TempPathFactory) -> ReproRun:
    """A fresh copy of this checkout through `dvc repro`, the real vLLM replays included (`real_repro.repro_once`):
    run once per session, read by the fresh-copy pipeline test and the real-server tests."""
    from vllm_env import require_vllm_python

    require_vllm_python()
    return repro_once(tmp_path_factory.mktemp("repro") / "clone")
