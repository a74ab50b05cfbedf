"""Background processes of the team setup: started detached with a log, awaited, stopped with their trees.

A daemon is started in its own session (``setsid``), so it outlives the
command that started it and everything it forks shares its session id.
Stopping one sends SIGTERM to the daemon, its descendants and every process of
its session, waits, then sends SIGKILL to whatever is left. A record (pid and
start time) identifies the process even after the pid is reused.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from syncsafe import localhttp
from syncsafe.procs import LOOPBACK, free_port, log_tail, redact


class TeamError(RuntimeError):
    """A part of the team setup did not start, stop or answer."""


def start(
    name: str,
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    log: Path,
    cwd: Path,
    user: int | None = None,
    group: int | None = None,
) -> dict:
    """Start ``cmd`` detached, stdout and stderr to ``log``; returns its record."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {redact(' '.join(cmd))}\n".encode())
        out.flush()
        extra = {} if user is None else {"user": user, "group": group, "extra_groups": []}
        proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, **extra)
    return {"name": name, "pid": proc.pid, "started": psutil.Process(proc.pid).create_time(), "log": str(log)}


def process(record: Mapping) -> psutil.Process | None:
    """The live process of a record, None when it exited (or its pid now belongs to another)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["started"])) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
        return None


def tree(record: Mapping) -> list[psutil.Process]:
    """The daemon, its descendants and the other members of its session."""
    root = process(record)
    if root is None:
        return []
    procs = {root.pid: root}
    try:
        procs.update({p.pid: p for p in root.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == root.pid:
                procs.setdefault(proc.pid, proc)
        except (ProcessLookupError, PermissionError):
            continue
    return list(procs.values())


def stop(records: Sequence[Mapping], grace_s: float = 20.0) -> list[str]:
    """SIGTERM every process of every record's tree, SIGKILL what is left after ``grace_s``.

    Returns the processes still alive at the end (``"pid name"``), normally none.
    """
    procs = {p.pid: p for record in records for p in tree(record)}
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=10)
    return [f"{p.pid} {_name(p)}" for p in alive]


def _name(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:120] or proc.name()
    except psutil.Error:
        return "?"


def listening(port: int, address: str = LOOPBACK) -> bool:
    """True when something accepts TCP connections on ``address``:``port`` (default 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((address, int(port))) == 0


def pick_port(preferred: int | None, address: str = LOOPBACK) -> int:
    """``preferred`` when nothing listens there, else a port free on ``address`` (default 127.0.0.1)."""
    if preferred and not listening(preferred, address):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, preferred))
                return preferred
            except OSError:
                pass
    if address == LOOPBACK:
        return free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def http_ok(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with localhttp.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - loopback URL we built
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until(check: Callable[[], bool], *, what: str, timeout_s: float, record: Mapping | None = None) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` (with the daemon's log tail) when the
    daemon exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if record is not None and process(record) is None:
            raise TeamError(f"{what}: the process exited; log {record['log']}:\n{log_tail(Path(record['log']))}")
        time.sleep(0.5)
    tail = f"; log {record['log']}:\n{log_tail(Path(record['log']))}" if record is not None else ""
    raise TeamError(f"{what}: not ready after {timeout_s:.0f} s{tail}")
