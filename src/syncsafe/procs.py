"""Small helpers for the subprocesses stages launch: loopback ports and listening sockets, a log's
tail, a loopback-only torch.distributed store, scratch folders reaped once their process is gone,
a process's descendants, tying a child's life to its parent's, and reading a child's output so that
SIGTERM still stops the reader.

On one machine every listening socket the pipeline opens is on 127.0.0.1:
`LOOPBACK_ENV` is what island and interference processes get (gloo binds to
`lo`), and `loopback_store` binds the rendezvous store there (torch's own
TCPStore listens on every interface).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil

from syncsafe.artifacts import layout
from syncsafe.errors import Terminated

LOOPBACK = "127.0.0.1"
#: Environment of a process group that must only listen on loopback.
LOOPBACK_ENV = {"MASTER_ADDR": LOOPBACK, "GLOO_SOCKET_IFNAME": "lo"}
_PR_SET_PDEATHSIG = 1
#: Environment variable naming the host a process runs on (a fleet host sets it; else the machine's name).
HOST_ENV = "SYNCSAFE_HOST"


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the stage's own signal handlers still stop children
        return None


_PRCTL = _load_prctl()


def host_label() -> str:
    """The name of the host this process runs on: `SYNCSAFE_HOST` where set (test hosts on one machine
    share its name), else the machine's name."""
    return os.environ.get(HOST_ENV, "").strip() or socket.gethostname()


def local_address_towards(peer: str) -> str:
    """This host's address on the route to `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return s.getsockname()[0]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Another process may take it before the caller binds it: where this process or a child serves the
    port itself, bind first (`listening_socket`) and hand the socket over; where a foreign program binds
    it (the vLLM server), retry with a new port when it reports the address in use
    (`ADDRESS_IN_USE`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


#: What a server that lost its port to another process says (errno 98, EADDRINUSE).
ADDRESS_IN_USE = "Address already in use"
#: Environment variable carrying a listening socket's descriptor to the child that serves the store.
STORE_FD_ENV = "SYNCSAFE_STORE_FD"


def listening_socket() -> socket.socket:
    """A TCP socket already listening on 127.0.0.1 on a port the kernel chose (no window for another process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    sock.listen(128)
    return sock


#: Unix socket paths may not exceed this many bytes (a server's IPC sockets live in its scratch folder).
MAX_SOCKET_PATH = 107
#: Room a scratch folder leaves for the socket names a server puts in it.
SOCKET_NAME_ROOM = 48
TMP_SCRATCH_PREFIX = "syncsafe-"


def scratch_dir(root: Path, kind: str, sockets: bool = False) -> Path:
    """A new scratch folder for this process: `logs/scratch/<kind>-<pid>-<random>` under the project, reaped
    by `reap_scratch` once this pid is gone. With `sockets`, a folder whose path leaves room for Unix socket
    names: under the system's temporary folder (`syncsafe-<kind>-<pid>-...`) when the project's is too deep."""
    base = Path(root).resolve() / layout.SCRATCH
    prefix = f"{kind}-{os.getpid()}-"
    if sockets and len(str(base)) + len(prefix) + 10 + SOCKET_NAME_ROOM > MAX_SOCKET_PATH:
        return Path(tempfile.mkdtemp(prefix=f"{TMP_SCRATCH_PREFIX}{prefix}"))
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def reap_scratch(root: Path) -> list[Path]:
    """Remove the scratch folders (project and system temporary ones) whose process is gone; return them."""
    candidates = list((Path(root) / layout.SCRATCH).glob("*-*-*"))
    candidates += Path(tempfile.gettempdir()).glob(f"{TMP_SCRATCH_PREFIX}*-*-*")
    reaped = []
    for path in candidates:
        pid = _owner(path.name.removeprefix(TMP_SCRATCH_PREFIX))
        if pid is not None and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            reaped.append(path)
    return reaped


def _owner(name: str) -> int | None:
    parts = name.split("-")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below `pid` (its children, theirs, ...); empty once `pid` is gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def redact(text: str) -> str:
    """`text` (a URI, a command line) without any ``user:password@`` of the URIs in it: what a log, an
    error message or a listing may show."""
    return re.sub(r"//[^/@\s]*@", "//***@", text)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a process log, for an error message."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def loopback_store(rank: int, world_size: int, port: int, timeout: timedelta,
                   listener: socket.socket | None = None) -> Any:
    """A torch.distributed TCPStore whose server (rank 0) listens on 127.0.0.1 only.

    Rank 0 serves on `listener` (a `listening_socket` bound by whoever chose `port`, handed over: nobody can
    take the port in between); without one it binds `port` itself."""
    import torch.distributed as dist

    fd = None
    if rank == 0:
        sock = listener if listener is not None else _listen_on(port)
        fd = sock.detach()  # the store owns the socket from here
    return dist.TCPStore(LOOPBACK, port, world_size, rank == 0, timeout, master_listen_fd=fd)


def inherited_listener() -> socket.socket | None:
    """The listening socket a parent handed to this process (`STORE_FD_ENV`), if any."""
    fd = os.environ.get(STORE_FD_ENV)
    return socket.socket(fileno=int(fd)) if fd else None


def _listen_on(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(128)
    return sock


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a child (Popen's preexec_fn, with `parent` = the launching pid): the kernel sends
    `sig` to the child when its parent dies (Linux `PR_SET_PDEATHSIG`)."""
    if _PRCTL is not None:  # looked up in the parent: nothing is loaded between fork and exec
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Inside the block SIGTERM raises `errors.Terminated` in the main thread, so the cleanup that Ctrl-C
    runs (stopping children, taking daemons down) runs for it too; the previous handler comes back after."""
    def stop(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def output_lines(proc: subprocess.Popen, poll_s: float = 0.2) -> Iterator[str]:
    """The lines of `proc`'s text stdout as they come. A thread reads them: the main thread, blocked in a
    pipe read, would run a Python signal handler only once the child printed again when the signal (an
    orchestrator's SIGTERM, sent to the process) was caught by another of its threads; waiting here it wakes
    every `poll_s`, so `sigterm_raises` stops it at once."""
    assert proc.stdout is not None
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.put(line)
        finally:
            lines.put(None)

    threading.Thread(target=read, name=f"output-{proc.pid}", daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=poll_s)
        except queue.Empty:
            continue
        if line is None:
            return
        yield line


def stop_processes(procs: Iterable[subprocess.Popen], grace_s: float) -> None:
    """Terminate every one of `procs` still running, give them `grace_s` together, then kill what is left."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_process_groups(pids: Iterable[int], grace_s: float) -> list[int]:
    """Terminate the process group of each live pid in `pids` (every member, wherever it was reparented),
    give them `grace_s` together, then kill what is left; returns the pids that were stopped.

    For daemons that put themselves in their own group (DVC's queue worker and the experiments it runs): a
    pid of this process's own group stops only that pid and its descendants, never this process."""
    own = os.getpgrp()
    groups, singles = set(), set()
    for pid in pids:
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            continue
        if group == own:
            singles.add(pid)
        else:
            groups.add(group)
    members: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if os.getpgid(proc.pid) in groups:
                members[proc.pid] = proc
    for pid in singles:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in [psutil.Process(pid), *descendants(pid)]:
                members[proc.pid] = proc
    members.pop(os.getpid(), None)
    for proc in members.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(list(members.values()), timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return sorted(members)
