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
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from parallel_writers import item_runs, run_writers
from team_run import (DAG_ID, REPO, SCRIPT, check_no_secret_leaks, check_stage_runs, require_installs, session,
                      stage_login_env, successful_nightly, team_up)
from team_run import team_script as _script

from syncsafe.team import mlflow_auth, stack
from syncsafe.team.daemons import listening, process

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")]


@pytest.fixture(scope="module")
def team():
    """The team setup up on one machine, on free ports."""
    require_installs()
    with team_up("syncsafe-team-test-", "--free-ports") as layout:
        yield layout


@pytest.fixture(scope="module")
def nightly(team: stack.Layout):
    return successful_nightly(team, "one machine")


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
    check_no_secret_leaks(team.root, stack.load(team),
                          [team.state, team.airflow_home / "passwords.json", team.root / stack.REDIS_CONF,
                           team.root / stack.MLFLOW_AUTH_CONF])
    assert stat.S_IMODE(team.root.stat().st_mode) in (0o700, 0o750), "the state folder is not open to others"


def test_the_mlflow_server_refuses_a_client_without_a_login(team: stack.Layout) -> None:
    state = stack.load(team)
    url = stack.urls(state)["mlflow"]
    assert mlflow_auth.answers(url, None) == 401
    assert mlflow_auth.answers(url, (stack.MLFLOW_STAGE_USER, "not-its-password")) == 401
    assert mlflow_auth.answers(url, (stack.MLFLOW_STAGE_USER, state["secrets"]["mlflow_stage"])) == 200
    env = stack.env(team, state)  # the stage processes' login comes from the Airflow processes' environment
    assert (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == \
        (stack.MLFLOW_STAGE_USER, state["secrets"]["mlflow_stage"])


def test_redis_refuses_a_client_without_the_password(team: stack.Layout) -> None:
    state = stack.load(team)
    port, password = state["ports"]["redis"], state["secrets"]["redis"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(256).startswith(b"-NOAUTH"), "an unauthenticated PING was answered"
    assert stack._redis_ping(port, "127.0.0.1", password)
    assert password not in stack.urls(state)["redis"] and password in stack.broker_url(state)


def test_nightly_runs_train_on_the_gpu_worker(nightly) -> None:
    tis = nightly.tis
    ran = [t for t in tis if t["state"] == "success"]
    train = [t for t in ran if t["task_id"] == "train"]
    assert len(train) == 2  # fixed_h and wa_diloco, seed 0
    for ti in train:
        assert ti["queue"] == "gpu" and ti["pool"] == "gpu", ti
        assert ti["hostname"].startswith("gpu@"), ti
    others = [t for t in ran if t["task_id"] not in ("train", "replay_vllm")]
    assert others and all(t["hostname"].startswith("cpu@") and t["queue"] == "default" for t in others), others


def test_the_gpu_and_study_pools_are_made_with_their_slots(team: stack.Layout) -> None:
    client = stack.client(team)
    assert client.pool_slots("gpu") == 1
    assert client.pool_slots("syncsafe_study") == 1  # SYNCSAFE_STUDY_CONCURRENCY's default
    assert client.pool_slots("no_such_pool") is None


def test_every_stage_run_reached_the_mlflow_server(team: stack.Layout, nightly) -> None:
    check_stage_runs(stack.urls(stack.load(team))["mlflow"], nightly)


def test_six_stage_processes_writing_at_once_lose_no_run(team: stack.Layout, tmp_path: Path) -> None:
    uri = stack.urls(stack.load(team))["mlflow"]
    run_writers(uri, n=6, items=8, workdir=tmp_path, pipeline_run_id="parallel-server", login=stage_login_env(team))
    runs = item_runs(uri, "parallel-server")
    assert len(runs["pipeline"]) == 1
    assert sorted(r.data.tags["stage"] for r in runs["stage"]) == [f"parallel-{i}" for i in range(6)]
    assert len(runs["item"]) == 6 * 8 and {r.info.status for r in runs["item"]} == {"FINISHED"}
    assert sorted(r.data.metrics["value"] for r in runs["item"]) == sorted(i * 100 + s for i in range(6) for s in range(8))


def test_down_leaves_no_process_or_port(team: stack.Layout) -> None:
    state = stack.load(team)
    records = list(state["processes"].values())
    members = {p.pid for r in records for p in session(int(r["pid"]))}
    done = _script("down", "--dir", str(team.root), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(process(r) is None for r in records)
    assert not [p for p in members if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not psutil.pid_exists(int(state["postgres_pid"])) or \
        psutil.Process(int(state["postgres_pid"])).status() == psutil.STATUS_ZOMBIE
    assert [p for p in state["ports"].values() if listening(p)] == []
    assert _script("status", "--dir", str(team.root)).returncode == 1
    assert json.loads(team.state.read_text())["processes"] == {}


def test_bad_trigger_conf_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "trigger", DAG_ID, "--dir", str(tmp_path), "--conf", "[1, 2]"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --conf: expected a JSON object, got '[1, 2]'"]


def test_trigger_without_a_running_setup_says_so(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "trigger", DAG_ID, "--dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "is not up" in done.stderr and "Traceback" not in done.stderr



def test_sigterm_while_starting_takes_down_what_up_had_started() -> None:
    """`team up` stopped half-way (a CI timeout, a supervisor): one line, exit 143, no daemon left."""
    require_installs()
    root = Path(tempfile.mkdtemp(prefix="syncsafe-team-term-"))
    layout = stack.Layout.at(root, REPO)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_"))}
    proc = subprocess.Popen([str(SCRIPT), "up", "--dir", str(root), "--free-ports"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        started: dict = {}
        while not started:  # stop it once some daemon runs and others are still to come
            assert proc.poll() is None, "team up ended before a daemon had started"
            assert time.monotonic() < deadline, "no daemon started"
            started = dict(stack.load(layout).get("processes", {}))
            time.sleep(0.1)
        assert "airflow-worker-cpu" not in started
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 143, out + err
        assert err.strip().splitlines() == ["error: team up terminated (SIGTERM): everything it had started is down"]
        assert not [name for name, record in started.items() if process(record)], "a daemon outlived team up"
        assert not stack.load(layout)["processes"] and not stack.load(layout).get("postgres_pid")
    finally:
        if proc.poll() is None:
            proc.kill()
        stack.down(layout)
        shutil.rmtree(root, ignore_errors=True)
