"""What the syncsafe DAGs share: where the pipeline lives, how a task reaches it, GPU routing.

Orchestration only. Airflow runs in its own environment (``.venv-airflow``,
``make airflow-env``: Airflow 3's pins clash with the pipeline's), so no task
imports the pipeline. Every stage runs as a ``@task.bash`` command line in the
*pipeline* environment, exactly the stage CLI that ``dvc repro`` runs
(``python -m syncsafe.cli <stage> ... --params params.yaml --root .``), and
the heavy imports (torch, pandas, MLflow) happen there. The few Python tasks
(merging the run's params, reading the DVC metrics diff) use only the standard
library and PyYAML, which Airflow itself depends on.

Settings, read from the environment when the DAG file is parsed or a task runs
(in a team setup set them on the DAG processor *and* the workers; the paths must
mean the same on every worker):

``SYNCSAFE_REPO``
    The checkout with ``params.yaml`` and ``dvc.yaml`` (default: the folder
    above ``dags/``).
``SYNCSAFE_PYTHON``
    Python of the pipeline environment (default ``$SYNCSAFE_REPO/.venv/bin/python``).
``SYNCSAFE_WORK_DIR``
    Where ``syncsafe_nightly`` runs write: one folder per DAG run
    (``<dag_id>/<run_id>``) holding the run's ``params.yaml``, ``data/``,
    ``runs/`` and ``reports/`` (default ``$AIRFLOW_HOME/syncsafe-runs``). On
    several workers or pods this must be shared storage: the stages of one
    run read each other's files.
``SYNCSAFE_VLLM_PYTHON``
    Python with vLLM on the worker that runs ``replay_vllm`` (the images set
    it); it replaces ``replay.vllm.python`` there. Unset: the params' value,
    a relative path taken relative to ``SYNCSAFE_REPO`` (``.venv-vllm``).
``MLFLOW_TRACKING_URI``
    The MLflow store; default ``sqlite:///$SYNCSAFE_WORK_DIR/mlflow.db`` so that
    nightly runs accumulate in one store. Every task exports
    ``SYNCSAFE_PIPELINE_RUN_ID=airflow-<dag_id>-<run_id>``, so each stage run
    of one DAG run lands under one MLflow pipeline (parent) run.
``SYNCSAFE_RETRIES``
    Retries per task (default 2; exponential backoff from 2 min, at most 1 h).
``SYNCSAFE_NIGHTLY_PROFILE``
    Default of ``syncsafe_nightly``'s ``profile`` param (default ``gpu``).

GPU routing (the tasks that need an accelerator: ``train`` and ``replay_vllm``):

``SYNCSAFE_GPU_QUEUE`` (default ``gpu``)
    Celery queue: run ``airflow celery worker --queues gpu`` on GPU hosts
    (``docker/compose.yaml``: service ``airflow-worker-gpu``). Other executors
    ignore queues.
``SYNCSAFE_GPU_POOL`` (default ``gpu``)
    Pool bounding concurrent GPU tasks: ``airflow pools set gpu <slots> "GPU
    slots"``, slots = GPUs (or GPU nodes) available to the DAG.
``SYNCSAFE_GPU_EXECUTOR`` (default: none, the configured executor)
    With several executors configured (``[core] executor =
    CeleryExecutor,KubernetesExecutor``), the one GPU tasks go to.
``SYNCSAFE_GPU_POD_TEMPLATE`` (default: none; ``docker/k8s/gpu-pod-template.yaml``
    when ``SYNCSAFE_GPU_EXECUTOR=KubernetesExecutor``)
    Pod template of GPU tasks under the KubernetesExecutor (requests
    ``nvidia.com/gpu``), passed as ``executor_config={"pod_template_file": ...}``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

DAGS_DIR = Path(__file__).resolve().parent
TAGS_BASE = ["syncsafe"]
#: The stage CLI's module, run with the pipeline's python.
CLI = "syncsafe.cli"
#: The launcher every stage process starts through (`syncsafe.stage_env`): it execs the stage with an
#: allow-listed environment, so no Airflow, database or broker secret of the worker reaches it.
STAGE_ENV = "syncsafe.stage_env"
#: The pipeline's stages in topological order (name, task, queue, regimes, after: the stages it reads
#: from), written by `syncsafe dvc-yaml` from syncsafe.pipeline.declarations beside dvc.yaml.
STAGES_FILE = DAGS_DIR / "syncsafe_stages.json"


def declared_stages() -> list[dict[str, Any]]:
    """The declared stages, in the order the nightly DAG runs them."""
    return json.loads(STAGES_FILE.read_text(encoding="utf-8"))["stages"]


def queue_kwargs(stage: dict[str, Any]) -> dict[str, Any]:
    """Operator arguments of a declared stage's task: GPU routing for the `gpu` queue, nothing else."""
    return gpu_task_kwargs() if stage["queue"] == "gpu" else {}


def repo_dir() -> Path:
    return Path(os.environ.get("SYNCSAFE_REPO") or DAGS_DIR.parent).resolve()


def pipeline_python() -> str:
    return os.environ.get("SYNCSAFE_PYTHON") or str(repo_dir() / ".venv" / "bin" / "python")


def work_base() -> Path:
    if os.environ.get("SYNCSAFE_WORK_DIR"):
        return Path(os.environ["SYNCSAFE_WORK_DIR"]).resolve()
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return (Path(home) / "syncsafe-runs").resolve()


def default_args() -> dict[str, Any]:
    """Retries with exponential backoff on every task."""
    return {
        "owner": "syncsafe",
        "retries": int(os.environ.get("SYNCSAFE_RETRIES", "2")),
        "retry_delay": timedelta(minutes=2),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(hours=1),
        "execution_timeout": timedelta(hours=8),
    }


def gpu_task_kwargs() -> dict[str, Any]:
    """Operator arguments that send a task to GPU capacity (see the module docstring)."""
    kwargs: dict[str, Any] = {
        "queue": os.environ.get("SYNCSAFE_GPU_QUEUE", "gpu"),
        "pool": os.environ.get("SYNCSAFE_GPU_POOL", "gpu"),
    }
    executor = os.environ.get("SYNCSAFE_GPU_EXECUTOR") or None
    if executor:
        kwargs["executor"] = executor
    template = os.environ.get("SYNCSAFE_GPU_POD_TEMPLATE")
    if not template and executor == "KubernetesExecutor":
        template = str(repo_dir() / "docker" / "k8s" / "gpu-pod-template.yaml")
    if template:
        kwargs["executor_config"] = {"pod_template_file": template}
    return kwargs


def pipeline_run_id(dag_id: str, run_id: str) -> str:
    """The MLflow pipeline run id of one DAG run (``SYNCSAFE_PIPELINE_RUN_ID``)."""
    return f"airflow-{dag_id}-{run_id}"


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"


def shell_env(run: dict[str, str]) -> str:
    """The exports every stage command starts with: every value shell-quoted (`shlex.quote`), so nothing in
    a run id, a path or a URI is expanded or executed; only the shell's own $PATH and $MLFLOW_TRACKING_URI are."""
    return "\n".join([
        "set -euo pipefail",
        f"export SYNCSAFE_PIPELINE_RUN_ID={shlex.quote(run['pipeline_run_id'])}",
        # the pipeline's tools first on PATH (DVC stages call `python stages/...`)
        f'export PATH={shlex.quote(str(Path(run["python"]).parent))}:"$PATH"',
        f'if [ -z "${{MLFLOW_TRACKING_URI:-}}" ]; then export MLFLOW_TRACKING_URI={shlex.quote(run["mlflow_default"])}; fi',
    ])


def stage_argv(python: str, *args: str) -> list[str]:
    """`python *args` started through the allow-listing launcher (`STAGE_ENV`): what every DAG task runs."""
    return [python, "-m", STAGE_ENV, "--", python, *args]


def stage_command(run: dict[str, str], *args: str, params: str | None = "params.yaml") -> str:
    """A stage CLI call in the run's working directory, in the pipeline environment (allow-listed)."""
    cli = ["-m", CLI, *args]
    if params:
        cli += ["--params", params]
    cli += ["--root", "."]
    return "\n".join([shell_env(run), f"cd {shlex.quote(run['workdir'])}",
                      "exec " + shlex.join(stage_argv(run["python"], *cli))])


# --------------------------------------------------------------------------- params of a run


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` onto ``base``: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def merge_run_params(base: dict, selection: dict) -> dict:
    """The run's params: the DAG params (profile, regimes, seeds, policies, random draws, vllm,
    overrides) onto ``base``, the repo's params with the chosen profile's overlay
    already applied (``syncsafe profile``). The pipeline validates the result
    (``syncsafe check``) before any stage runs.

    Choosing a subset of regimes, seeds or policies also narrows ``replay.vllm``'s
    subset to what the run has (its consistency checks would refuse the run otherwise).
    """
    raw = deep_merge(base, {})
    if selection.get("profile") and selection["profile"] != raw.get("profile", "cpu"):
        raise ValueError(f"profile {selection['profile']!r}: the base params are profile {raw.get('profile', 'cpu')!r} "
                         f"(compose them with `syncsafe profile {selection['profile']}` first)")
    if selection.get("regimes"):
        regimes = raw.get("regimes") or {}
        unknown = [r for r in selection["regimes"] if r not in regimes]
        if unknown:
            raise ValueError(f"regimes {unknown} are not in the base params (have {sorted(regimes)})")
        raw["regimes"] = {r: regimes[r] for r in selection["regimes"]}
    if selection.get("seeds"):
        raw["seeds"] = list(selection["seeds"])
    if selection.get("policies"):
        raw.setdefault("control", {})["policies"] = list(selection["policies"])
    if selection.get("random_draws"):
        raw.setdefault("schedules", {})["random_draws"] = int(selection["random_draws"])
    if selection.get("vllm") is not None:
        raw.setdefault("replay", {}).setdefault("vllm", {})["enabled"] = bool(selection["vllm"])
    overrides = selection.get("overrides") or {}
    raw = deep_merge(raw, overrides)

    vllm = raw.setdefault("replay", {}).setdefault("vllm", {})
    explicit = (overrides.get("replay") or {}).get("vllm") or {}
    names = list(raw.get("regimes") or {})
    if "regimes" not in explicit and vllm.get("regimes"):
        vllm["regimes"] = [r for r in vllm["regimes"] if r in names] or names[:1]
    for key in ("time_scale", "span_s"):  # per-regime pins of the regimes the run has
        if key not in explicit and isinstance(vllm.get(key), dict):
            vllm[key] = {r: v for r, v in vllm[key].items() if r in names}
    if "policies" not in explicit and vllm.get("policies"):
        have = (raw.get("control") or {}).get("policies")
        if have is not None:
            vllm["policies"] = [p for p in vllm["policies"] if p in have] or None
    if "seeds" not in explicit and vllm.get("seeds"):
        vllm["seeds"] = [s for s in vllm["seeds"] if s in raw.get("seeds", [])] or None
    draws = (raw.get("schedules") or {}).get("random_draws")
    if "draws" not in explicit and draws is not None and vllm.get("draws") is not None:
        vllm["draws"] = min(int(vllm["draws"]), int(draws))
    return raw


def vllm_params_here(workdir: Path, repo: Path) -> str:
    """The params file for ``replay run --backend vllm`` on *this* worker.

    ``replay.vllm.python`` names an interpreter on the machine that runs the replay
    (a GPU worker or pod, not necessarily the one that wrote the run's params):
    ``SYNCSAFE_VLLM_PYTHON`` when set, else the params' value, a bare command name
    (the gpu profile's ``python``) looked up on PATH, a relative path taken relative
    to the checkout (``.venv-vllm/bin/python``). Returns ``params.yaml`` when that
    changes nothing, else a copy with the resolved path beside it.
    """
    import yaml

    raw = yaml.safe_load((workdir / "params.yaml").read_text(encoding="utf-8"))
    vllm = raw.setdefault("replay", {}).setdefault("vllm", {})
    python = os.environ.get("SYNCSAFE_VLLM_PYTHON") or vllm.get("python") or ".venv-vllm/bin/python"
    if "/" not in python:
        python = shutil.which(python) or python
    elif not Path(python).is_absolute():
        python = str(repo / python)
    if python == vllm.get("python"):
        return "params.yaml"
    vllm["python"] = python
    name = "params.replay-vllm.yaml"
    (workdir / name).write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return name
