"""A private PostgreSQL cluster from Debian's ``postgresql`` package, on one address only.

``initdb`` makes the cluster in ``<state>/pg/data``; ``pg_ctl`` starts the
server with ``listen_addresses=127.0.0.1`` (on a fleet: the services host's
address, started inside that host's namespace, with an ``hba_file`` that lets
in only the fleet hosts' addresses), the chosen port and its Unix
socket in ``<state>/pg/run`` (mode 0700). PostgreSQL refuses to run as root:
started as root, every cluster command runs as the ``postgres`` system user
(Debian's package makes it; ``syncsafe-pg`` is created when it is missing),
which must be able to reach the state folder. Local socket connections are
trusted (only that user and root can open the socket); TCP connections need
the role passwords kept in ``team.json``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from syncsafe.procs import LOOPBACK
from syncsafe.team.daemons import TeamError

SERVICE_USERS = ("postgres", "syncsafe-pg")
SUPERUSER = "postgres"


@dataclass(frozen=True)
class Cluster:
    """Where the cluster lives and who runs it."""

    base: Path  # <state>/pg
    uid: int
    gid: int

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base / "run"

    @property
    def log(self) -> Path:
        return self.base / "postgres.log"

    @property
    def fleet_hba(self) -> Path:
        """The client authentication file of a cluster serving fleet hosts (written on each start)."""
        return self.base / "pg_hba.fleet.conf"

    def url(self, role: str, password: str, port: int, db: str, driver: str = "postgresql+psycopg2",
            host: str = LOOPBACK) -> str:
        return f"{driver}://{role}:{password}@{host}:{port}/{db}"


def bindir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (Debian's layout), else initdb's folder on PATH."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: _version(p.parent.parent.name))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise TeamError("PostgreSQL not found (no /usr/lib/postgresql/*/bin/initdb): run `make team-env` "
                    "(apt-get install postgresql)")


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split(".") if x.isdigit())


def cluster(base: Path) -> Cluster:
    """The cluster under ``base``, owned by the service user (root) or by this user."""
    if os.geteuid() != 0:
        return Cluster(base, os.getuid(), os.getgid())
    for name in SERVICE_USERS:
        try:
            entry = pwd.getpwnam(name)
            return Cluster(base, entry.pw_uid, entry.pw_gid)
        except KeyError:
            continue
    done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                           SERVICE_USERS[-1]], capture_output=True, text=True)
    if done.returncode != 0:
        raise TeamError(f"could not create the system user {SERVICE_USERS[-1]!r} for PostgreSQL: {done.stderr.strip()}")
    entry = pwd.getpwnam(SERVICE_USERS[-1])
    return Cluster(base, entry.pw_uid, entry.pw_gid)


def run(c: Cluster, cmd: list[str], check: bool = True, timeout: float = 180,
        wrap: Callable[[list[str]], list[str]] | None = None, stdin: str | None = None,
        secrets: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """A cluster command as the cluster's user; ``wrap`` (as root) runs it on a fleet host: ``wrap`` gets the
    command already switching to that user (``setpriv``), since entering a namespace needs root. ``stdin``
    is its input; every one of ``secrets`` is blanked out of a failure's text."""
    as_user = {} if c.uid == os.getuid() else {"user": c.uid, "group": c.gid, "extra_groups": []}
    env = {"PATH": f"{bindir()}:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "HOME": str(c.base)}
    if wrap is not None:
        if as_user:
            cmd = ["setpriv", f"--reuid={c.uid}", f"--regid={c.gid}", "--clear-groups", "--", *cmd]
        cmd, as_user = wrap(cmd), {}
    done = subprocess.run(cmd, cwd=c.base, env=env, capture_output=True, text=True, timeout=timeout, input=stdin,
                          **as_user)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        for secret in secrets:
            said = said.replace(secret, "***")
        raise TeamError(f"{Path(cmd[0]).name} failed (exit {done.returncode}): {said[-2000:]}")
    return done


def init(c: Cluster) -> bool:
    """Create the cluster unless it exists; returns True when it was created."""
    c.base.mkdir(parents=True, exist_ok=True)
    for path in (c.base, c.socket_dir):
        path.mkdir(exist_ok=True)
        os.chown(path, c.uid, c.gid)
    os.chmod(c.socket_dir, 0o700)
    if run(c, ["test", "-w", str(c.base)], check=False).returncode != 0:
        raise TeamError(f"the PostgreSQL user (uid {c.uid}) cannot write {c.base}: a folder above it is closed to "
                        "other users; choose a state folder it can reach (--dir or SYNCSAFE_TEAM_DIR)")
    if (c.data / "PG_VERSION").exists():
        return False
    run(c, [str(bindir() / "initdb"), "-D", str(c.data), "-U", SUPERUSER, "-E", "UTF8", "--auth-local=trust",
            "--auth-host=scram-sha-256", "--no-instructions"])
    return True


def start(c: Cluster, port: int, listen: str = LOOPBACK, clients: Sequence[str] = (),
          wrap: Callable[[list[str]], list[str]] | None = None) -> int:
    """Start the server on ``listen``:``port`` (``wrap``: on a fleet host); returns the postmaster's pid.

    With ``clients`` (addresses), TCP connections are let in from those addresses only (password
    checked), through an ``hba_file`` of its own; without, the cluster's ``pg_hba.conf`` (loopback)."""
    options = (f"-c listen_addresses={listen} -c port={port} -c unix_socket_directories={c.socket_dir} "
               "-c max_connections=200")
    if clients:
        write_hba(c, clients)
        options += f" -c hba_file={c.fleet_hba}"
    run(c, [str(bindir() / "pg_ctl"), "-D", str(c.data), "-l", str(c.log), "-w", "-t", "120", "-o", options, "start"],
        wrap=wrap)
    return postmaster_pid(c)


def hba_lines(clients: Sequence[str]) -> list[str]:
    """Local socket connections trusted (the cluster's user and root only); TCP from each of ``clients``
    (one address each, /32), with a password."""
    return ["local all all trust", *(f"host all all {address}/32 scram-sha-256" for address in clients)]


def write_hba(c: Cluster, clients: Sequence[str]) -> None:
    c.fleet_hba.write_text("\n".join(hba_lines(clients)) + "\n")
    os.chown(c.fleet_hba, c.uid, c.gid)
    os.chmod(c.fleet_hba, 0o600)


def postmaster_pid(c: Cluster) -> int:
    try:
        return int((c.data / "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return 0


def stop(c: Cluster) -> None:
    if (c.data / "postmaster.pid").exists():
        run(c, [str(bindir() / "pg_ctl"), "-D", str(c.data), "-w", "-t", "60", "-m", "fast", "stop"], check=False)


def psql(c: Cluster, port: int, sql: str, db: str = "postgres", secrets: Sequence[str] = ()) -> str:
    """One statement as the superuser over the cluster's socket. The statement goes on psql's stdin, never its
    argv (which `ps` and /proc show every local user); `secrets` are blanked out of a failure's text."""
    done = run(c, [str(bindir() / "psql"), "-h", str(c.socket_dir), "-p", str(port), "-U", SUPERUSER, "-d", db,
                   "-v", "ON_ERROR_STOP=1", "-tA", "-f", "-"], stdin=sql + "\n", secrets=secrets)
    return done.stdout.strip()


def ensure_database(c: Cluster, port: int, name: str, password: str) -> None:
    """Role ``name`` (login, ``password``) owning database ``name``."""
    quoted = password.replace("'", "''")
    if psql(c, port, f"SELECT 1 FROM pg_roles WHERE rolname = '{name}'") != "1":
        psql(c, port, f"CREATE ROLE {name} LOGIN PASSWORD '{quoted}'", secrets=(password, quoted))
    else:
        psql(c, port, f"ALTER ROLE {name} PASSWORD '{quoted}'", secrets=(password, quoted))
    if psql(c, port, f"SELECT 1 FROM pg_database WHERE datname = '{name}'") != "1":
        psql(c, port, f"CREATE DATABASE {name} OWNER {name}")
