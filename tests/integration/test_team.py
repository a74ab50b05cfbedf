"""The team setup for real, on one machine (``scripts/team.sh``, ``syncsafe.team``).

Debian's PostgreSQL and Redis, an MLflow server on Postgres, Airflow 3 with the
CeleryExecutor (api-server, scheduler, dag-processor, a ``cpu`` worker on the
``default`` queue and a ``gpu`` worker on the ``gpu`` queue), all on 127.0.0.1,
started by the script into a temporary state folder. Checks: the tiny nightly
run succeeds through the REST API with every ``train`` task on the ``gpu``
worker, every stage process's run reached the MLflow server, six stage
processes writing to the server at once lose no run, and ``down`` leaves no
process or listening port.

Needs ``make team-env`` (``make test`` runs it). Without it the tests skip,
except under CI, where a skip would hide a missing install step.
"""

from __future__ import annotations

import json
import stat
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from parallel_writers import item_runs, run_writers

from syncsafe.team import stack
from syncsafe.team.daemons import listening, process

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "team.sh"
DAG_ID = "syncsafe_nightly"
#: The Makefile's airflow-nightly-tiny conf: the tiny profile (one regime and seed, two policies), vLLM off.
TINY_CONF = {"profile": "tiny", "vllm": False}
#: DAG task -> the ``stage`` tag of the MLflow run its stage process logs.
STAGE_OF_TASK = {"traces": "traces", "train": "train", "schedules": "schedules",
                 "replay_simulator": "replay-simulator", "analyze": "analyze"}

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")]


def _missing() -> list[str]:
    missing = [str(p) for p in (REPO / ".venv-airflow" / "bin" / "airflow",) if not p.exists()]
    if not shutil.which("redis-server") and not Path("/usr/bin/redis-server").exists():
        missing.append("redis-server")
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and not shutil.which("initdb"):
        missing.append("PostgreSQL (initdb)")
    try:
        import psycopg2  # noqa: F401 - the MLflow server's Postgres driver
    except ImportError:
        missing.append("psycopg2 in .venv")
    return missing


def _script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_"))}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def team():
    """The team setup up in a temporary state folder (PostgreSQL's user must reach it: under /tmp,
    not pytest's 0700 tmp folder); brought down at the end whatever happened."""
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"missing {missing}: `make test` installs them with `make team-env`")
        pytest.skip(f"missing {missing} (make team-env)")
    root = Path(tempfile.mkdtemp(prefix="syncsafe-team-test-"))
    layout = stack.Layout.at(root, REPO)
    try:
        done = _script("up", "--dir", str(root), "--free-ports", "--env", "SYNCSAFE_RETRIES=0")
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        yield layout
    finally:
        stack.down(layout)  # after test_down_leaves_nothing has run: a no-op
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def nightly(team: stack.Layout) -> tuple[str, list[dict]]:
    """One tiny nightly run, triggered and awaited through the REST API: (run id, task instances)."""
    client = stack.client(team)
    client.wait_for_dag(DAG_ID)
    client.unpause(DAG_ID)
    run_id = client.trigger(DAG_ID, TINY_CONF)
    state = client.wait_run(DAG_ID, run_id, timeout_s=1500)
    tis = client.task_instances(DAG_ID, run_id)
    summary = [(t["task_id"], t["map_index"], t["state"], t["hostname"]) for t in tis]
    assert state == "success", f"{run_id}: {state}; {summary}; logs in {team.airflow_home / 'logs'}"
    return run_id, tis


def test_everything_listens_on_loopback_only(team: stack.Layout) -> None:
    state = stack.load(team)
    assert _script("status", "--dir", str(team.root)).returncode == 0
    pids = {int(r["pid"]) for r in state["processes"].values()} | {int(state["postgres_pid"])}
    ours = set(pids)
    for pid in pids:
        ours |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
    sockets = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert {c.laddr.port for c in sockets} >= set(state["ports"].values())
    assert {c.laddr.ip for c in sockets} == {"127.0.0.1"}, sockets


def test_secrets_stay_out_of_command_lines_logs_and_other_users_reach(team: stack.Layout) -> None:
    state = stack.load(team)
    secrets = [v for v in state["secrets"].values() if len(v) >= 16]
    for path in (team.state, team.airflow_home / "passwords.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for name, record in state["processes"].items():
        proc = psutil.Process(int(record["pid"]))
        for member in [proc, *proc.children(recursive=True)]:
            cmdline = " ".join(member.cmdline())
            assert not any(secret in cmdline for secret in secrets), f"{name}: a secret in its command line"
    for log in team.root.rglob("*.log"):
        text = log.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), f"{log}: a secret in the log"


def test_nightly_runs_train_on_the_gpu_worker(nightly: tuple[str, list[dict]]) -> None:
    _, tis = nightly
    ran = [t for t in tis if t["state"] == "success"]
    train = [t for t in ran if t["task_id"] == "train"]
    assert len(train) == 2  # fixed_h and wa_diloco, seed 0
    for ti in train:
        assert ti["queue"] == "gpu" and ti["pool"] == "gpu", ti
        assert ti["hostname"].startswith("gpu@"), ti
    others = [t for t in ran if t["task_id"] not in ("train", "replay_vllm")]
    assert others and all(t["hostname"].startswith("cpu@") and t["queue"] == "default" for t in others), others


def test_every_stage_run_reached_the_mlflow_server(team: stack.Layout, nightly: tuple[str, list[dict]]) -> None:
    from mlflow import MlflowClient

    run_id, tis = nightly
    uri = stack.urls(stack.load(team))["mlflow"]
    runs = item_runs(uri, f"airflow-{DAG_ID}-{run_id}")
    assert len(runs["pipeline"]) == 1
    stages = runs["stage"]
    assert {r.info.status for r in stages} == {"FINISHED"}
    for task, stage in STAGE_OF_TASK.items():
        expected = sum(1 for t in tis if t["task_id"] == task and t["state"] == "success")
        got = [r for r in stages if r.data.tags["stage"] == stage]
        assert expected >= 1 and len(got) == expected, (task, expected, [r.data.tags["stage"] for r in stages])
    trained = {(r.data.tags["policy"], r.data.tags["seed"]) for r in runs["item"] if r.data.tags["stage"] == "train"}
    assert trained == {("fixed_h", "0"), ("wa_diloco", "0")}
    # the runs' artifacts went through the server too (served artifacts, not the worker's disk)
    client = MlflowClient(tracking_uri=uri)
    train_stage = next(r for r in stages if r.data.tags["stage"] == "train")
    assert train_stage.info.artifact_uri.startswith("mlflow-artifacts:")
    item = next(r for r in runs["item"] if r.data.tags["stage"] == "train")
    assert client.list_artifacts(item.info.run_id), "train item run without artifacts"


def test_six_stage_processes_writing_at_once_lose_no_run(team: stack.Layout, tmp_path: Path) -> None:
    uri = stack.urls(stack.load(team))["mlflow"]
    run_writers(uri, n=6, items=8, workdir=tmp_path, pipeline_run_id="parallel-server")
    runs = item_runs(uri, "parallel-server")
    assert len(runs["pipeline"]) == 1
    assert sorted(r.data.tags["stage"] for r in runs["stage"]) == [f"parallel-{i}" for i in range(6)]
    assert len(runs["item"]) == 6 * 8 and {r.info.status for r in runs["item"]} == {"FINISHED"}
    assert sorted(r.data.metrics["value"] for r in runs["item"]) == sorted(i * 100 + s for i in range(6) for s in range(8))


def test_down_leaves_no_process_or_port(team: stack.Layout) -> None:
    state = stack.load(team)
    records = list(state["processes"].values())
    session = {p.pid for r in records for p in _session(int(r["pid"]))}
    done = _script("down", "--dir", str(team.root), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(process(r) is None for r in records)
    assert not [p for p in session if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not psutil.pid_exists(int(state["postgres_pid"])) or \
        psutil.Process(int(state["postgres_pid"])).status() == psutil.STATUS_ZOMBIE
    assert [p for p in state["ports"].values() if listening(p)] == []
    assert _script("status", "--dir", str(team.root)).returncode == 1
    assert json.loads(team.state.read_text())["processes"] == {}


def _session(sid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                out.append(proc)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def test_bad_trigger_conf_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "trigger", DAG_ID, "--dir", str(tmp_path), "--conf", "[1, 2]"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --conf: expected a JSON object, got '[1, 2]'"]


def test_trigger_without_a_running_setup_says_so(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "trigger", DAG_ID, "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "is not up" in done.stderr and "Traceback" not in done.stderr

