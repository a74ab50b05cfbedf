"""Logging a stage: the pipeline parent run, the stage run and its item runs."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import math
import os
import posixpath
import re
import sqlite3
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncsafe.tracking.settings import (
    ARTIFACTS_DIR,
    _MAX_KEY,
    _MAX_METRICS,
    _MAX_PARAMS,
    _MAX_TAG_VALUE,
    _ON,
    RUN_TAGS,
    TAG_DVC_STAGE,
    TAG_KIND,
    TAG_PIPELINE,
    TrackingError,
    TrackingWarning,
    _safe_name,
    artifact_location,
    dvc_lock_md5,
    experiment_name,
    flatten_params,
    git_commit,
    pipeline_run_id,
    redact,
    sqlite_path,
    strict_from_env,
    tracking_enabled,
    tracking_uri,
)
from syncsafe.tracking.store_lock import LockedClient, file_lock

if TYPE_CHECKING:  # pragma: no cover
    from mlflow import MlflowClient

# --------------------------------------------------------------------------- what a stage hands over


@dataclass
class TrackedRun:
    """One item run: a regime x policy x seed x draw result the stage has written to disk.

    ``metrics`` are scalars (logged at step 0); ``series`` are curves, name ->
    ``[(step, value), ...]`` (a loss curve). ``artifacts`` are files or folders
    already on disk, logged under their own names. ``params`` add to (and
    override) the stage's params.yaml section; ``tags`` add extra tags (the
    standard ones always win).
    """

    regime: str = ""
    policy: str = ""
    seed: int | str | None = None
    draw: int | str | None = None
    matched_to: str | None = ""
    backend: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, float | int | None] = field(default_factory=dict)
    series: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)
    artifacts: Sequence[str | os.PathLike[str]] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    status: str = "FINISHED"
    #: Wall-clock start/end (epoch seconds) if the stage measured them; else the time of logging.
    started: float | None = None
    ended: float | None = None

    def run_name(self) -> str:
        if self.name:
            return self.name
        parts = [self.regime, self.policy]
        if self.matched_to:
            parts.append(f"to-{self.matched_to}")
        if self.backend:
            parts.append(self.backend)
        seed, draw = _tag(self.seed), _tag(self.draw)
        if seed:
            parts.append(f"s{seed}")
        if draw:
            parts.append(f"d{int(draw):03d}" if draw.isdigit() else f"d{draw}")
        return "/".join(p for p in parts if p) or "run"


@dataclass(frozen=True)
class StageRecord:
    """What one tracked stage left in the store."""

    uri: str
    experiment_id: str
    pipeline_run_id: str
    parent_run_id: str
    stage_run_id: str
    run_ids: tuple[str, ...]


def _tag(value: Any) -> str:
    """A tag value: None, NaN and pandas' NA are empty; integral floats (a seed read back
    from a DataFrame) print as integers."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return ""
    if type(value).__name__ in ("bool", "bool_"):
        return str(bool(value))
    if isinstance(value, float) or type(value).__module__ == "numpy":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return str(value)[:_MAX_TAG_VALUE]
        if math.isnan(number):
            return ""
        if number.is_integer() and not isinstance(value, bool):
            return str(int(number))
    return str(value)[:_MAX_TAG_VALUE]


# --------------------------------------------------------------------------- the store


class _Store:
    """An MlflowClient bound to one URI and the pipeline's experiment.

    On a SQLite store every client call holds the store's lock file and is
    retried while the database is locked (:mod:`syncsafe.tracking.store_lock`),
    so parallel stage processes on one machine lose no run.
    """

    def __init__(self, uri: str, root: Path, experiment: str) -> None:
        self.uri = uri
        self.root = root
        self.experiment = experiment
        _preflight(uri)
        self.client: MlflowClient = LockedClient(uri)  # type: ignore[assignment] - same methods
        self.experiment_id = self._experiment_id()

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                return self.client.create_experiment(
                    self.experiment,
                    artifact_location=artifact_location(self.uri, self.root, self.experiment),
                    tags={"syncsafe.pipeline": self.experiment},
                )
            except MlflowException:  # another stage process created it first
                exp = self.client.get_experiment_by_name(self.experiment)
                if exp is None:
                    raise
        if exp.lifecycle_stage != "active":
            raise TrackingError(
                f"experiment {self.experiment!r} is deleted in {redact(self.uri)}; restore it "
                f"(mlflow experiments restore --experiment-id {exp.experiment_id}) or set SYNCSAFE_EXPERIMENT"
            )
        return exp.experiment_id

    # ----------------------------------------------------------------- pipeline parent

    def parent_run(self, pipeline_id: str, tags: Mapping[str, str]) -> str:
        """Find or create the pipeline run tagged ``syncsafe.pipeline_run_id=<pipeline_id>``.

        Creation is serialized by a lock file per store on this host; across
        hosts every process converges on the earliest such run (later
        duplicates delete themselves).
        """
        with _host_lock(self.uri, self.experiment):
            found = self._parents(pipeline_id)
            if found:
                return found[0]
            run = self.client.create_run(
                self.experiment_id,
                start_time=_now_ms(),
                tags={**tags, TAG_KIND: "pipeline", TAG_PIPELINE: pipeline_id},
                run_name=f"pipeline {pipeline_id}",
            )
            mine = run.info.run_id
            found = self._parents(pipeline_id)
            chosen = found[0] if found else mine
            if chosen != mine:
                self.client.delete_run(mine)
            return chosen

    def _parents(self, pipeline_id: str) -> list[str]:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_PIPELINE}` = '{pipeline_id}' and tags.`{TAG_KIND}` = 'pipeline'",
            max_results=50,
        )
        runs = sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_id))
        return [r.info.run_id for r in runs]

    # ----------------------------------------------------------------- runs

    def start_run(self, parent: str, name: str, tags: Mapping[str, str], started: float | None = None) -> Any:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        return self.client.create_run(
            self.experiment_id,
            start_time=_now_ms() if started is None else int(started * 1000),
            tags={**tags, MLFLOW_PARENT_RUN_ID: parent},
            run_name=name,
        )

    def log(
        self,
        run_id: str,
        params: Mapping[str, str] | None = None,
        metrics: Mapping[str, Any] | None = None,
        series: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    ) -> None:
        """log_batch in chunks within MLflow's per-request limits."""
        from mlflow.entities import Metric, Param

        ts = _now_ms()
        ps = [Param(k, v) for k, v in {_key(k): v for k, v in (params or {}).items()}.items()]
        ms = [Metric(_key(k), float(v), ts, 0) for k, v in (metrics or {}).items() if v is not None]
        for k, points in (series or {}).items():
            key = _key(k)
            ms.extend(Metric(key, float(v), ts, int(step)) for step, v in points if v is not None)
        while ps or ms:
            chunk_p, ps = ps[:_MAX_PARAMS], ps[_MAX_PARAMS:]
            chunk_m, ms = ms[: _MAX_METRICS - len(chunk_p)], ms[_MAX_METRICS - len(chunk_p) :]
            self.client.log_batch(run_id, metrics=chunk_m, params=chunk_p, synchronous=True)

    def log_artifacts(self, run: Any, paths: Sequence[Path]) -> None:
        if not paths:
            return
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        repo = get_artifact_repository(run.info.artifact_uri, tracking_uri=self.uri)
        for path in paths:
            if path.is_dir():
                repo.log_artifacts(str(path), artifact_path=path.name)
            else:
                repo.log_artifact(str(path))

    def end(self, run_id: str, status: str = "FINISHED", ended: float | None = None) -> None:
        self.client.set_terminated(run_id, status, end_time=None if ended is None else int(ended * 1000))


def _preflight(uri: str) -> None:
    """Fail fast on a SQLite file that cannot be opened (MLflow would retry for ~100 s)."""
    db = sqlite_path(uri)
    if db is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(db), timeout=5)
    try:
        con.execute("PRAGMA schema_version").fetchone()
    finally:
        con.close()


@contextlib.contextmanager
def _host_lock(uri: str, experiment: str, timeout_s: float = 60.0) -> Iterator[None]:
    """An advisory lock file, one per store and experiment; no-op where unavailable.

    For a SQLite store it lies in the artifact folder beside the database
    (``mlartifacts/.<experiment>.lock``), else in the temp dir.
    """
    db = sqlite_path(uri)
    if db is not None:
        path = db.resolve().parent / ARTIFACTS_DIR / f".{_safe_name(experiment)}.lock"
    else:
        digest = hashlib.sha1(f"{uri}\0{experiment}".encode()).hexdigest()[:16]
        path = Path(tempfile.gettempdir()) / f"syncsafe-mlflow-{digest}.lock"
    with file_lock(path, timeout_s):  # a holder stuck on a dead store must not block this stage for ever
        yield


def _now_ms() -> int:
    return int(time.time() * 1000)


def _key(name: str) -> str:
    """A valid MLflow param/metric key: other characters become '_'."""
    key = re.sub(r"[^\w./\- :]", "_", str(name))[:_MAX_KEY] or "_"
    norm = posixpath.normpath(key)
    if norm != key or norm in (".", "..") or norm.startswith(("/", "../")):
        key = key.replace("/", "_")
        key = "_" + key[1:] if key.startswith(".") else key
    return key


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _warn(message: str) -> None:
    """warnings.warn attributed to the first caller outside this module and contextlib."""
    skip = (os.path.normcase(__file__), os.path.normcase(contextlib.__file__))
    frame, level = sys._getframe(1), 2
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in skip:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, TrackingWarning, stacklevel=level)


# --------------------------------------------------------------------------- stage tracking


class StageTracker:
    """Collects a stage's item runs and logs them when the stage's files are written.

    Use through :func:`stage_run` (or :func:`track_stage`). ``record`` holds the
    :class:`StageRecord` after a successful exit, None when tracking is off or failed.
    """

    def __init__(
        self,
        stage: str,
        *,
        root: Path,
        params_section: Mapping[str, Any],
        profile: str,
        regime: str,
        strict: bool,
        system_metrics: bool,
        experiment: str,
    ) -> None:
        self.stage = stage
        self.root = root
        self.params = flatten_params(params_section)
        self.profile = profile
        self.regime = regime
        self.strict = strict
        self.system_metrics = system_metrics
        self.experiment = experiment
        self.runs: list[TrackedRun] = []
        #: Stage-level scalars and files (a report, a plot, an index), logged on the stage run.
        self.metrics: dict[str, float] = {}
        self.artifacts: list[Path] = []
        self.record: StageRecord | None = None
        self.uri = tracking_uri(root)
        self._store: _Store | None = None
        self._stage_run: Any = None
        self._parent = ""
        self._pipeline = ""
        self._monitor: Any = None
        self._common: dict[str, str] = {}

    # ----------------------------------------------------------------- public

    def add(self, run: TrackedRun) -> None:
        self.runs.append(run)

    def extend(self, runs: Iterable[TrackedRun]) -> None:
        self.runs.extend(runs)

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        self.artifacts.append(Path(path))

    @property
    def active(self) -> bool:
        return self._stage_run is not None

    # ----------------------------------------------------------------- lifecycle

    def _open(self) -> None:
        try:
            self._store = store = _Store(self.uri, self.root, self.experiment)
            commit = git_commit(self.root)
            self._pipeline = pipeline_run_id()
            self._common = {
                "profile": self.profile,
                "git_commit": commit,
                "dvc_lock_md5": dvc_lock_md5(self.root),
                TAG_PIPELINE: self._pipeline,
            }
            if commit:
                self._common["mlflow.source.git.commit"] = commit
            with contextlib.suppress(Exception):
                self._common["mlflow.user"] = getpass.getuser()
            self._parent = store.parent_run(self._pipeline, {**dict.fromkeys(RUN_TAGS, ""), **self._common})
            store.client.update_run(self._parent, status="RUNNING")
            dvc_stage = os.environ.get("DVC_STAGE", "")
            name = dvc_stage or (f"{self.stage}@{self.regime}" if self.regime else self.stage)
            tags = {
                **dict.fromkeys(RUN_TAGS, ""),
                **self._common,
                "stage": self.stage,
                "regime": self.regime,
                TAG_KIND: "stage",
                TAG_DVC_STAGE: dvc_stage,
            }
            self._stage_run = store.start_run(self._parent, name, tags)
            store.log(self._stage_run.info.run_id, params=self.params)
            if self.system_metrics:
                self._start_monitor()
        except Exception as err:  # noqa: BLE001 - any store failure, by policy
            self._stage_run = None
            self._fail("could not start tracking", err)

    def _close(self, failed: bool) -> None:
        if self._stage_run is None or self._store is None:
            return
        store, stage_id = self._store, self._stage_run.info.run_id
        self._stop_monitor()
        if failed:
            with contextlib.suppress(Exception):
                store.end(stage_id, "FAILED")
                store.end(self._parent, "FAILED")
            return
        done: list[str] = []
        try:
            artifacts = [self._checked(p) for p in self.artifacts]
            items = [(run, [self._checked(Path(p)) for p in run.artifacts]) for run in self.runs]
            for run, paths in items:
                done.append(self._log_item(store, stage_id, run, [p for p in paths if p is not None]))
            store.log(stage_id, metrics=self.metrics)
            store.log_artifacts(self._stage_run, [p for p in artifacts if p is not None])
            store.end(stage_id, "FINISHED")
            store.end(self._parent, "FINISHED")
        except Exception as err:  # noqa: BLE001
            with contextlib.suppress(Exception):
                store.client.set_tag(stage_id, "syncsafe.tracking_incomplete", "true")
                store.end(stage_id, "FAILED")
            self._fail(f"logged {len(done)} of {len(self.runs)} runs, then failed", err)
            return
        self.record = StageRecord(
            uri=self.uri,
            experiment_id=store.experiment_id,
            pipeline_run_id=self._pipeline,
            parent_run_id=self._parent,
            stage_run_id=stage_id,
            run_ids=tuple(done),
        )

    def _log_item(self, store: _Store, stage_id: str, run: TrackedRun, paths: list[Path]) -> str:
        tags = {
            **{str(k): _tag(v) for k, v in run.tags.items()},
            **self._common,
            "stage": self.stage,
            "regime": run.regime or self.regime,
            "policy": run.policy,
            "seed": _tag(run.seed),
            "draw": _tag(run.draw),
            "matched_to": _tag(run.matched_to),
            "backend": run.backend,
            TAG_KIND: "item",
        }
        created = store.start_run(stage_id, run.run_name(), tags, started=run.started)
        run_id = created.info.run_id
        store.log(run_id, params={**self.params, **flatten_params(run.params)}, metrics=run.metrics, series=run.series)
        store.log_artifacts(created, paths)
        store.end(run_id, run.status, ended=run.ended)
        return run_id

    def _checked(self, path: Path) -> Path | None:
        """The path when it exists; a missing one warns (strict: raises) and is skipped."""
        if path.exists():
            return path
        msg = f"syncsafe tracking: stage {self.stage!r}: artifact {path} does not exist; not logged"
        if self.strict:
            raise TrackingError(msg)
        _warn(msg)
        return None

    def _start_monitor(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            interval = float(os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL") or 2.0)
            self._monitor = SystemMetricsMonitor(
                self._stage_run.info.run_id, sampling_interval=interval, tracking_uri=self.uri
            )
            self._monitor.start()
        except Exception as err:  # noqa: BLE001 - psutil/pynvml problems must not stop a stage
            self._monitor = None
            _warn(f"syncsafe tracking: system metrics off: {_one_line(err)}")

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(Exception):
                self._monitor.finish()
            self._monitor = None

    def _fail(self, what: str, err: BaseException) -> None:
        if isinstance(err, TrackingError) and self.strict:
            raise err
        msg = f"syncsafe tracking: stage {self.stage!r}: {what} at {redact(self.uri)}: {_one_line(err)}"
        if self.strict:
            raise TrackingError(msg) from err
        _warn(
            f"{msg}; the stage's files on disk are complete "
            "(SYNCSAFE_TRACKING_STRICT=1 makes this an error, SYNCSAFE_TRACKING=off skips tracking)"
        )


@contextlib.contextmanager
def stage_run(
    stage: str,
    *,
    root: str | os.PathLike[str] = ".",
    params_section: Mapping[str, Any] | None = None,
    profile: str = "",
    regime: str = "",
    strict: bool | None = None,
    system_metrics: bool | None = None,
    experiment: str | None = None,
) -> Iterator[StageTracker]:
    """Track a stage around its work: the stage run starts on entry (system metrics
    are sampled from then on) and the collected item runs are logged on a normal exit.

    ``system_metrics=None`` follows ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``. If the
    body raises, the stage run is marked FAILED and nothing else is logged.
    In strict mode an unreachable store raises TrackingError already on entry,
    before any work is done.
    """
    if system_metrics is None:
        system_metrics = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() in _ON
    tracker = StageTracker(
        stage,
        root=Path(root),
        params_section=params_section or {},
        profile=profile,
        regime=regime,
        strict=strict_from_env() if strict is None else strict,
        system_metrics=system_metrics,
        experiment=experiment or experiment_name(),
    )
    if not tracking_enabled():
        yield tracker
        return
    tracker._open()
    try:
        yield tracker
    except BaseException:
        tracker._close(failed=True)
        raise
    tracker._close(failed=False)


def track_stage(
    stage: str,
    runs: Iterable[TrackedRun] = (),
    *,
    root: str | os.PathLike[str] = ".",
    params_section: Mapping[str, Any] | None = None,
    profile: str = "",
    regime: str = "",
    metrics: Mapping[str, float] | None = None,
    artifacts: Sequence[str | os.PathLike[str]] = (),
    strict: bool | None = None,
    experiment: str | None = None,
) -> StageRecord | None:
    """Log a finished stage: call it AFTER the stage has written its files.

    One stage run (params = the flattened ``params_section``, plus stage-level
    ``metrics`` and ``artifacts``) under the pipeline run, and one nested item
    run per :class:`TrackedRun`. Returns the :class:`StageRecord`, or None when
    tracking is off or the store failed (a :class:`TrackingWarning` says why).
    """
    with stage_run(
        stage,
        root=root,
        params_section=params_section,
        profile=profile,
        regime=regime,
        strict=strict,
        system_metrics=False,
        experiment=experiment,
    ) as tracker:
        tracker.extend(runs)
        tracker.metrics.update(metrics or {})
        tracker.artifacts.extend(Path(p) for p in artifacts)
    return tracker.record
