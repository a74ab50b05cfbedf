"""syncsafe_nightly: the whole pipeline, every night, in its own working directory.

```
prepare ─► traces[regime] ─► train[regime × policy × seed] ─► schedules[regime] ─► schedule_index
  ─► profile_vllm ─► replay_vllm ─► calibrate_fit ─► replay_simulator[regime] ─► replay_index ─► fidelity ─► analyze
train_resources ─► train ─► live (skipped unless live.enabled) ─► analyze
```

- The stage tasks and their order come from the stage declarations
  (``syncsafe.pipeline.declarations``, the source of dvc.yaml too), read from
  ``dags/syncsafe_stages.json`` (written by ``syncsafe dvc-yaml``): each stage's
  task runs after every stage whose outputs it reads (the diagram shows the
  main line), on its declared queue (cpu or gpu).

- ``prepare`` applies the chosen profile's overlay to the repo's
  ``params.yaml`` (``syncsafe profile``), merges the DAG params onto it
  (Airflow has checked them against their JSON schema), writes the result to
  the run's working directory
  (``$SYNCSAFE_WORK_DIR/syncsafe_nightly/<run_id>/params.yaml``) and validates
  it with the pipeline's own schema (``syncsafe check``, i.e.
  ``syncsafe.config.parse_params``); a bad value fails the run there, without
  retries, naming the key, before anything trains. It returns the mapping
  lists; ``regimes`` and ``train_grid`` hand them on, because Airflow maps
  only over a task's whole return value.
- Stages are ``@task.bash`` commands of the stage CLI, run with the pipeline
  environment's python (Airflow lives in its own environment; see
  ``syncsafe_dag_support``), so heavy imports happen only inside tasks.
- ``train_resources`` builds the cpu profile's corpus and tokenizer once (a
  library call: the train CLI has no step for it), so that parallel ``train``
  tasks do not race to create the shared cache.
- ``train`` is mapped over regime × policy × seed (``--resume`` on a retry
  continues from the last merge checkpoint). With ``schedules.source:
  harness`` it maps over nothing and is skipped.
- Replay granularity: the simulator is mapped per *regime*, not per
  schedule: one regime holds seeds × policies × (random draws + 2) schedules
  (about 1,800 with the gpu profile's 10 seeds and 20 draws), each replayed
  in milliseconds, so per-schedule tasks would cost far more in scheduling
  than in work. ``replay_vllm`` is one task: it starts one vLLM server (minutes)
  and replays the configured subset (``replay.vllm``) through it. The
  calibration loop follows the pipeline's: ``calibrate_fit`` fits the
  simulator to the fit seeds' real replays, the simulator replays use that
  fit, and ``fidelity`` judges it on the held-out seeds before ``analyze``.
  When ``replay.vllm.enabled`` is false, ``profile_vllm`` and ``replay_vllm`` are skipped and
  ``calibrate_fit`` writes the shipped defaults (``calibration: default``):
  ``analyze`` then has no mechanism evidence and an unlicensed simulator, so
  its verdicts license no serving claim.
- ``live`` runs ``syncsafe live`` (the controller as a sidecar beside a real
  vLLM server, on the wall clock) after training; skipped unless ``live.enabled``.
- GPU tasks (the stages declared on the ``gpu`` queue: ``train``, ``profile_vllm``, ``replay_vllm``,
  ``live``) go to the GPU queue / pool / executor of ``syncsafe_dag_support.gpu_task_kwargs``.
- Every task exports ``SYNCSAFE_PIPELINE_RUN_ID=airflow-syncsafe_nightly-<run_id>``:
  each stage's MLflow run lands under one pipeline run per DAG run.

Local run (cpu profile, tiny params): see README, "Airflow and Docker".
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
from syncsafe_dag_support import (  # noqa: E402
    TAGS_BASE,
    declared_stages,
    default_args,
    queue_kwargs,
    stage_command,
)

DAG_ID = "syncsafe_nightly"
#: The pipeline's stages (syncsafe.pipeline.declarations, via dags/syncsafe_stages.json): each stage's
#: task runs after the stages it reads from, on its declared queue.
STAGES = {stage["name"]: stage for stage in declared_stages()}


def _stage(name: str) -> dict:
    """Task arguments of stage `name`: its queue's routing; it runs unless an upstream task failed
    (a stage that is off for this run is skipped, and its readers run on what there is)."""
    return {"trigger_rule": "none_failed", **queue_kwargs(STAGES[name])}
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"}


def _label(text: str) -> None:
    """Name a mapped task instance in the UI (rendered by ``map_index_template``)."""
    from airflow.sdk import get_current_context

    get_current_context()["syncsafe_item"] = text


@dag(
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    tags=[*TAGS_BASE, "nightly", "gpu"],
    doc_md=__doc__,
    params={
        "profile": Param(
            os.environ.get("SYNCSAFE_NIGHTLY_PROFILE", "gpu"),
            type="string",
            enum=["cpu", "powered", "gpu", "tiny"],
            description="profile (syncsafe/profiles/): cpu (params.yaml: small local model, vLLM CPU), "
                        "powered (cpu with the real arm at the paper's standard: CPU nodes), "
                        "gpu (hub model, vLLM CUDA) or tiny (cpu shrunk to one regime and seed)",
        ),
        "regimes": Param(None, type=["null", "array"], items=_NAME, minItems=1, uniqueItems=True,
                         description="regimes to run (null: all regimes of the base params)"),
        "seeds": Param(None, type=["null", "array"], items={"type": "integer", "minimum": 0}, minItems=1,
                       uniqueItems=True, description="seeds (null: the base params' seeds)"),
        "policies": Param(None, type=["null", "array"], items=_NAME, minItems=1, uniqueItems=True,
                          description="controller policies (null: control.policies of the base params)"),
        "random_draws": Param(None, type=["null", "integer"], minimum=1,
                              description="matched-random draws per controller (null: schedules.random_draws)"),
        "vllm": Param(None, type=["null", "boolean"],
                      description="replay against a real vLLM server (null: replay.vllm.enabled)"),
        "overrides": Param({}, type="object",
                           description='any params.yaml keys, deep-merged last, e.g. {"train": {"eval_batches": 2}}'),
        "base_params": Param("params.yaml", type="string", minLength=1,
                             description="params file the run starts from, relative to the repo"),
    },
)
def syncsafe_nightly():
    @task
    def prepare() -> dict:
        """Write and validate the run's params.yaml; return the run settings and mapping lists."""
        import json
        import subprocess
        from pathlib import Path

        import syncsafe_dag_support as sup
        import yaml
        from airflow.sdk import get_current_context

        ctx = get_current_context()
        selection = dict(ctx["params"])
        repo = sup.repo_dir()
        python = sup.pipeline_python()
        if not Path(python).exists():
            raise FileNotFoundError(f"pipeline python {python} not found: run `make setup` or set SYNCSAFE_PYTHON")
        workdir = sup.work_base() / DAG_ID / sup.safe_name(ctx["run_id"])
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SYNCSAFE_TRACKING": "off"}

        def pipeline(*args: str) -> str:
            done = subprocess.run(sup.stage_argv(python, "-m", sup.CLI, *args), capture_output=True, text=True,
                                  cwd=workdir, env=env)
            if done.returncode != 0:
                raise ValueError(f"syncsafe {args[0]}: {done.stderr.strip() or done.stdout.strip()}")
            return done.stdout

        try:  # bad params fail the run at once: a retry would not fix them
            # the profile's overlay (syncsafe.profiles) on the base params, then this run's choices
            profiled = workdir / "params.profile.yaml"
            pipeline("profile", selection["profile"], "--params", str(repo / selection["base_params"]),
                     "--out", str(profiled))
            raw = sup.merge_run_params(yaml.safe_load(profiled.read_text(encoding="utf-8")), selection)
            params_path = workdir / "params.yaml"
            params_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
            p = json.loads(pipeline("check", "--params", str(params_path)))  # validated, defaults filled in
        except ValueError as err:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"run params rejected: {err}") from None

        run = {
            "workdir": str(workdir),
            "python": python,
            "pipeline_run_id": sup.pipeline_run_id(DAG_ID, ctx["run_id"]),
            "mlflow_default": f"sqlite:///{sup.work_base() / 'mlflow.db'}",
        }
        regimes = list(p["regimes"])
        train_runs = []
        if p["schedules"]["source"] == "train":
            train_runs = [{"regime": r, "policy": pol, "seed": s}
                          for r in regimes for pol in p["control"]["policies"] for s in p["seeds"]]
        print(f"run directory {workdir}; profile {p['profile']}; regimes {regimes}; "
              f"{len(train_runs)} training runs; vLLM replay {'on' if p['replay']['vllm']['enabled'] else 'off'}")
        return {"run": run, "regimes": regimes, "train_runs": train_runs, "vllm": bool(p["replay"]["vllm"]["enabled"]),
                "live": bool(p["live"]["enabled"])}

    @task.bash(map_index_template="{{ syncsafe_item }}", **_stage("traces"))
    def traces(run: dict, regime: str) -> str:
        _label(regime)
        return stage_command(run, "traces", "--regime", regime)

    @task.bash
    def train_resources(run: dict) -> str:
        """train.source builtin: build the corpus and tokenizer once, before the mapped train tasks
        race for the cache under runs/ (train.source hub: they come from the hub)."""
        import shlex

        import syncsafe_dag_support as sup

        code = ("from pathlib import Path; from syncsafe.config import load_params; "
                "from syncsafe.diloco.resources import prepare_tokenizer; p = load_params('params.yaml'); "
                "print('tokenizer', prepare_tokenizer(p, Path('.'))[1].vocab_size) if p.train.source == 'builtin' "
                "else print('train.source hub: hub tokenizer')")
        return "\n".join([sup.shell_env(run), f"cd {shlex.quote(run['workdir'])}",
                          "exec " + shlex.join(sup.stage_argv(run["python"], "-c", code))])

    @task.bash(map_index_template="{{ syncsafe_item }}", **_stage("train"))
    def train(run: dict, item: dict) -> str:
        from airflow.sdk import get_current_context

        _label(f"{item['regime']}/{item['policy']}/seed-{item['seed']}")
        resume = ["--resume"] if get_current_context()["ti"].try_number > 1 else []
        return stage_command(run, "train", "--regime", item["regime"], "--policy", item["policy"],
                             "--seed", str(item["seed"]), *resume)

    @task.bash(map_index_template="{{ syncsafe_item }}", **_stage("schedules"))
    def schedules(run: dict, regime: str) -> str:
        _label(regime)
        return stage_command(run, "schedules", "build", "--regime", regime)

    @task.bash(**_stage("schedule-index"))
    def schedule_index(run: dict) -> str:
        return stage_command(run, "schedules", "index")

    @task.bash(map_index_template="{{ syncsafe_item }}", **_stage("replay-simulator"))
    def replay_simulator(run: dict, regime: str) -> str:
        _label(regime)
        return stage_command(run, "replay", "run", "--backend", "simulator", "--regime", regime)

    @task.bash(map_index_template="{{ syncsafe_item }}", **_stage("headroom"))
    def headroom(run: dict, regime: str) -> str:
        _label(regime)
        return stage_command(run, "headroom", regime, "--stage")

    @task.bash(**_stage("profile-vllm"))
    def profile_vllm(run: dict, enabled: bool) -> str:
        """The server profile the real arm plans from, on the worker (and accelerator) that replays."""
        if not enabled:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException("replay.vllm.enabled is false for this run")
        from pathlib import Path

        import syncsafe_dag_support as sup

        params = sup.vllm_params_here(Path(run["workdir"]), sup.repo_dir())
        return stage_command(run, "replay", "profile", params=params)

    @task.bash(**_stage("replay-vllm"))
    def replay_vllm(run: dict, enabled: bool) -> str:
        if not enabled:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException("replay.vllm.enabled is false for this run")
        from pathlib import Path

        import syncsafe_dag_support as sup

        params = sup.vllm_params_here(Path(run["workdir"]), sup.repo_dir())
        return stage_command(run, "replay", "run", "--backend", "vllm", params=params)

    @task.bash(**_stage("replay-index"))
    def replay_index(run: dict) -> str:
        return stage_command(run, "replay", "index", params=None)

    @task.bash(**_stage("calibrate-fit"))
    def calibrate_fit(run: dict) -> str:
        return stage_command(run, "calibrate-fit")

    @task.bash(**_stage("fidelity"))
    def fidelity(run: dict) -> str:
        return stage_command(run, "fidelity")

    @task.bash(**_stage("live"))
    def live(run: dict, enabled: bool) -> str:
        """The controller as a sidecar beside a real vLLM server on the wall clock (live.enabled)."""
        if not enabled:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException("live.enabled is false for this run")
        from pathlib import Path

        import syncsafe_dag_support as sup

        params = sup.vllm_params_here(Path(run["workdir"]), sup.repo_dir())
        return stage_command(run, "live", "--stage", params=params)

    @task.bash(**_stage("analyze"))
    def analyze(run: dict) -> str:
        return stage_command(run, "analyze")

    @task
    def regimes(plan: dict) -> list[str]:
        return plan["regimes"]

    @task
    def train_grid(plan: dict) -> list[dict]:
        return plan["train_runs"]

    plan = prepare()
    run = plan["run"]
    names = regimes(plan)
    tasks = {
        "traces": traces.partial(run=run).expand(regime=names),
        "train": train.partial(run=run).expand(item=train_grid(plan)),
        "schedules": schedules.partial(run=run).expand(regime=names),
        "schedule-index": schedule_index(run),
        "profile-vllm": profile_vllm(run, plan["vllm"]),
        "replay-vllm": replay_vllm(run, plan["vllm"]),
        "calibrate-fit": calibrate_fit(run),
        "replay-simulator": replay_simulator.partial(run=run).expand(regime=names),
        "headroom": headroom.partial(run=run).expand(regime=names),
        "replay-index": replay_index(run),
        "fidelity": fidelity(run),
        "live": live(run, plan["live"]),
        "analyze": analyze(run),
    }
    if set(tasks) != set(STAGES):
        raise ValueError(f"the DAG's stage tasks {sorted(tasks)} are not the declared stages {sorted(STAGES)}: "
                         "add or remove the task (dags/syncsafe_stages.json: `syncsafe dvc-yaml`)")
    for name, stage in STAGES.items():  # declared (topological) order
        for upstream in stage["after"]:
            tasks[upstream] >> tasks[name]
    train_resources(run) >> tasks["train"]


syncsafe_nightly()
