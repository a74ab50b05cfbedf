"""The generic tracking step around a stage: :func:`tracked_stage`.

::

    with tracked_stage("schedules", root=root, params=p, regime="bursty") as stage:
        build_schedules(p, "bursty", root)      # the stage writes its files
    # stage.record: the StageRecord (None when tracking is off or failed)

On entry the pipeline parent run is found (or created) and the stage run is
started under it as an MLflow nested run (tag ``mlflow.parentRunId``). When
the body returns, the collector registered for the stage
(:data:`syncsafe.tracking.collectors.COLLECTORS`) reads what the stage wrote
and one nested item run per regime x policy x seed (the unit people compare:
a controller's matched-random draws and references are a table and summary
metrics of its run, not runs of their own) is logged under the stage run,
which alone carries the stage's params, with the handle's extras (:meth:`StageHandle.add`,
:meth:`StageHandle.log_metric`, :meth:`StageHandle.log_artifact`). If the body
raises, the stage and pipeline runs end FAILED and the exception propagates.

Every MLflow call on a SQLite store goes through
:class:`~syncsafe.tracking.store_lock.LockedClient` (one writer at a time,
busy retries), and finding or creating the pipeline parent runs under the
same lock, so parallel stage processes of one pipeline meet one parent.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import posixpath
import re
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncsafe.tracking.collectors import collect_stage
from syncsafe.tracking.records import Collected, StageRecord, TrackedRun, tag_value
from syncsafe.tracking.settings import (
    _MAX_KEY,
    _ON,
    RUN_TAGS,
    TAG_DVC_STAGE,
    TAG_KIND,
    TAG_PIPELINE,
    TrackingError,
    TrackingWarning,
    artifact_location,
    dvc_lock_md5,
    experiment_name,
    flatten_params,
    git_commit,
    one_line,
    pipeline_run_id,
    preflight,
    redact,
    section_params,
    strict_from_env,
    tracking_enabled,
    tracking_uri,
)
from syncsafe.tracking.store_lock import LockedClient, call_locked, file_lock, store_lock_path


@dataclass
class StageHandle:
    """What the body of :func:`tracked_stage` may add to the stage's runs (all optional)."""

    stage: str
    runs: list[TrackedRun] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)
    #: Set on a successful exit; None when tracking is off or failed.
    record: StageRecord | None = None
    #: The stage run's id while the stage runs ("" when tracking is off or failed to start).
    run_id: str = ""

    def add(self, run: TrackedRun) -> None:
        """An item run beside the collector's."""
        self.runs.append(run)

    def extend(self, runs: Iterable[TrackedRun]) -> None:
        self.runs.extend(runs)

    def log_metric(self, key: str, value: float) -> None:
        """A stage-level scalar."""
        self.metrics[key] = float(value)

    def log_artifact(self, path: str | os.PathLike[str]) -> None:
        """A stage-level file or folder (logged when the stage ends; it must exist then)."""
        self.artifacts.append(Path(path))


@contextlib.contextmanager
def tracked_stage(
    stage: str,
    *,
    root: str | os.PathLike[str] = ".",
    params: Any = None,
    regime: str | None = None,
    sections: Sequence[str] = (),
    system_metrics: bool | None = False,
    strict: bool | None = None,
    experiment: str | None = None,
    collect: bool = True,
) -> Iterator[StageHandle]:
    """Track one stage around its work; see the module docstring.

    ``params`` is the loaded params (:class:`syncsafe.config.Params`, or a
    mapping), handed to the collector; ``sections`` the params keys logged as
    the stage run's (and its item runs') params, its dvc.yaml ``params:`` list
    (``"{regime}"`` is formatted). ``system_metrics=None`` follows
    ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``. ``collect=False`` logs only what
    the body adds. In strict mode an unreachable store raises
    :class:`TrackingError` on entry, before the body runs.
    """
    handle = StageHandle(stage)
    if not tracking_enabled():
        yield handle
        return
    if system_metrics is None:
        system_metrics = os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() in _ON
    strict = strict_from_env() if strict is None else strict
    session = _Session(stage, Path(root), regime or "", strict, experiment or experiment_name())
    try:
        keys = [k.format(regime=regime) for k in sections or ()]
        values = section_params(params, keys) if params is not None else {}
        profile = str((params.get("profile") if isinstance(params, Mapping) else getattr(params, "profile", "")) or "")
        session.open(flatten_params(values), profile, bool(system_metrics))
        handle.run_id = session.stage_id
    except Exception as err:  # noqa: BLE001 - any store failure, by policy
        session.fail("could not start tracking", err)
        yield handle
        return
    try:
        yield handle
    except BaseException:
        session.end_failed()
        raise
    try:
        collected = collect_stage(stage, Path(root), params, regime) if collect else Collected()
        handle.record = session.finish(handle, collected)
    except Exception as err:  # noqa: BLE001
        session.end_incomplete()
        session.fail(f"logged {len(session.done)} item runs, then failed", err)


class _Session:
    """The MLflow runs of one stage process: the pipeline parent, the stage run and its item runs."""

    def __init__(self, stage: str, root: Path, regime: str, strict: bool, experiment: str) -> None:
        self.stage, self.root, self.regime, self.strict, self.experiment = stage, root, regime, strict, experiment
        self.uri = tracking_uri(root)
        self.client: Any = None
        self.params: dict[str, str] = {}
        self.common: dict[str, str] = {}
        self.parent = self.stage_id = self.pipeline = self.experiment_id = ""
        self.monitor: Any = None
        self.done: list[str] = []
        self._artifact_uris: dict[str, str] = {}

    # ----------------------------------------------------------------- start

    def open(self, params: dict[str, str], profile: str, system_metrics: bool) -> None:
        preflight(self.uri)  # an unopenable SQLite file fails now, not after MLflow's retries
        self.client = LockedClient(self.uri)
        self.experiment_id = self._experiment_id()
        self.params = params
        self.pipeline = pipeline_run_id()
        commit = git_commit(self.root)
        self.common = {"profile": profile, "git_commit": commit, "dvc_lock_md5": dvc_lock_md5(self.root),
                       TAG_PIPELINE: self.pipeline}  # fmt: skip
        if commit:
            self.common["mlflow.source.git.commit"] = commit
        with contextlib.suppress(Exception):
            self.common["mlflow.user"] = getpass.getuser()
        self.parent = self._pipeline_parent()
        self.client.update_run(self.parent, status="RUNNING")
        dvc_stage = os.environ.get("DVC_STAGE", "")
        tags = {**self.common, "stage": self.stage, "regime": self.regime, TAG_KIND: "stage", TAG_DVC_STAGE: dvc_stage}
        name = dvc_stage or (f"{self.stage}@{self.regime}" if self.regime else self.stage)
        self.stage_id = self._start(self.parent, name, tags)
        self._log(self.stage_id, params=self.params)
        if system_metrics:
            self._start_monitor()

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

    def _pipeline_parent(self) -> str:
        """The run tagged ``syncsafe.pipeline_run_id=<id>, syncsafe.run_kind=pipeline``, created if none.

        Find-or-create is one step under the store's lock (a SQLite file) or a
        lock file per store on this host (any other store).
        """
        raw = self.client.client
        where = f"tags.`{TAG_PIPELINE}` = '{self.pipeline}' and tags.`{TAG_KIND}` = 'pipeline'"

        def find_or_create() -> str:
            found = raw.search_runs([self.experiment_id], filter_string=where, max_results=1,
                                    order_by=["attributes.start_time ASC"])  # fmt: skip
            if found:
                return found[0].info.run_id
            tags = {**dict.fromkeys(RUN_TAGS, ""), **self.common, TAG_KIND: "pipeline"}
            return raw.create_run(self.experiment_id, tags=tags, run_name=f"pipeline {self.pipeline}").info.run_id

        if store_lock_path(self.uri) is not None:
            return call_locked(self.uri, find_or_create)
        digest = hashlib.sha1(f"{self.uri}\0{self.experiment}".encode()).hexdigest()[:16]
        with file_lock(Path(tempfile.gettempdir()) / f"syncsafe-mlflow-{digest}.lock", timeout_s=60):
            return find_or_create()

    # ----------------------------------------------------------------- end

    def finish(self, handle: StageHandle, collected: Collected) -> StageRecord:
        """Log the item runs, the stage's extras, and end the stage and parent runs FINISHED."""
        runs = [*collected.runs, *handle.runs]
        stage_files = self._existing([*map(Path, collected.artifacts), *handle.artifacts])
        items = [(run, self._existing(map(Path, run.artifacts))) for run in runs]
        for run, files in items:
            self.done.append(self._log_item(run, files))
        self._log(self.stage_id, metrics={**collected.metrics, **handle.metrics})
        self._log_artifacts(self.stage_id, stage_files)
        self._stop_monitor()
        self.client.set_terminated(self.stage_id, "FINISHED")
        self.client.set_terminated(self.parent, "FINISHED")
        return StageRecord(self.uri, self.experiment_id, self.pipeline, self.parent, self.stage_id, tuple(self.done))

    def end_failed(self) -> None:
        """Both runs FAILED, each on its own: a store error on the stage run leaves the parent no less failed."""
        self._stop_monitor()
        for run_id in (self.stage_id, self.parent):
            with contextlib.suppress(Exception):
                self.client.set_terminated(run_id, "FAILED")

    def end_incomplete(self) -> None:
        self._stop_monitor()
        with contextlib.suppress(Exception):
            self.client.set_tag(self.stage_id, "syncsafe.tracking_incomplete", "true")
        with contextlib.suppress(Exception):
            self.client.set_terminated(self.stage_id, "FAILED")

    def fail(self, what: str, err: BaseException) -> None:
        """A store failure: a TrackingError in strict mode, else one TrackingWarning."""
        if isinstance(err, TrackingError) and self.strict:
            raise err
        msg = f"syncsafe tracking: stage {self.stage!r}: {what} at {redact(self.uri)}: {one_line(err)}"
        if self.strict:
            raise TrackingError(msg) from err
        warnings.warn(
            f"{msg}; the stage's files on disk are complete "
            "(SYNCSAFE_TRACKING_STRICT=1 makes this an error, SYNCSAFE_TRACKING=off skips tracking)",
            TrackingWarning,
            stacklevel=4,
        )

    # ----------------------------------------------------------------- runs

    def _start(self, parent: str, name: str, tags: Mapping[str, str]) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        tags = {**dict.fromkeys(RUN_TAGS, ""), **tags, MLFLOW_PARENT_RUN_ID: parent}
        info = self.client.create_run(self.experiment_id, tags=tags, run_name=name).info
        self._artifact_uris[info.run_id] = info.artifact_uri
        return info.run_id

    def _log_item(self, run: TrackedRun, files: list[Path]) -> str:
        tags = {
            **{str(k): tag_value(v) for k, v in run.tags.items()},
            **self.common,
            "stage": self.stage,
            "regime": run.regime or self.regime,
            "policy": run.policy,
            "seed": tag_value(run.seed),
            "draw": tag_value(run.draw),
            "matched_to": tag_value(run.matched_to),
            "backend": run.backend,
            TAG_KIND: "item",
        }
        run_id = self._start(self.stage_id, run.run_name(), tags)
        self._log(run_id, params=flatten_params(run.params), metrics=run.metrics, series=run.series)
        if run.tables:
            with tempfile.TemporaryDirectory(prefix="syncsafe-tables-") as tmp:
                written = []
                for name, table in run.tables.items():
                    written.append(Path(tmp) / f"{name}.parquet")
                    table.to_parquet(written[-1], index=False)
                self._log_artifacts(run_id, [*files, *written])
        else:
            self._log_artifacts(run_id, files)
        self.client.set_terminated(run_id, run.status)
        return run_id

    def _log(
        self,
        run_id: str,
        params: Mapping[str, str] | None = None,
        metrics: Mapping[str, Any] | None = None,
        series: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    ) -> None:
        """One ``log_batch`` (MLflow splits it within its per-request limits)."""
        from mlflow.entities import Metric, Param

        ts = int(time.time() * 1000)
        ps = [Param(k, v) for k, v in {_key(k): v for k, v in (params or {}).items()}.items()]
        ms = [Metric(_key(k), float(v), ts, 0) for k, v in (metrics or {}).items() if v is not None]
        for k, points in (series or {}).items():
            ms.extend(Metric(_key(k), float(v), ts, int(step)) for step, v in points if v is not None)
        if ps or ms:
            self.client.log_batch(run_id, metrics=ms, params=ps, synchronous=True)

    def _log_artifacts(self, run_id: str, paths: Sequence[Path]) -> None:
        """Through the run's artifact repository, from the artifact URI its creation returned
        (`MlflowClient.log_artifact` reads the run back from the store first: a query per file)."""
        if not paths:
            return
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        uri = self._artifact_uris.get(run_id) or self.client.get_run(run_id).info.artifact_uri
        repo = get_artifact_repository(uri, tracking_uri=self.uri)  # mlflow-artifacts:// resolves via the server
        for path in paths:
            if path.is_dir():
                repo.log_artifacts(str(path), artifact_path=path.name)
            else:
                repo.log_artifact(str(path))

    def _existing(self, paths: Iterable[Path]) -> list[Path]:
        """The paths that exist; a missing one warns (strict: raises) and is skipped."""
        out = []
        for path in paths:
            if path.exists():
                out.append(path)
                continue
            msg = f"syncsafe tracking: stage {self.stage!r}: artifact {path} does not exist; not logged"
            if self.strict:
                raise TrackingError(msg)
            warnings.warn(msg, TrackingWarning, stacklevel=5)
        return out

    def _start_monitor(self) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self.monitor = SystemMetricsMonitor(self.stage_id, sampling_interval=2.0, tracking_uri=self.uri)
            self.monitor.start()
        except Exception as err:  # noqa: BLE001 - psutil/pynvml problems must not stop a stage
            self.monitor = None
            warnings.warn(f"syncsafe tracking: system metrics off: {one_line(err)}", TrackingWarning, stacklevel=4)

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(Exception):
                self.monitor.finish()
            self.monitor = None


def _key(name: str) -> str:
    """A valid MLflow param/metric key: other characters become '_'."""
    key = re.sub(r"[^\w./\- :]", "_", str(name))[:_MAX_KEY] or "_"
    norm = posixpath.normpath(key)
    if norm != key or norm in (".", "..") or norm.startswith(("/", "../")):
        key = key.replace("/", "_")
        key = "_" + key[1:] if key.startswith(".") else key
    return key
