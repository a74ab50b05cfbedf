"""Bring the team setup up, down, or report on it (see :mod:`syncsafe.team`).

``up`` starts, in order: PostgreSQL (cluster and databases made on the first
``up``), Redis, the MLflow server, ``airflow db migrate`` and the ``gpu`` pool,
then the api-server, scheduler, dag-processor and both Celery workers; it
returns when each answers (the API's health check reports the scheduler and the
DAG processor healthy, each worker has joined the broker). Ports: Airflow 8080,
MLflow 5000, PostgreSQL 5432, Redis 6379 when free (else any free port; with
``preferred_ports=False`` always a free one), all on 127.0.0.1. Redis asks for
a password (from an owner-only config file, never the command line), which only
the Airflow processes' broker URL holds. A part that fails to start, or a
SIGTERM while starting, stops everything started so far.

With a fleet placement (:mod:`syncsafe.team.placement`) the same processes are
spread over test hosts: the services on host A, bound to A's address, the
workers on the other hosts, each started in its host's namespace; PostgreSQL lets in
only the fleet hosts' addresses, and ``down`` also reports any process left in
the fleet's namespaces.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncsafe.io import write_json, write_text
from syncsafe.procs import LOOPBACK, log_tail
from syncsafe.team import airflow as af
from syncsafe.team import daemons, mlflow_auth, postgres
from syncsafe.team.daemons import TeamError
from syncsafe.team.placement import Placement, check_fleet

REPO = Path(__file__).resolve().parents[3]
STATE = "team.json"
REDIS_CONF = "redis.conf"
MLFLOW_AUTH_CONF = "mlflow-auth.ini"
#: The Airflow settings as shell exports (`status --env`), owner-only.
ENV_FILE = "airflow.env"
#: The MLflow server's users: its admin (the setup's own), and the one every stage process logs as.
MLFLOW_ADMIN, MLFLOW_STAGE_USER = "admin", "stage"
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


def admin_password_file(layout: Layout) -> Path:
    """Airflow's password file (simple auth manager): the admin password, owner-only."""
    return layout.airflow_home / "passwords.json"


def _secrets(old: Mapping[str, str]) -> dict[str, str]:
    new = {
        "airflow_db": secrets.token_hex(16),
        "mlflow_db": secrets.token_hex(16),
        "admin": secrets.token_urlsafe(16),
        "jwt_secret": secrets.token_hex(32),
        "api_secret_key": secrets.token_hex(32),
        "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "redis": secrets.token_hex(16),
        "mlflow_auth_db": secrets.token_hex(16),
        "mlflow_admin": secrets.token_urlsafe(16),
        "mlflow_stage": secrets.token_urlsafe(16),
        "mlflow_flask": secrets.token_hex(32),
    }
    return {**new, **old}


def placement(state: Mapping[str, Any]) -> Placement:
    """Where the setup's processes run (saved in ``team.json``; absent: one machine)."""
    return Placement.from_json(state.get("placement"))


def urls(state: Mapping[str, Any]) -> dict[str, str]:
    """The services' URLs (without passwords: what ``status`` prints), all on the services' address."""
    ports, addr = state["ports"], placement(state).address
    return {
        "airflow": f"http://{addr}:{ports['airflow']}",
        "mlflow": f"http://{addr}:{ports['mlflow']}",
        "postgres": f"{addr}:{ports['postgres']}",
        "redis": f"redis://{addr}:{ports['redis']}/0",
    }


def broker_url(state: Mapping[str, Any]) -> str:
    """Celery's broker URL with Redis's password (only in the Airflow processes' environment, never a stage's:
    syncsafe.stage_env)."""
    return urls(state)["redis"].replace("redis://", f"redis://:{state['secrets']['redis']}@", 1)


def env(layout: Layout, state: Mapping[str, Any]) -> dict[str, str]:
    """The Airflow configuration of this setup (what ``status --env`` writes for a shell, `write_env_file`)."""
    c = postgres.cluster(layout.pg)
    s, p, addr = state["secrets"], state["ports"], placement(state).address
    return af.airflow_env(
        home=layout.airflow_home, repo=layout.repo, work_dir=layout.work_dir,
        metadata_url=c.url("airflow", s["airflow_db"], p["postgres"], "airflow", host=addr),
        broker_url=broker_url(state), api_port=p["airflow"], mlflow_url=urls(state)["mlflow"],
        mlflow_login=(MLFLOW_STAGE_USER, s["mlflow_stage"]) if "mlflow_stage" in s else None,  # older team.json
        secrets=s, scheduled=state.get("scheduled", False), extra=state.get("extra_env", {}), api_host=addr,
    )


def write_env_file(layout: Layout, state: Mapping[str, Any]) -> Path:
    """`env` as shell exports (values single-quoted: nothing in them expands) in an owner-only file of the state
    folder, for a shell to source: the settings carry the metadata DB's password, the broker's and the signing
    keys, so they are never printed."""
    path = layout.root / ENV_FILE
    write_text(path, "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env(layout, state).items()),
               mode=0o600)
    return path


def commands(layout: Layout, state: Mapping[str, Any], redis: str = "redis-server") -> dict[str, list[str]]:
    """Every long-running process (``ORDER``), its command line as started on its host: services bound to
    the services' address, on a fleet wrapped to run in their host's namespace (no side effects)."""
    where, ports = placement(state), state["ports"]
    addr, fleet = where.address, where.fleet is not None
    # Redis requires a password (any local user could read or rewrite the broker's queues otherwise; on a fleet
    # protected mode also refuses other hosts without one): read from an owner-only file, never argv
    conf = [str(layout.root / REDIS_CONF)]
    # on a fleet only A's address:port is a Host the MLflow server answers (its default: every private address)
    hosts = ["--allowed-hosts", f"{addr}:{ports['mlflow']},{addr}"] if fleet else []
    out = {
        "redis": [redis, *conf, "--bind", addr, "--port", str(ports["redis"]), "--save", "", "--appendonly", "no",
                  "--dir", str(layout.root), "--protected-mode", "yes"],
        "mlflow": [str(layout.mlflow), "server", "--app-name", "basic-auth", "--host", addr, "--port",
                   str(ports["mlflow"]), *hosts,
                   "--workers", "2", "--artifacts-destination", str(layout.artifacts)],
        **af.commands(layout.airflow, {w: where.worker_label(w) for w in af.WORKERS}),
    }
    return {name: where.argv(name, out[name]) for name in ORDER}


#: What marks a state folder `team up` made (or adopted empty): the only kind it writes into or changes.
MARKER = ".syncsafe-team"


def own_state_folder(root: Path, service_gid: int) -> None:
    """Make `root` the setup's state folder, or refuse one that `team up` did not make.

    A new folder is made 0700 (0750 with group `service_gid` when that is not this process's group: PostgreSQL's
    own user must reach its cluster inside it); so is an empty private one (this user's, nothing for others: what
    `mktemp -d` makes), taken over. A folder holding anything but no marker (`/tmp`, a home, a checkout) and an
    empty one others may use (a sticky 1777 drop folder, a 0755 one) are refused, never re-moded."""
    if root.exists() and not (root / MARKER).is_file() and not (root / STATE).is_file():  # STATE: an older up's
        if not root.is_dir() or any(root.iterdir()):
            raise TeamError(f"{root} exists and was not made by `team up` (no {MARKER} in it): name a new or "
                            "empty folder for --dir / SYNCSAFE_TEAM_DIR; team up makes it, mode 0700")
        info = root.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o7007:
            raise TeamError(f"{root} is an empty folder others may use (mode {info.st_mode & 0o7777:04o}, owner uid "
                            f"{info.st_uid}): team up would make it private; name a new folder for --dir / "
                            "SYNCSAFE_TEAM_DIR (team up makes it, mode 0700) or an empty one of yours, mode 0700")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (root / MARKER).is_file():
        if service_gid != os.getgid():
            os.chown(root, -1, service_gid)
        os.chmod(root, 0o750 if service_gid != os.getgid() else 0o700)
        (root / MARKER).write_text("a syncsafe team setup's state folder (scripts/team.sh up)\n")


def up(layout: Layout, *, scheduled: bool = False, preferred_ports: bool = True,
       extra_env: Mapping[str, str] | None = None, timeout_s: float = 600,
       where: Placement = Placement.single()) -> dict[str, Any]:
    """Start everything (``where``: on this machine, or spread over a fleet that is up); returns the saved
    state. Already up: an error naming the state file."""
    old = load(layout)
    if any(daemons.process(r) for r in old.get("processes", {}).values()):
        raise TeamError(f"the team setup in {layout.root} is already up (scripts/team.sh down first)")
    for tool in (layout.airflow, layout.mlflow):
        if not tool.exists():
            raise TeamError(f"{tool} not found: run `make team-env`")
    redis = _which("redis-server")
    check_fleet(where)
    own_state_folder(layout.root, postgres.cluster(layout.pg).gid)
    state: dict[str, Any] = {
        "root": str(layout.root), "repo": str(layout.repo), "scheduled": scheduled,
        "extra_env": dict(extra_env or {}), "secrets": _secrets(old.get("secrets", {})), "processes": {},
        "placement": where.to_json(),
        "ports": {k: where.call(daemons.pick_port, v if preferred_ports else None, where.address)
                  for k, v in PREFERRED.items()},
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
    where = placement(state)
    addr, fleet = where.address, where.fleet is not None
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_"))}

    def started(name: str, cmd: list[str], env: Mapping[str, str]) -> dict:
        procs[name] = daemons.start(name, cmd, env=env, log=layout.logs / f"{name}.log", cwd=layout.root)
        save(layout, state)
        return procs[name]

    c = postgres.cluster(layout.pg)
    postgres.init(c)
    state["postgres_pid"] = postgres.start(
        c, ports["postgres"], listen=addr, clients=where.client_addresses(tuple(af.WORKERS)) if fleet else (),
        wrap=(lambda cmd: where.argv("postgres", cmd)) if fleet else None)
    save(layout, state)
    for db in ("airflow", "mlflow", "mlflow_auth"):
        postgres.ensure_database(c, ports["postgres"], db, s[f"{db}_db"])

    cmds = commands(layout, state, redis)
    _write_redis_config(layout, state)
    rec = started("redis", cmds["redis"], base_env)
    daemons.wait_until(lambda: where.call(_redis_ping, ports["redis"], addr, s["redis"]), what="redis",
                       timeout_s=60, record=rec)

    layout.artifacts.mkdir(parents=True, exist_ok=True)
    # the store URI holds the role's password: through the environment, never the command line (ps, logs); the
    # basic-auth app's users, admin password and database URI: an owner-only file
    store = {"MLFLOW_BACKEND_STORE_URI": c.url("mlflow", s["mlflow_db"], ports["postgres"], "mlflow", host=addr),
             "MLFLOW_AUTH_CONFIG_PATH": str(_write_mlflow_auth_config(layout, state, c)),
             "MLFLOW_FLASK_SERVER_SECRET_KEY": s["mlflow_flask"]}
    # no job runner: its seven huey consumers serve MLflow's GenAI jobs, which nothing here submits
    rec = started("mlflow", cmds["mlflow"], {**base_env, **store, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    daemons.wait_until(lambda: where.call(daemons.http_ok, urls(state)["mlflow"] + "/health"), what="mlflow server",
                       timeout_s=timeout_s, record=rec)
    where.call(mlflow_auth.ensure_user, urls(state)["mlflow"], (MLFLOW_ADMIN, s["mlflow_admin"]),
               (MLFLOW_STAGE_USER, s["mlflow_stage"]))

    aenv = {**base_env, **env(layout, state)}
    layout.airflow_home.mkdir(parents=True, exist_ok=True)
    write_json(admin_password_file(layout), {af.ADMIN: s["admin"]}, mode=0o600)
    _airflow_cli(layout, aenv, ["db", "migrate"], timeout_s, where)
    _airflow_cli(layout, aenv, ["pools", "set", af.GPU_POOL, "1", "GPU nodes for syncsafe train and replay_vllm"],
                 timeout_s, where)
    study_pool = aenv.get("SYNCSAFE_STUDY_POOL", af.STUDY_POOL)
    _airflow_cli(layout, aenv, ["pools", "set", study_pool, str(af.study_slots(aenv)),
                                "points of syncsafe_study runs, CPU and GPU together"], timeout_s, where)
    for name in ORDER[2:]:
        worker = name.removeprefix("airflow-worker-")
        started(name, cmds[name], af.worker_env(aenv, worker, layout.repo / "src") if worker in af.WORKERS else aenv)
    client = af.AirflowClient(urls(state)["airflow"], s["admin"], call=where.call)
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


def _write_redis_config(layout: Layout, state: Mapping[str, Any]) -> None:
    """Redis's password in a file only the owner reads (never on the command line)."""
    conf = layout.root / REDIS_CONF
    conf.touch(mode=0o600)
    os.chmod(conf, 0o600)
    conf.write_text(f"requirepass {state['secrets']['redis']}\n")


def _write_mlflow_auth_config(layout: Layout, state: Mapping[str, Any], c: postgres.Cluster) -> Path:
    """The MLflow basic-auth app's settings (its user store on PostgreSQL, the admin's password), owner-only."""
    s, addr = state["secrets"], placement(state).address
    conf = layout.root / MLFLOW_AUTH_CONF
    users = c.url("mlflow_auth", s["mlflow_auth_db"], state["ports"]["postgres"], "mlflow_auth", host=addr)
    write_text(conf, mlflow_auth.config(users, MLFLOW_ADMIN, s["mlflow_admin"]), mode=0o600)
    return conf


def _redis_ping(port: int, address: str = LOOPBACK, password: str | None = None) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as sock:
            sock.sendall((f"AUTH {password}\r\n" if password else "").encode() + b"PING\r\n")
            reply = b""
            while reply.count(b"\r\n") < (2 if password else 1):
                chunk = sock.recv(64)
                if not chunk:
                    break
                reply += chunk
            return reply.endswith(b"+PONG\r\n")
    except OSError:
        return False


def _healthy(client: af.AirflowClient) -> bool:
    try:
        health = client.health()
    except (TeamError, OSError, ValueError):
        return False
    return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler", "dag_processor"))


def _airflow_cli(layout: Layout, env: Mapping[str, str], args: list[str], timeout_s: float,
                 where: Placement) -> None:
    log = layout.logs / "airflow-cli.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n=== airflow {' '.join(args)}\n")
        out.flush()
        done = subprocess.run(where.argv("airflow-scheduler", [str(layout.airflow), *args]), env=dict(env),
                              cwd=layout.root, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout_s)
    if done.returncode != 0:
        raise TeamError(f"airflow {' '.join(args)} failed (exit {done.returncode}); log {log}:\n{log_tail(log)}")


def down(layout: Layout) -> list[str]:
    """Stop everything this setup started; returns what is left (processes, listening ports), normally nothing."""
    state = load(layout)
    if not state:
        return []
    where = placement(state)
    procs = state.get("processes", {})
    left = daemons.stop([procs[n] for n in reversed(ORDER) if n in procs and n.startswith("airflow")])
    left += daemons.stop([procs[n] for n in ("mlflow", "redis") if n in procs])
    c = postgres.cluster(layout.pg)
    postgres.stop(c)
    if state.get("postgres_pid"):
        left += daemons.stop([r for r in [_record(state["postgres_pid"])] if r])
    state["processes"], state["postgres_pid"] = {}, 0
    save(layout, state)
    left += [f"port {p} ({name}) still listening on {where.address}" for name, p in state.get("ports", {}).items()
             if _still_listening(where, p)]
    return left + _left_on_hosts(where)


def _still_listening(where: Placement, port: int) -> bool:
    try:
        return where.call(daemons.listening, port, where.address)
    except TeamError:  # the fleet's namespaces are gone, and whatever listened there with them
        return False


def _left_on_hosts(where: Placement) -> list[str]:
    """Processes still running in the fleet's host namespaces (none after a clean ``down``)."""
    if where.fleet is None:
        return []
    from syncsafe.fleet import netns

    left = []
    for host in where.fleet.hosts:
        for pid in netns.pids(where.fleet.namespace(host)):
            left.append(f"pid {pid} ({_record_name(pid)}) still running on host {host}")
    return left


def _record_name(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return "?"


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
    where = placement(state)
    parts = {name: {"running": daemons.process(r) is not None, "log": r["log"], "host": where.host(name)}
             for name, r in state.get("processes", {}).items()}
    parts["postgres"] = {"running": bool(state.get("postgres_pid")) and _record(state["postgres_pid"]) is not None,
                         "log": str(postgres.cluster(layout.pg).log), "host": where.host("postgres")}
    return {"root": str(layout.root), "up": all(p["running"] for p in parts.values()) and len(parts) > 1,
            "urls": urls(state) if "ports" in state else {}, "parts": parts, "placement": where.describe(),
            "admin_password": state["secrets"]["admin"]}


def client(layout: Layout) -> af.AirflowClient:
    state = load(layout)
    if not state.get("processes"):
        raise TeamError(f"the team setup in {layout.root} is not up (scripts/team.sh up)")
    return af.AirflowClient(urls(state)["airflow"], state["secrets"]["admin"], call=placement(state).call)
