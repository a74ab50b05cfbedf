"""syncsafe_study: one study (``studies/<name>.yaml``), one mapped task per point, then its report.

```
cpu_points ─► run_cpu_point[i] ─► run_gpu_point[j] ─► report
gpu_points ──────────────────────────────┘
```

- ``cpu_points`` / ``gpu_points`` list the study's points in the pipeline
  environment (``syncsafe study points <study> [--full]``, JSON): points that
  train (the ``full`` study: trained schedules) go to GPU capacity, the others
  to CPU workers.
- ``run_cpu_point`` / ``run_gpu_point`` are mapped over them (dynamic task
  mapping): each runs ``syncsafe study point <study> <point>``, one DVC
  experiment in a temporary copy of ``SYNCSAFE_REPO`` (``dvc exp run --temp``),
  whose stages DVC restores from its run cache when the point does not change
  them. ``SYNCSAFE_STUDY_CONCURRENCY`` (default 1) bounds how many points of a
  DAG run go at once: ``max_active_tis_per_dagrun`` bounds each mapped task,
  and the GPU points start once the CPU points are done (never side by side);
  the GPU ones also take a slot of the GPU pool.
- ``report`` judges the points as one family (``syncsafe study report``):
  ``reports/studies/<study>/`` in the checkout and one MLflow run per point in
  the experiment ``study-<study>``.

``full`` false (the default) is the CPU-cheap version (the study's ``cheap``
overrides: stress-harness schedules, the simulator); the nightly on GPU nodes
sets it true.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pendulum
from airflow.sdk import Param, dag, task

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # Airflow puts a bundle's root on sys.path; dags/ may sit below it (git bundle)
    sys.path.append(_HERE)
from syncsafe_dag_support import TAGS_BASE, default_args, gpu_task_kwargs  # noqa: E402

DAG_ID = "syncsafe_study"
#: Points of one DAG run that run at once (each is a whole pipeline in a temporary copy).
CONCURRENCY = int(os.environ.get("SYNCSAFE_STUDY_CONCURRENCY", "1"))


def _run(ctx: dict, *args: str) -> str:
    """The study CLI in the checkout, in the pipeline environment (`stage_command`: exports quoted)."""
    import syncsafe_dag_support as sup

    repo = sup.repo_dir()
    run = {"python": sup.pipeline_python(), "pipeline_run_id": sup.pipeline_run_id(DAG_ID, ctx["run_id"]),
           "mlflow_default": f"sqlite:///{repo / 'mlflow.db'}", "workdir": str(repo)}
    return sup.stage_command(run, "study", *args, *(["--full"] if ctx["params"]["full"] else []), params=None)


def _points(trains: bool) -> list[str]:
    """The slugs of the study's points that train (or do not), from `syncsafe study points` (JSON)."""
    import json
    import subprocess

    import syncsafe_dag_support as sup
    from airflow.sdk import get_current_context

    ctx = get_current_context()
    args = sup.stage_argv(sup.pipeline_python(), "-m", sup.CLI, "study", "points", ctx["params"]["study"],
                          *(["--full"] if ctx["params"]["full"] else []), "--root", ".")
    done = subprocess.run(args, cwd=sup.repo_dir(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"study points failed: {done.stderr.strip()}")
    return [p["slug"] for p in json.loads(done.stdout) if p["trains"] == trains]


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    tags=[*TAGS_BASE, "dvc", "study"],
    doc_md=__doc__,
    params={
        "study": Param("ablation", type="string", pattern="^[A-Za-z0-9_-]+$",
                       description="a study file's name (studies/<name>.yaml)"),
        "full": Param(False, type="boolean",
                      description="leave out the study's cheap overrides (trained schedules, real replays)"),
    },
)
def syncsafe_study():
    @task
    def cpu_points() -> list[str]:
        return _points(trains=False)

    @task
    def gpu_points() -> list[str]:
        return _points(trains=True)

    @task.bash(max_active_tis_per_dagrun=CONCURRENCY)
    def run_cpu_point(point: str) -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "point", ctx["params"]["study"], point)

    # after every CPU point (none_failed: also when there were none): the bound above is per task, so the two
    # mapped tasks never run side by side and no more than CONCURRENCY points use the checkout at once
    @task.bash(max_active_tis_per_dagrun=CONCURRENCY, trigger_rule="none_failed", **gpu_task_kwargs())
    def run_gpu_point(point: str) -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "point", ctx["params"]["study"], point)

    @task.bash(trigger_rule="none_failed")
    def report() -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "report", ctx["params"]["study"])

    cpu, gpu = run_cpu_point.expand(point=cpu_points()), run_gpu_point.expand(point=gpu_points())
    cpu >> gpu >> report()


syncsafe_study()
