"""A study in MLflow: one experiment `study-<name>`, one run per point, compared side by side.

The stage runs of a point's DVC experiment sit under one pipeline run (its id `dvc-exp-<experiment name>`,
tracking.settings.pipeline_run_id). `log_study_points` makes that run the point's run: it tags it with the
study, the point and its overrides, logs the overrides as params and, per (regime, policy), the mean and
interval over seeds of what the study compares, plus the per-seed rows as a table. A point whose stages were
not tracked gets a run of its own. `study_compare_table` reads them back: policy x point, mean [interval].
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from syncsafe.procs import redact
from syncsafe.tracking.settings import RUN_TAGS, TAG_KIND, TAG_PIPELINE, artifact_location, one_line, preflight
from syncsafe.tracking.store_lock import LockedClient

TAG_STUDY = "syncsafe.study"
TAG_POINT = "syncsafe.point"
TAG_ORDER = "syncsafe.point_order"
TAG_OVERRIDES = "syncsafe.overrides"
#: What each point run carries per (regime, policy): `<regime>.<policy>.<metric>_{mean,ci_low,ci_high}`.
STUDY_METRICS = ("gap_closed", "slo_pct")
SEEDS_TABLE = "study_seeds.json"


@dataclass(frozen=True)
class PointRecord:
    """What `log_study_points` logs for one point."""

    point: str
    order: int
    pipeline_run_id: str
    overrides: Mapping[str, Any]
    #: One row per (regime, policy) with `<metric>_mean`, `_ci_low`, `_ci_high` for STUDY_METRICS.
    summary: pd.DataFrame
    seeds: pd.DataFrame


def _experiment_id(client: LockedClient, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=artifact_location(uri, ".", name),
                                    tags={TAG_STUDY: name.removeprefix("study-")})


def log_study_points(uri: str, experiment: str, study: str, records: Sequence[PointRecord]) -> list[str]:
    """Tag (or create) each point's run in `experiment` and log its summary; returns the run ids."""
    from mlflow.entities import Metric, Param

    preflight(uri)
    client = LockedClient(uri)
    exp_id = _experiment_id(client, experiment, uri)
    ids = []
    for record in records:
        where = f"tags.`{TAG_PIPELINE}` = '{record.pipeline_run_id}' and tags.`{TAG_KIND}` = 'pipeline'"
        found = client.search_runs([exp_id], filter_string=where, max_results=1)
        if found:
            run_id = found[0].info.run_id
        else:
            tags = {**dict.fromkeys(RUN_TAGS, ""), TAG_PIPELINE: record.pipeline_run_id, TAG_KIND: "pipeline"}
            run_id = client.create_run(exp_id, tags=tags, run_name=record.point).info.run_id
            client.set_terminated(run_id, "FINISHED")
        for key, value in {TAG_STUDY: study, TAG_POINT: record.point, TAG_ORDER: str(record.order),
                           TAG_OVERRIDES: json.dumps(dict(record.overrides), sort_keys=True),
                           "mlflow.runName": record.point}.items():
            client.set_tag(run_id, key, value)
        ts = int(time.time() * 1000)
        metrics = [Metric(f"{row.regime}.{row.policy}.{m}_{s}", float(getattr(row, f"{m}_{s}")), ts, 0)
                   for row in record.summary.itertuples() for m in STUDY_METRICS for s in ("mean", "ci_low", "ci_high")
                   if pd.notna(getattr(row, f"{m}_{s}"))]
        existing = set(client.get_run(run_id).data.params)
        params = [Param(f"override.{k}"[:250], json.dumps(v)[:6000]) for k, v in record.overrides.items()
                  if f"override.{k}"[:250] not in existing]
        client.log_batch(run_id, metrics=metrics, params=params, synchronous=True)
        client.log_table(run_id, record.seeds, SEEDS_TABLE)
        ids.append(run_id)
    return ids


def study_compare_table(uri: str, experiment: str, study: str, metric: str = "gap_closed") -> pd.DataFrame:
    """policy x point from the point runs: `mean [ci_low, ci_high]` of `metric` per regime."""
    if metric not in STUDY_METRICS:
        raise ValueError(f"--metric {metric!r}: a study logs {list(STUDY_METRICS)}")
    preflight(uri)
    try:
        client = LockedClient(uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no experiment {experiment!r} in {redact(uri)}: run `syncsafe study report {study}`")
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{study}'")
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001
        raise RuntimeError(f"could not read study runs from {redact(uri)}: {one_line(err)}") from err
    if not runs:
        raise ValueError(f"no point runs of study {study!r} in {redact(uri)}: run `syncsafe study report {study}`")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    order: dict[str, int] = {}
    for run in runs:
        point = run.data.tags[TAG_POINT]
        order[point] = int(run.data.tags.get(TAG_ORDER, "0"))
        values = run.data.metrics
        for key, mean in values.items():
            if not key.endswith(f".{metric}_mean"):
                continue
            regime, policy = key.removesuffix(f".{metric}_mean").split(".", 1)
            low, high = values.get(key.replace("_mean", "_ci_low")), values.get(key.replace("_mean", "_ci_high"))
            cells.setdefault((regime, policy), {})[point] = f"{mean:.3g} [{_num(low)}, {_num(high)}]"
    points = sorted(order, key=order.__getitem__)
    rows = [{"regime": regime, "policy": policy, **{p: by_point.get(p, "") for p in points}}
            for (regime, policy), by_point in sorted(cells.items())]
    return pd.DataFrame(rows, columns=["regime", "policy", *points])


def _num(value: float | None) -> str:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return "-"
    return f"{value:.3g}"
