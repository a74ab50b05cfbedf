"""syncsafe_study: one study (``studies/<name>.yaml``), one mapped task per point, then its report.

```
cpu_points ─► run_cpu_point[i] ─┐
gpu_points ─► run_gpu_point[j] ─┴─► report
```

- ``cpu_points`` / ``gpu_points`` list the study's points in the pipeline
  environment (``syncsafe study points <study> [--full]``, JSON): points that
  train (the ``full`` study: trained schedules) go to GPU capacity, the others
  to CPU workers.
- ``run_cpu_point`` / ``run_gpu_point`` are mapped over them (dynamic task
  mapping): each runs ``syncsafe study point <study> <point>``, one DVC
  experiment in a temporary copy of ``SYNCSAFE_REPO`` (``dvc exp run --temp``),
  whose stages DVC restores from its run cache when the point does not change
  them. Every point, CPU or GPU, takes a slot of one pool,
  ``SYNCSAFE_STUDY_POOL`` (default ``syncsafe_study``; ``team up`` makes it
  with ``SYNCSAFE_STUDY_CONCURRENCY`` slots, default 1): the pool, not the
  order of the tasks, bounds how many points use the checkout at once, so a
  failed CPU point never keeps the GPU points from running. The GPU points
  still go to the GPU queue (and executor); a task has one pool, so they take
  the study's instead of the ``gpu`` pool.
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
#: The pool every point of every study run takes a slot of, CPU and GPU points together.
STUDY_POOL = os.environ.get("SYNCSAFE_STUDY_POOL", "syncsafe_study")


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

    @task.bash(max_active_tis_per_dagrun=CONCURRENCY, pool=STUDY_POOL)
    def run_cpu_point(point: str) -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "point", ctx["params"]["study"], point)

    @task.bash(max_active_tis_per_dagrun=CONCURRENCY, **{**gpu_task_kwargs(), "pool": STUDY_POOL})
    def run_gpu_point(point: str) -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "point", ctx["params"]["study"], point)

    # once every point has ended, failed ones included: the report judges the points that finished (a failed
    # point has already failed the run)
    @task.bash(trigger_rule="all_done")
    def report() -> str:
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        return _run(ctx, "report", ctx["params"]["study"])

    [run_cpu_point.expand(point=cpu_points()), run_gpu_point.expand(point=gpu_points())] >> report()


syncsafe_study()
