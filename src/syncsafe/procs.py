"""Small helpers for the subprocesses stages launch: a free loopback port, a log's tail,
a loopback-only torch.distributed store, and tying a child's life to its parent's.

On one machine every listening socket the pipeline opens is on 127.0.0.1:
`LOOPBACK_ENV` is what island and interference processes get (gloo binds to
`lo`), and `loopback_store` binds the rendezvous store there (torch's own
TCPStore listens on every interface).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
#: Environment of a process group that must only listen on loopback.
LOOPBACK_ENV = {"MASTER_ADDR": LOOPBACK, "GLOO_SOCKET_IFNAME": "lo"}
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the stage's own signal handlers still stop children
        return None


_PRCTL = _load_prctl()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a process log, for an error message."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def loopback_store(rank: int, world_size: int, port: int, timeout: timedelta) -> Any:
    """A torch.distributed TCPStore whose server (rank 0) listens on 127.0.0.1 only."""
    import torch.distributed as dist

    fd = None
    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
        sock.listen(128)
        fd = sock.detach()  # the store owns the socket from here
    return dist.TCPStore(LOOPBACK, port, world_size, rank == 0, timeout, master_listen_fd=fd)


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a child (Popen's preexec_fn, with `parent` = the launching pid): the kernel sends
    `sig` to the child when its parent dies (Linux `PR_SET_PDEATHSIG`)."""
    if _PRCTL is not None:  # looked up in the parent: nothing is loaded between fork and exec
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)
