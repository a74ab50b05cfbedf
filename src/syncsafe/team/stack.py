"""Bring the team setup up, down, or report on it (see :mod:`syncsafe.team`).

``up`` starts, in order: PostgreSQL (cluster and databases made on the first
``up``), Redis, the MLflow server, ``airflow db migrate`` and the ``gpu`` pool,
then the api-server, scheduler, dag-processor and both Celery workers; it
returns when each answers (the API's health check reports the scheduler and the
DAG processor healthy, each worker has joined the broker). Ports: Airflow 8080,
MLflow 5000, PostgreSQL 5432, Redis 6379 when free (else any free port; with
``preferred_ports=False`` always a free one), all on 127.0.0.1. A part that
fails to start stops everything started so far.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncsafe.io import write_json
from syncsafe.procs import LOOPBACK, log_tail
from syncsafe.team import airflow as af
from syncsafe.team import daemons, postgres
from syncsafe.team.daemons import TeamError

REPO = Path(__file__).resolve().parents[3]
STATE = "team.json"
PREFERRED = {"airflow": 8080, "mlflow": 5000, "postgres": 5432, "redis": 6379}
#: Start order; ``down`` stops in reverse.
ORDER = ("redis", "mlflow", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
         "airflow-worker-cpu", "airflow-worker-gpu")


@dataclass(frozen=True)
class Layout:
    """The state folder of one team setup."""

    root: Path
    repo: Path = REPO

    @classmethod
    def at(cls, root: str | os.PathLike[str] | None = None, repo: Path = REPO) -> Layout:
        chosen = root or os.environ.get("SYNCSAFE_TEAM_DIR") or repo / ".team"
        return cls(Path(chosen).resolve(), repo)

    state = property(lambda self: self.root / STATE)
    logs = property(lambda self: self.root / "logs")
    pg = property(lambda self: self.root / "pg")
    airflow_home = property(lambda self: self.root / "airflow")
    work_dir = property(lambda self: self.root / "runs")
    artifacts = property(lambda self: self.root / "mlartifacts")
    airflow = property(lambda self: self.repo / ".venv-airflow" / "bin" / "airflow")
    mlflow = property(lambda self: self.repo / ".venv" / "bin" / "mlflow")


def load(layout: Layout) -> dict[str, Any]:
    try:
        return json.loads(layout.state.read_text())
    except FileNotFoundError:
        return {}


def save(layout: Layout, state: Mapping[str, Any]) -> None:
    write_json(layout.state, dict(state), mode=0o600)  # role passwords and secrets: owner-only from creation on


def _secrets(old: Mapping[str, str]) -> dict[str, str]:
    new = {
        "airflow_db": secrets.token_hex(16),
        "mlflow_db": secrets.token_hex(16),
        "admin": secrets.token_urlsafe(16),
        "jwt_secret": secrets.token_hex(32),
        "api_secret_key": secrets.token_hex(32),
        "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
    }
    return {**new, **old}


def urls(state: Mapping[str, Any]) -> dict[str, str]:
    ports = state["ports"]
    return {
        "airflow": f"http://{LOOPBACK}:{ports['airflow']}",
        "mlflow": f"http://{LOOPBACK}:{ports['mlflow']}",
        "postgres": f"{LOOPBACK}:{ports['postgres']}",
        "redis": f"redis://{LOOPBACK}:{ports['redis']}/0",
    }


def env(layout: Layout, state: Mapping[str, Any]) -> dict[str, str]:
    """The Airflow configuration of this setup (what ``status --env`` prints for a shell)."""
    c = postgres.cluster(layout.pg)
    s, p = state["secrets"], state["ports"]
    return af.airflow_env(
        home=layout.airflow_home, repo=layout.repo, work_dir=layout.work_dir,
        metadata_url=c.url("airflow", s["airflow_db"], p["postgres"], "airflow"),
        broker_url=urls(state)["redis"], api_port=p["airflow"], mlflow_url=urls(state)["mlflow"],
        secrets=s, scheduled=state.get("scheduled", False), extra=state.get("extra_env", {}),
    )


def up(layout: Layout, *, scheduled: bool = False, preferred_ports: bool = True,
       extra_env: Mapping[str, str] | None = None, timeout_s: float = 600) -> dict[str, Any]:
    """Start everything; returns the saved state. Already up: an error naming the state file."""
    old = load(layout)
    if any(daemons.process(r) for r in old.get("processes", {}).values()):
        raise TeamError(f"the team setup in {layout.root} is already up (scripts/team.sh down first)")
    for tool in (layout.airflow, layout.mlflow):
        if not tool.exists():
            raise TeamError(f"{tool} not found: run `make team-env`")
    redis = _which("redis-server")
    layout.root.mkdir(parents=True, exist_ok=True)
    os.chmod(layout.root, 0o755)
    state: dict[str, Any] = {
        "root": str(layout.root), "repo": str(layout.repo), "scheduled": scheduled,
        "extra_env": dict(extra_env or {}), "secrets": _secrets(old.get("secrets", {})), "processes": {},
        "ports": {k: daemons.pick_port(v if preferred_ports else None) for k, v in PREFERRED.items()},
    }
    save(layout, state)
    try:
        _start_all(layout, state, redis, timeout_s)
    except BaseException:
        down(layout)
        raise
    return state


def _start_all(layout: Layout, state: dict[str, Any], redis: str, timeout_s: float) -> None:
    ports, s, procs = state["ports"], state["secrets"], state["processes"]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_"))}

    def started(name: str, cmd: list[str], env: Mapping[str, str]) -> dict:
        procs[name] = daemons.start(name, cmd, env=env, log=layout.logs / f"{name}.log", cwd=layout.root)
        save(layout, state)
        return procs[name]

    c = postgres.cluster(layout.pg)
    postgres.init(c)
    state["postgres_pid"] = postgres.start(c, ports["postgres"])
    save(layout, state)
    for db in ("airflow", "mlflow"):
        postgres.ensure_database(c, ports["postgres"], db, s[f"{db}_db"])

    rec = started("redis", [redis, "--bind", LOOPBACK, "--port", str(ports["redis"]), "--save", "",
                            "--appendonly", "no", "--dir", str(layout.root), "--protected-mode", "yes"], base_env)
    daemons.wait_until(lambda: _redis_ping(ports["redis"]), what="redis", timeout_s=60, record=rec)

    layout.artifacts.mkdir(parents=True, exist_ok=True)
    # the store URI holds the role's password: through the environment, never the command line (ps, logs)
    store = {"MLFLOW_BACKEND_STORE_URI": c.url("mlflow", s["mlflow_db"], ports["postgres"], "mlflow")}
    rec = started("mlflow", [str(layout.mlflow), "server", "--host", LOOPBACK, "--port", str(ports["mlflow"]),
                             "--workers", "2", "--artifacts-destination", str(layout.artifacts)], {**base_env, **store})
    daemons.wait_until(lambda: daemons.http_ok(urls(state)["mlflow"] + "/health"), what="mlflow server",
                       timeout_s=timeout_s, record=rec)

    aenv = {**base_env, **env(layout, state)}
    layout.airflow_home.mkdir(parents=True, exist_ok=True)
    write_json(layout.airflow_home / "passwords.json", {af.ADMIN: s["admin"]}, mode=0o600)
    _airflow_cli(layout, aenv, ["db", "migrate"], timeout_s)
    _airflow_cli(layout, aenv, ["pools", "set", af.GPU_POOL, "1", "GPU nodes for syncsafe train and replay_vllm"],
                 timeout_s)
    for name, cmd in af.commands(layout.airflow).items():
        worker = name.removeprefix("airflow-worker-")
        started(name, cmd, af.worker_env(aenv, worker, layout.repo / "src") if worker in af.WORKERS else aenv)
    client = af.AirflowClient(urls(state)["airflow"], s["admin"])
    daemons.wait_until(lambda: _healthy(client), what="airflow api-server, scheduler and dag-processor",
                       timeout_s=timeout_s, record=procs["airflow-api-server"])
    for worker in af.WORKERS:
        rec = procs[f"airflow-worker-{worker}"]
        daemons.wait_until(lambda rec=rec: " ready." in Path(rec["log"]).read_text(errors="replace"),
                           what=f"celery worker {worker}", timeout_s=timeout_s, record=rec)


def _which(name: str) -> str:
    from shutil import which

    found = which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not found:
        raise TeamError(f"{name} not found: run `make team-env` (apt-get install redis-server)")
    return found


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _healthy(client: af.AirflowClient) -> bool:
    try:
        health = client.health()
    except (TeamError, OSError, ValueError):
        return False
    return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler", "dag_processor"))


def _airflow_cli(layout: Layout, env: Mapping[str, str], args: list[str], timeout_s: float) -> None:
    log = layout.logs / "airflow-cli.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n=== airflow {' '.join(args)}\n")
        out.flush()
        done = subprocess.run([str(layout.airflow), *args], env=dict(env), cwd=layout.root, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout_s)
    if done.returncode != 0:
        raise TeamError(f"airflow {' '.join(args)} failed (exit {done.returncode}); log {log}:\n{log_tail(log)}")


def down(layout: Layout) -> list[str]:
    """Stop everything this setup started; returns what is left (processes, listening ports), normally nothing."""
    state = load(layout)
    if not state:
        return []
    procs = state.get("processes", {})
    left = daemons.stop([procs[n] for n in reversed(ORDER) if n in procs and n.startswith("airflow")])
    left += daemons.stop([procs[n] for n in ("mlflow", "redis") if n in procs])
    c = postgres.cluster(layout.pg)
    postgres.stop(c)
    if state.get("postgres_pid"):
        left += daemons.stop([r for r in [_record(state["postgres_pid"])] if r])
    state["processes"], state["postgres_pid"] = {}, 0
    save(layout, state)
    left += [f"port {p} ({name}) still listening" for name, p in state.get("ports", {}).items() if daemons.listening(p)]
    return left


def _record(pid: int) -> dict | None:
    import psutil

    try:
        return {"pid": pid, "started": psutil.Process(pid).create_time(), "log": ""}
    except psutil.Error:
        return None


def status(layout: Layout) -> dict[str, Any]:
    """Each part: running or not, its URL or port, its log."""
    state = load(layout)
    if not state:
        return {"root": str(layout.root), "up": False, "parts": {}}
    parts = {name: {"running": daemons.process(r) is not None, "log": r["log"]}
             for name, r in state.get("processes", {}).items()}
    parts["postgres"] = {"running": bool(state.get("postgres_pid")) and _record(state["postgres_pid"]) is not None,
                         "log": str(postgres.cluster(layout.pg).log)}
    return {"root": str(layout.root), "up": all(p["running"] for p in parts.values()) and len(parts) > 1,
            "urls": urls(state) if "ports" in state else {}, "parts": parts, "admin_password": state["secrets"]["admin"]}


def client(layout: Layout) -> af.AirflowClient:
    state = load(layout)
    if not state.get("processes"):
        raise TeamError(f"the team setup in {layout.root} is not up (scripts/team.sh up)")
    return af.AirflowClient(urls(state)["airflow"], state["secrets"]["admin"])
