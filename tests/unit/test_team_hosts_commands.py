"""The team setup's placement over fleet hosts: who runs where, what each process binds, the URLs it is
given and the command lines that start it (pure builders; no root, no namespace, no process started)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from syncsafe.fleet.hosts import Fleet
from syncsafe.procs import HOST_ENV
from syncsafe.team import airflow as af
from syncsafe.team import hostname, postgres, stack
from syncsafe.team.daemons import TeamError
from syncsafe.team.netns_call import call_in
from syncsafe.errors import BadInput
from syncsafe.team.placement import SERVICES, Placement, fleet_placement

A, B, C = "10.77.0.1", "10.77.0.2", "10.77.0.3"
TWO = Placement.across(Fleet("sstm", ("a", "b")))
THREE = Placement.across(Fleet("sstm", ("a", "b", "c")))


def _state(where: Placement) -> dict:
    return {"ports": {"airflow": 8080, "mlflow": 5000, "postgres": 5432, "redis": 6379}, "placement": where.to_json(),
            "secrets": {"airflow_db": "dbpw-airflow", "mlflow_db": "dbpw-mlflow", "admin": "adminpw",
                        "jwt_secret": "j" * 64, "api_secret_key": "k" * 64, "fernet_key": "f" * 44,
                        "redis": "redispw", "mlflow_stage": "stagepw"}}


def _layout(tmp_path: Path) -> stack.Layout:
    return stack.Layout.at(tmp_path / "team", Path("/repo"))


def test_single_machine_keeps_everything_on_loopback_unwrapped(tmp_path: Path) -> None:
    single = Placement.single()
    assert single.address == "127.0.0.1" and single.to_json() is None
    assert {s.host for s in single.sites().values()} == {None}
    assert {s.address for s in single.sites().values()} == {"127.0.0.1"}
    assert single.argv("airflow-worker-gpu", ["airflow", "celery"]) == ["airflow", "celery"]
    assert single.worker_label("gpu") == "gpu@%h"
    cmds = stack.commands(_layout(tmp_path), _state(single), "/usr/bin/redis-server")
    # the password from an owner-only config file on one machine too, never on the command line
    assert cmds["redis"][:4] == ["/usr/bin/redis-server", str(tmp_path / "team" / "redis.conf"), "--bind", "127.0.0.1"]
    assert "redispw" not in " ".join(cmds["redis"])
    assert "--allowed-hosts" not in cmds["mlflow"]
    assert cmds["airflow-worker-gpu"][cmds["airflow-worker-gpu"].index("--celery-hostname") + 1] == "gpu@%h"
    assert stack.broker_url(_state(single)) == "redis://:redispw@127.0.0.1:6379/0"


def test_two_hosts_put_the_services_on_a_and_the_gpu_worker_on_b() -> None:
    sites = TWO.sites()
    assert {name: sites[name].host for name in SERVICES} == dict.fromkeys(SERVICES, "a")
    assert {name: sites[name].address for name in SERVICES} == dict.fromkeys(SERVICES, A)
    assert sites["airflow-worker-gpu"].host == "b" and sites["airflow-worker-gpu"].address == B
    assert sites["airflow-worker-cpu"].host == "a"  # no third host: the cpu worker stays on A
    assert TWO.address == A and TWO.client_addresses() == [A, B]
    assert TWO.worker_label("gpu") == "gpu@b" and TWO.worker_label("cpu") == "cpu@a"


def test_a_third_host_takes_the_cpu_worker_and_more_hosts_stay_unused() -> None:
    assert THREE.host("airflow-worker-cpu") == "c" and THREE.host("airflow-worker-gpu") == "b"
    assert THREE.client_addresses() == [A, C, B]
    four = Placement.across(Fleet.of(4, name="sstm"))
    assert "d" not in {s.host for s in four.sites().values()}
    assert "d 10.77.0.4 (unused)" in four.describe()
    one = Placement.across(Fleet.of(1, name="sstm"))
    assert {s.host for s in one.sites().values()} == {"a"}


def test_every_process_starts_in_its_hosts_namespace_naming_the_host(tmp_path: Path) -> None:
    cmds = stack.commands(_layout(tmp_path), _state(THREE), "/usr/bin/redis-server")
    expected_host = {**dict.fromkeys(SERVICES, "a"), "airflow-worker-gpu": "b", "airflow-worker-cpu": "c"}
    assert set(cmds) == set(stack.ORDER)
    for name, argv in cmds.items():
        host = expected_host[name]
        assert argv[:6] == ["ip", "netns", "exec", f"sstm-{host}", "env", f"{HOST_ENV}={host}"], (name, argv)


def test_fleet_services_bind_a_and_nothing_wider(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    cmds = stack.commands(layout, _state(TWO), "/usr/bin/redis-server")
    redis = cmds["redis"][6:]
    assert redis[:4] == ["/usr/bin/redis-server", str(layout.root / "redis.conf"), "--bind", A]
    assert redis[redis.index("--protected-mode") + 1] == "yes"
    mlflow = cmds["mlflow"][6:]
    assert mlflow[mlflow.index("--host") + 1] == A
    assert mlflow[mlflow.index("--allowed-hosts") + 1] == f"{A}:5000,{A}"
    for worker, host in (("gpu", "b"), ("cpu", "a")):
        argv = cmds[f"airflow-worker-{worker}"]
        assert "--skip-serve-logs" in argv  # Airflow's log server would bind [::] / 0.0.0.0
        assert argv[argv.index("--celery-hostname") + 1] == f"{worker}@{host}"
    text = json.dumps(cmds)
    assert "0.0.0.0" not in text and "127.0.0.1" not in text and "localhost" not in text
    assert "redispw" not in text and "dbpw" not in text  # secrets stay off command lines


def test_every_url_a_fleet_process_gets_names_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "cluster", lambda base: postgres.Cluster(base, 0, 0))
    state = _state(TWO)
    env = stack.env(_layout(tmp_path), state)
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"postgresql+psycopg2://airflow:dbpw-airflow@{A}:5432/airflow"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:redispw@{A}:6379/0"
    assert env["MLFLOW_TRACKING_URI"] == f"http://{A}:5000"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://{A}:8080/execution/"
    assert env["AIRFLOW__API__HOST"] == A and env["AIRFLOW__API__BASE_URL"] == f"http://{A}:8080"
    assert not [k for k, v in env.items() if "127.0.0.1" in v or "localhost" in v or "0.0.0.0" in v]
    urls = stack.urls(state)
    assert urls == {"airflow": f"http://{A}:8080", "mlflow": f"http://{A}:5000", "postgres": f"{A}:5432",
                    "redis": f"redis://{A}:6379/0"}  # what status prints: no password


def test_single_machine_env_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "cluster", lambda base: postgres.Cluster(base, 0, 0))
    state = _state(Placement.single())
    del state["placement"], state["secrets"]["mlflow_stage"]  # a team.json written before placements existed
    env = stack.env(_layout(tmp_path), state)
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://:redispw@127.0.0.1:6379/0"
    assert "MLFLOW_TRACKING_USERNAME" not in env  # a team.json from before the MLflow login: none to give
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@127.0.0.1:5432/airflow")
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"


def test_placement_round_trips_through_team_json_and_bad_ones_say_so() -> None:
    assert Placement.from_json(json.loads(json.dumps(THREE.to_json()))) == THREE
    assert Placement.from_json(None) == Placement.single()
    with pytest.raises(TeamError, match="team.json: bad placement"):
        Placement.from_json({"name": "sstm", "hosts": ["A!"], "subnet": "10.77.0.0/24"})
    with pytest.raises(TeamError, match="no placement for process 'vllm'"):
        TWO.host("vllm")
    with pytest.raises(BadInput, match="--fleet sstm --hosts 9"):
        fleet_placement("sstm", 9)


@pytest.mark.parametrize("args, named", [
    (["up", "--fleet", "sstm", "--hosts", "0"], "--fleet sstm --hosts 0"),
    (["trigger", "syncsafe_nightly", "--wait", "--timeout-s", "0"], "--timeout-s: expected a positive number"),
    (["trigger", "syncsafe_nightly", "--timeout-s", "-5"], "--timeout-s: expected a positive number"),
    (["trigger", "syncsafe_nightly", "--timeout-s", "nan"], "--timeout-s: expected a positive number"),
])
def test_bad_team_options_are_one_line_and_exit_2_before_anything_starts(tmp_path: Path, args, named) -> None:
    from typer.testing import CliRunner

    from syncsafe.team.__main__ import app

    state = tmp_path / "team"
    result = CliRunner().invoke(app, [*args, "--dir", str(state)])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and named in result.output
    assert not state.exists()  # refused before the state folder was made or a service asked


def test_postgres_on_a_fleet_host_lets_in_the_fleet_hosts_only(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert postgres.hba_lines([A, B]) == ["local all all trust", f"host all all {A}/32 scram-sha-256",
                                          f"host all all {B}/32 scram-sha-256"]
    calls: list[list[str]] = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        assert "user" not in kw  # entering a namespace needs root: the switch to the cluster's user is setpriv
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(postgres, "bindir", lambda: Path("/pg/bin"))
    monkeypatch.setattr(postgres.subprocess, "run", fake_run)
    monkeypatch.setattr(postgres.os, "chown", lambda *a: None)
    c = postgres.Cluster(tmp_path, uid=12345, gid=12345)
    postgres.start(c, 5432, listen=A, clients=[A, B], wrap=lambda cmd: TWO.argv("postgres", cmd))
    (cmd,) = calls
    assert cmd[:6] == ["ip", "netns", "exec", "sstm-a", "env", f"{HOST_ENV}=a"]
    assert cmd[6:11] == ["setpriv", "--reuid=12345", "--regid=12345", "--clear-groups", "--"]
    options = cmd[cmd.index("-o") + 1]
    assert f"listen_addresses={A} " in options and f"hba_file={c.fleet_hba}" in options
    assert c.fleet_hba.read_text().splitlines() == postgres.hba_lines([A, B])
    assert oct(c.fleet_hba.stat().st_mode & 0o777) == "0o600"
    assert c.url("mlflow", "pw", 5432, "mlflow", host=A) == f"postgresql+psycopg2://mlflow:pw@{A}:5432/mlflow"


def test_airflow_client_makes_every_request_through_the_placement() -> None:
    seen: list[str] = []

    def call(fn, req, timeout_s):
        seen.append(req.full_url)
        return json.dumps({"metadatabase": {"status": "healthy"}})

    client = af.AirflowClient(f"http://{A}:8080", "pw", call=call)
    assert client.health()["metadatabase"]["status"] == "healthy"
    assert seen == [f"http://{A}:8080/api/v2/monitor/health"]


def test_worker_hostname_names_the_fleet_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hostname.HOST_ENV == HOST_ENV
    monkeypatch.setenv(hostname.WORKER_ENV, "gpu")
    monkeypatch.setenv(HOST_ENV, "b")
    assert hostname.worker_hostname() == "gpu@b"
    monkeypatch.delenv(HOST_ENV)
    assert hostname.worker_hostname() == f"gpu@{__import__('socket').gethostname()}"


def test_calling_into_a_missing_namespace_is_one_line_naming_it() -> None:
    with pytest.raises(TeamError, match=r"^network namespace sstm-nowhere not found \(/run/netns/sstm-nowhere\)"):
        call_in("sstm-nowhere", lambda: None)
    assert Placement.single().call(lambda x: x + 1, 1) == 2


def test_status_env_writes_the_settings_owner_only_and_prints_only_their_path(tmp_path: Path) -> None:
    """`status --env` used to print every Airflow setting, the metadata DB's password, the broker's and the
    signing keys among them, to stdout (terminals and CI logs keep it)."""
    import stat

    from typer.testing import CliRunner

    from syncsafe.team.__main__ import app

    layout = _layout(tmp_path)
    layout.root.mkdir(parents=True)
    state = _state(Placement.single())
    state["secrets"]["fernet_key"] = "f$(touch pwned)'" + "f" * 28  # nothing in a value may expand when sourced
    stack.save(layout, state)
    result = CliRunner().invoke(app, ["status", "--env", "--dir", str(layout.root)])
    assert result.exit_code == 0, result.output
    path = layout.root / stack.ENV_FILE
    assert result.output.strip().endswith(f". {path}") and stat.S_IMODE(path.stat().st_mode) == 0o600
    for secret in state["secrets"].values():
        assert secret not in result.output
    sourced = subprocess.run(["bash", "-c", f'set -e; . "{path}"; printf %s "$AIRFLOW__CORE__FERNET_KEY"'],
                             capture_output=True, text=True, cwd=tmp_path, check=True)
    assert sourced.stdout == state["secrets"]["fernet_key"] and not (tmp_path / "pwned").exists()
    assert stack.env(layout, state)["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] in path.read_text()
