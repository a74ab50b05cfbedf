"""The team setup across fleet hosts (``scripts/team.sh up --fleet sstm --hosts 2``, :mod:`syncsafe.team.placement`).

A fleet ``sstm`` of two test hosts (network namespaces of this machine, :mod:`syncsafe.fleet`): host
``a`` (10.77.0.1) runs PostgreSQL, Redis, the MLflow server, Airflow's api-server, scheduler,
dag-processor and the ``cpu`` worker; host ``b`` (10.77.0.2) the ``gpu`` worker. Checks: each process
runs in its host's namespace; the listening sockets of each host are the services' ports on a's
address and nothing else (none on 0.0.0.0, ::, 127.0.0.1; none at all on b: the workers' log server is
off); the tiny nightly run succeeds with every ``train`` task on b's gpu worker and every stage
process's run on the MLflow server on a; no secret on a command line or in a log; ``down`` leaves no
process in the fleet's namespaces.

Needs root (network namespaces) and ``make team-env``. Where namespaces cannot be made, or an install
is missing, the tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import os
import sys

import psutil
import pytest
from team_run import (cannot_run, check_no_secret_leaks, check_stage_runs, require_installs, session,
                      successful_nightly, team_script, team_up)

from syncsafe.fleet import netns
from syncsafe.fleet.hosts import Fleet
from syncsafe.team import stack
from syncsafe.team.daemons import process
from syncsafe.team.placement import Placement

FLEET = Fleet("sstm", ("a", "b"))
WHERE = Placement.across(FLEET)
A, B = FLEET.address("a"), FLEET.address("b")

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")]


@pytest.fixture(scope="module")
def fleet():
    """Fleet sstm up (a leftover one from an interrupted run replaced); deleted at the end, whatever happened."""
    require_installs()
    try:
        if netns.existing(FLEET):
            netns.down(FLEET)
        netns.up(FLEET)
    except (netns.FleetError, OSError) as err:
        cannot_run(f"cannot make network namespaces here: {err}")
    try:
        yield FLEET
    finally:
        netns.down(FLEET)


@pytest.fixture(scope="module")
def team(fleet: Fleet):
    """The team setup up across the fleet; brought down before the fleet, whatever happened."""
    with team_up("syncsafe-team-hosts-test-", "--fleet", fleet.name, "--hosts", str(len(fleet.hosts))) as layout:
        yield layout


@pytest.fixture(scope="module")
def nightly(team: stack.Layout):
    return successful_nightly(team, "fleet sstm, two hosts")


def _netns_inode(path: str) -> int:
    return os.stat(path).st_ino


def _listeners(host: str) -> set[tuple[str, str, str]]:
    """(protocol, address, port) of every listening TCP socket and bound UDP socket on ``host``."""
    done = netns.run_on(FLEET, host, ["ss", "-ltunH"], capture_output=True, text=True, check=True)
    out = set()
    for line in done.stdout.splitlines():
        proto, _state, _recv, _send, local, *_ = line.split()
        address, _, port = local.rpartition(":")
        out.add((proto, address.strip("[]").split("%")[0], port))
    return out


def test_each_process_runs_in_its_hosts_namespace(team: stack.Layout) -> None:
    state = stack.load(team)
    assert state["placement"] == WHERE.to_json()
    pids = {name: int(r["pid"]) for name, r in state["processes"].items()} | {"postgres": int(state["postgres_pid"])}
    expected = {name: WHERE.host(name) for name in pids}
    assert expected["airflow-worker-gpu"] == "b" and set(expected.values()) == {"a", "b"}
    for name, pid in pids.items():
        ns = _netns_inode(f"/proc/{pid}/ns/net")
        assert ns == _netns_inode(f"/run/netns/{FLEET.namespace(expected[name])}"), (name, expected[name])
        assert ns != _netns_inode("/proc/self/ns/net"), name


def test_a_listens_on_its_fleet_address_only_and_b_not_at_all(team: stack.Layout) -> None:
    ports = stack.load(team)["ports"]
    assert _listeners("a") == {("tcp", A, str(p)) for p in ports.values()}
    # b runs only the gpu Celery worker: it connects out to a (broker, result backend, execution API,
    # MLflow) and serves nothing; its log server is off (it would bind every interface)
    assert _listeners("b") == set()


_REFUSED = """
import socket, sys
from urllib.parse import urlsplit
from syncsafe.team import mlflow_auth
mlflow, redis = sys.argv[1:3]
print(mlflow_auth.answers(mlflow, None))
where = urlsplit(redis)
with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
    sock.sendall(b"PING\\r\\n")
    print(sock.recv(64).decode().strip())
"""


def test_a_client_on_b_without_credentials_is_refused_by_mlflow_and_redis_on_a(team: stack.Layout) -> None:
    """The one-machine tests check the same from loopback; here from the other host, over the fleet's links."""
    urls = stack.urls(stack.load(team))
    done = netns.run_on(FLEET, "b", [sys.executable, "-c", _REFUSED, urls["mlflow"], urls["redis"]],
                        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    status, reply = done.stdout.splitlines()[:2]
    assert A in urls["mlflow"] and A in urls["redis"]
    assert status == "401", "the MLflow server on a answered b without a login"
    assert reply.startswith("-NOAUTH"), "Redis on a answered b without its password"


def test_nightly_runs_train_on_host_bs_gpu_worker(nightly) -> None:
    ran = [t for t in nightly.tis if t["state"] == "success"]
    train = [t for t in ran if t["task_id"] == "train"]
    assert len(train) == 2  # fixed_h and wa_diloco, seed 0
    for ti in train:
        assert ti["hostname"] == "gpu@b" and ti["queue"] == "gpu" and ti["pool"] == "gpu", ti
    others = [t for t in ran if t["task_id"] not in ("train", "replay_vllm")]
    assert others and all(t["hostname"] == "cpu@a" and t["queue"] == "default" for t in others), others


def test_every_stage_run_reached_the_mlflow_server_on_a(team: stack.Layout, nightly) -> None:
    uri = stack.urls(stack.load(team))["mlflow"]
    assert uri.startswith(f"http://{A}:")
    WHERE.call(check_stage_runs, uri, nightly)  # from a: the machine's own namespace cannot reach the fleet


def test_secrets_stay_out_of_command_lines_and_logs(team: stack.Layout, nightly) -> None:
    check_no_secret_leaks(team.root, stack.load(team),
                          [team.state, team.airflow_home / "passwords.json", team.root / stack.REDIS_CONF])


def test_down_leaves_no_process_on_any_host(team: stack.Layout) -> None:
    state = stack.load(team)
    records = list(state["processes"].values())
    members = {p.pid for r in records for p in session(int(r["pid"]))}
    done = team_script("down", "--dir", str(team.root), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(process(r) is None for r in records)
    assert not [p for p in members if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert {host: netns.pids(FLEET.namespace(host)) for host in FLEET.hosts} == {"a": [], "b": []}
    assert _listeners("a") == set() and _listeners("b") == set()
    status = team_script("status", "--dir", str(team.root))
    assert status.returncode == 1 and "fleet sstm" in status.stdout, status.stdout
