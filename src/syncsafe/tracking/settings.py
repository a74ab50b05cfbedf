"""Tracking settings and provenance: the store, the pipeline run id, git/dvc.lock, params."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from syncsafe import localhttp
from syncsafe.procs import redact

DEFAULT_EXPERIMENT = "syncsafe"
DEFAULT_METRIC = "slo_violation_rate"
DB_NAME = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"

#: Tags every stage and item run carries (empty string where not applicable).
RUN_TAGS = (
    "stage",
    "regime",
    "policy",
    "seed",
    "draw",
    "matched_to",
    "backend",
    "profile",
    "git_commit",
    "dvc_lock_md5",
)
TAG_KIND = "syncsafe.run_kind"
TAG_PIPELINE = "syncsafe.pipeline_run_id"
TAG_DVC_STAGE = "syncsafe.dvc_stage"

# MLflow's per-request limits for log_batch.
_MAX_PARAMS = 100
_MAX_METRICS = 1000
_MAX_PARAM_VALUE = 6000
_MAX_TAG_VALUE = 8000
_MAX_KEY = 250

_OFF = {"0", "off", "false", "no", "disabled", "none"}
_ON = {"1", "on", "true", "yes", "strict"}


class TrackingError(RuntimeError):
    """The tracking store failed and tracking is strict."""


class TrackingWarning(UserWarning):
    """The tracking store failed; the stage's files on disk are complete."""


# --------------------------------------------------------------------------- settings


def tracking_enabled() -> bool:
    """False when ``SYNCSAFE_TRACKING`` is off/0/false/no."""
    return os.environ.get("SYNCSAFE_TRACKING", "").strip().lower() not in _OFF


def strict_from_env() -> bool:
    return os.environ.get("SYNCSAFE_TRACKING_STRICT", "").strip().lower() in _ON


def experiment_name() -> str:
    return os.environ.get("SYNCSAFE_EXPERIMENT", "").strip() or DEFAULT_EXPERIMENT


def tracking_uri(root: str | os.PathLike[str] = ".") -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the SQLite file ``<root>/mlflow.db`` (absolute). A tracking server's
    host is reached directly, never through a configured proxy (`localhttp.bypass_proxy`): every MLflow client
    of the project takes its URI from here."""
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env:
        localhttp.bypass_proxy(env)
        return env
    return "sqlite:///" + str(Path(root).resolve() / DB_NAME)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (relative to the working directory), else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


def artifact_location(uri: str, root: str | os.PathLike[str] = ".", experiment: str | None = None) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite file, under root for other
    databases, and None (the server's or store's own default) for HTTP, Databricks and file stores."""
    experiment = experiment or experiment_name()
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
    db = sqlite_path(uri)
    if db is not None:
        base = db.resolve().parent / ARTIFACTS_DIR
    elif scheme in ("sqlite", "postgresql", "mysql", "mssql"):
        base = Path(root).resolve() / ARTIFACTS_DIR
    else:
        return None
    return (base / _safe_name(experiment)).as_uri()


def preflight(uri: str) -> None:
    """Fail fast on a SQLite file that cannot be opened (MLflow would retry for ~100 s); a tracking server given
    by URL is reached directly, never through a configured proxy."""
    localhttp.bypass_proxy(uri)
    db = sqlite_path(uri)
    if db is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(db), timeout=5)
    try:
        con.execute("PRAGMA schema_version").fetchone()
    finally:
        con.close()


def one_line(err: BaseException) -> str:
    """An error as one line of at most ~300 characters, its type first."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"


# --------------------------------------------------------------------------- provenance


def git_commit(root: str | os.PathLike[str] = ".") -> str:
    """``git rev-parse HEAD`` in root; empty when root is not in a git repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def dvc_lock_md5(root: str | os.PathLike[str] = ".") -> str:
    """md5 of ``<root>/dvc.lock``; empty when there is none."""
    try:
        return hashlib.md5(Path(root, "dvc.lock").read_bytes()).hexdigest()
    except OSError:
        return ""


#: Environment variable a pipeline runner (`syncsafe run`, a DAG) sets for its stage processes.
PIPELINE_RUN_ID_ENV = "SYNCSAFE_PIPELINE_RUN_ID"


def pipeline_run_id() -> str:
    """The id shared by every stage process of one pipeline run: the runner's (SYNCSAFE_PIPELINE_RUN_ID),
    else the DVC experiment's name (`dvc exp run`), else the launching `dvc repro`'s process, else this one's."""
    env = os.environ.get(PIPELINE_RUN_ID_ENV, "").strip()
    if env:
        return _safe_id(env)
    experiment = os.environ.get("DVC_EXP_NAME", "").strip()
    if experiment:  # a `dvc exp run` (a study point): its stages share the experiment's name
        return f"dvc-exp-{_safe_name(experiment)}"
    host = _safe_name(socket.gethostname().split(".")[0])
    if os.environ.get("DVC_STAGE"):
        found = _dvc_launcher()
        if found is not None:
            pid, started = found
            return f"dvc-{_stamp(started)}-{host}-{pid}"
    return f"cli-{_stamp(_process_start(os.getpid()))}-{host}-{os.getpid()}"


def _safe_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@+-]+", "_", text)[:_MAX_KEY]


def _stamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%Y%m%dT%H%M%S")


def _process_start(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - psutil missing or the process is gone
        return time.time()


def _dvc_launcher() -> tuple[int, float] | None:
    """(pid, start time) of the process that launched this DVC stage.

    DVC runs a stage as ``$SHELL -c CMD`` with ``DVC_STAGE`` in its
    environment; the nearest ancestor without ``DVC_STAGE`` is the dvc process.
    Falls back to the nearest ancestor whose command line names dvc.
    """
    try:
        import psutil

        ancestors = psutil.Process().parents()
    except Exception:  # noqa: BLE001
        return None
    for proc in ancestors:
        try:
            if "DVC_STAGE" not in proc.environ():
                return proc.pid, proc.create_time()
        except Exception:  # noqa: BLE001 - AccessDenied, ZombieProcess, NoSuchProcess
            break
    for proc in ancestors:
        try:
            cmd = proc.cmdline()
            if any(Path(a).name in ("dvc", "dvc.exe") for a in cmd) or "dvc" in cmd[1:3]:
                return proc.pid, proc.create_time()
        except Exception:  # noqa: BLE001
            continue
    return None


# --------------------------------------------------------------------------- params


def flatten_params(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"control.fixed_h.h": "40", "seeds": "[0, 1]"}`` (MLflow param strings)."""
    out: dict[str, str] = {}
    for key, value in mapping.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, name))
        else:
            out[name] = _param_value(value)
    return out


def _param_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, (bool, int, float)):
        text = json.dumps(value)
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _MAX_PARAM_VALUE else text[: _MAX_PARAM_VALUE - 3] + "..."


def section_params(params: Any, keys: Iterable[str]) -> dict[str, Any]:
    """The params.yaml sections a stage depends on (its dvc.yaml ``params:`` list).

    ``section_params(p, ["seeds", "merge", "control", f"regimes.{regime}"])`` on a
    :class:`syncsafe.config.Params` (or a plain mapping) returns
    ``{"seeds": [...], "merge": {...}, "control": {...}, "regimes": {regime: {...}}}``,
    which :func:`flatten_params` turns into dotted params.yaml keys.
    """
    raw = params.model_dump(mode="json") if hasattr(params, "model_dump") else dict(params)
    out: dict[str, Any] = {}
    for key in keys:
        parts = key.split(".")
        node: Any = raw
        for part in parts:
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"params has no key {key!r}")
            node = node[part]
        target = out
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = node
    return out
