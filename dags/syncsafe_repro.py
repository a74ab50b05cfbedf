"""syncsafe_repro: ``dvc repro`` of the checkout for a chosen profile, then the metrics diff.

```
repro ─► metrics_diff
```

- ``repro`` runs in ``SYNCSAFE_REPO`` with the pipeline environment first on
  PATH (the DVC stages call ``python stages/...``). When the checkout's
  ``params.yaml`` already has the chosen profile it runs ``dvc repro``;
  otherwise it composes the profile onto ``params.yaml`` (``syncsafe profile
  <profile> --out params.yaml``: the whole overlay, never the label alone) and
  runs ``dvc exp run`` (a DVC experiment: ``params.yaml`` changes in the
  workspace only, ``dvc exp show`` lists it).
  ``targets`` limits the run to some stages (e.g. ``["traces"]``), ``force``
  reruns up-to-date stages, ``dry`` only prints the commands.
- ``metrics_diff`` reports ``dvc metrics diff`` (workspace against the last
  commit, Markdown) in its log and as its XCom, and ``dvc params diff`` beside it.
- DVC decides what reruns, so one DAG run at a time (``max_active_runs=1``);
  every stage lands under the MLflow pipeline run
  ``airflow-syncsafe_repro-<run_id>`` (``SYNCSAFE_PIPELINE_RUN_ID``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum
from airflow.sdk import Param, dag, task

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # Airflow puts a bundle's root on sys.path; dags/ may sit below it (git bundle)
    sys.path.append(_HERE)
from syncsafe_dag_support import TAGS_BASE, default_args  # noqa: E402

DAG_ID = "syncsafe_repro"


@dag(
    dag_id=DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    tags=[*TAGS_BASE, "dvc", "repro"],
    doc_md=__doc__,
    params={
        "profile": Param("cpu", type="string", enum=["cpu", "powered", "gpu", "tiny"],
                         description="profile to reproduce (syncsafe/profiles/; cpu: params.yaml itself)"),
        "targets": Param([], type="array", items={"type": "string", "pattern": "^[A-Za-z0-9_@.-]+$"},
                         uniqueItems=True, description="DVC stages to reproduce (empty: the whole pipeline)"),
        "force": Param(False, type="boolean", description="rerun stages even when up to date"),
        "dry": Param(False, type="boolean", description="only print the commands DVC would run"),
    },
)
def syncsafe_repro():
    @task.bash
    def repro() -> str:
        import shlex

        import syncsafe_dag_support as sup
        import yaml
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        chosen = ctx["params"]
        repo = sup.repo_dir()
        current = (yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8")) or {}).get("profile", "cpu")
        flags = [*(["--force"] if chosen["force"] else []), *(["--dry"] if chosen["dry"] else [])]
        run = {"python": sup.pipeline_python(), "pipeline_run_id": sup.pipeline_run_id(DAG_ID, ctx["run_id"]),
               "mlflow_default": f"sqlite:///{repo / 'mlflow.db'}"}
        compose = []
        if chosen["profile"] == current:
            dvc = ["repro", *flags, *chosen["targets"]]
        else:  # the profile's whole overlay (syncsafe.profiles), then a DVC experiment on it
            compose = [shlex.join(sup.stage_argv(run["python"], "-m", sup.CLI, "profile", chosen["profile"], "--out",
                                                 "params.yaml"))]
            dvc = ["exp", "run", *flags, *chosen["targets"]]
        return "\n".join([sup.shell_env(run), f"cd {shlex.quote(str(repo))}", *compose,
                          "exec " + shlex.join(sup.stage_argv(run["python"], "-m", "dvc", *dvc))])

    @task
    def metrics_diff() -> str:
        import subprocess

        import syncsafe_dag_support as sup

        repo = sup.repo_dir()
        python = sup.pipeline_python()

        def dvc(*args: str) -> str:
            done = subprocess.run(sup.stage_argv(python, "-m", "dvc", *args), cwd=repo, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"dvc {' '.join(args)} failed: {done.stderr.strip()}")
            return done.stdout.strip()

        metrics = dvc("metrics", "diff", "--md") or "(no metric changed against the last commit)"
        params = dvc("params", "diff", "--md") or "(no parameter changed against the last commit)"
        report = f"## dvc metrics diff\n\n{metrics}\n\n## dvc params diff\n\n{params}\n"
        print(report)
        return report

    repro() >> metrics_diff()


syncsafe_repro()
