"""Run a Python call inside a fleet host's network namespace, from the machine's own namespace.

The team setup's checks and clients (is Redis answering, the Airflow REST API, the MLflow server) must
reach services that listen on a fleet host's address, and the machine's own namespace is not on the
fleet's bridge. :func:`call_in` runs the call on a new thread that first joins the host's network
namespace (``setns(2)`` on ``/run/netns/<name>``, network namespace only: allowed for one thread of a
multi-threaded process, the other threads stay where they are), then returns its result or raises its
exception in the caller. Sockets the call opens stay in that namespace. Needs root, like the fleet.

A small addition to :mod:`syncsafe.fleet` (whose ``ip netns exec`` runs whole commands there), kept in
the team package.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from syncsafe.team.daemons import TeamError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
#: Where ``ip netns add`` pins the namespaces it names.
NETNS_DIR = Path("/run/netns")


def call_in(namespace: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread inside network namespace ``namespace``."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            enter(namespace)
            result["value"] = fn(*args, **kwargs)
        except BaseException as err:  # handed to the caller's thread
            result["error"] = err

    thread = threading.Thread(target=target, name=f"netns-{namespace}", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def enter(namespace: str) -> None:
    """Move the calling thread into network namespace ``namespace`` (for good: use a thread of its own)."""
    path = NETNS_DIR / namespace
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TeamError(f"network namespace {namespace} not found ({path}): is the fleet up?") from None
    except PermissionError:
        raise TeamError(f"network namespace {namespace}: cannot open {path} (needs root)") from None
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise TeamError(f"network namespace {namespace}: setns failed: {os.strerror(err)} (needs root)")
    finally:
        os.close(fd)


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)
