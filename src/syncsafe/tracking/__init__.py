"""MLflow tracking of every stage, seed and artifact, and the policy x seed compare table.

A stage runs inside :func:`tracked_stage`: the stage run starts on entry
(system metrics sampled from then on, if asked), and when the stage's entry
function returns, the stage's collector (:mod:`syncsafe.tracking.collectors`)
reads what it wrote through :mod:`syncsafe.artifacts` and logs one nested item
run per regime x policy x seed: the unit people compare, its draws, references and
replays as tables and summary metrics of that run. Tracking never loses results: when the
store cannot be reached the stage's files are already complete and tracking
only warns (:class:`TrackingWarning`, one line naming the store), unless
strict mode is on, in which case it raises :class:`TrackingError`.

Store
    ``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<root>/mlflow.db``. For a
    SQLite store, file artifacts go beside the database in
    ``<db dir>/mlartifacts/<experiment>/<run id>/artifacts`` (set as the
    experiment's artifact location when the experiment is created); for other
    database URIs under ``<root>/mlartifacts``; an HTTP server keeps its own.
    Browse with ``mlflow ui --backend-store-uri sqlite:///mlflow.db`` from the
    project root.

Hierarchy (one experiment per pipeline, default ``syncsafe``)
    pipeline run  (tag ``syncsafe.run_kind=pipeline``, one per pipeline run id)
      stage run   (``stage``: one per stage process, e.g. ``schedules@bursty``;
                   params of its params.yaml section, stage-level artifacts,
                   system metrics)
        item run  (``item``: one per regime x policy x seed; a controller's matched-random
                   draws and references ride in its run's ``derived`` table and
                   ``<policy>.<metric>[.min/.mean/.max]`` metrics)

    Every run carries the tags ``stage, regime, policy, seed, draw, matched_to,
    backend, profile, git_commit, dvc_lock_md5`` (empty string where not
    applicable) and ``syncsafe.pipeline_run_id``.

Pipeline run id (how the separate processes of one ``dvc repro`` find one parent)
    1. ``SYNCSAFE_PIPELINE_RUN_ID`` when set (a DAG sets its own run id, ``syncsafe run`` its own);
    2. under DVC (``DVC_STAGE`` set): the ``dvc`` process that launched the stage,
       ``dvc-<its start time>-<host>-<its pid>``, the same for every stage of
       one ``dvc repro``/``dvc exp run`` and different for the next one;
    3. otherwise this process: ``cli-<start time>-<host>-<pid>`` (a stage run by
       hand is its own pipeline run).
    The dvc.lock md5 is not used for the id: DVC rewrites dvc.lock after every
    stage, so two stages of one repro see different hashes. It is recorded
    per stage (``dvc_lock_md5``: dvc.lock as the stage found it, before DVC
    records the stage's own outputs).

Compare
    :func:`compare_table` reads the item runs with ``mlflow.search_runs`` and
    builds the policy x seed table of one metric (mean, sd, per-seed
    matched-random envelope). ``dvc repro`` reruns only changed stages, so a
    pipeline run holds only part of the results: per (stage, regime, policy,
    matched_to, backend, seed, draw) the latest run counts, unless one
    pipeline run is asked for.

Environment
    ``SYNCSAFE_TRACKING=off``        no tracking at all (tests of other modules)
    ``SYNCSAFE_TRACKING_STRICT=1``   a store failure raises TrackingError
    ``SYNCSAFE_EXPERIMENT``          experiment name (default ``syncsafe``)
    ``SYNCSAFE_PIPELINE_RUN_ID``     pipeline run id (see above)
    ``MLFLOW_TRACKING_URI``          the store
    ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT``: lower
    them to make an unreachable HTTP store fail fast (MLflow retries for
    minutes by default).

MLflow is imported lazily: with tracking off nothing of it is loaded.
"""

from syncsafe.tracking.compare import build_compare_table, compare_table, render_table, search_item_runs
from syncsafe.tracking.settings import (
    DEFAULT_EXPERIMENT,
    DEFAULT_METRIC,
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
    pipeline_run_id,
    redact,
    section_params,
    sqlite_path,
    strict_from_env,
    tracking_enabled,
    tracking_uri,
)
from syncsafe.tracking.collectors import COLLECTORS
from syncsafe.tracking.records import Collected, StageRecord, TrackedRun
from syncsafe.tracking.stage import StageHandle, tracked_stage

__all__ = [
    "DEFAULT_EXPERIMENT",
    "DEFAULT_METRIC",
    "RUN_TAGS",
    "TAG_DVC_STAGE",
    "TAG_KIND",
    "TAG_PIPELINE",
    "COLLECTORS",
    "Collected",
    "StageHandle",
    "StageRecord",
    "TrackedRun",
    "TrackingError",
    "TrackingWarning",
    "artifact_location",
    "build_compare_table",
    "compare_table",
    "dvc_lock_md5",
    "experiment_name",
    "flatten_params",
    "git_commit",
    "pipeline_run_id",
    "redact",
    "render_table",
    "search_item_runs",
    "section_params",
    "sqlite_path",
    "strict_from_env",
    "tracked_stage",
    "tracking_enabled",
    "tracking_uri",
]
