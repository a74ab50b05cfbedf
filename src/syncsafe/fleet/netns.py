"""Bring a fleet of test hosts up and down, and run commands on its hosts.

``up`` runs :func:`syncsafe.fleet.hosts.up_commands` in order; if any step
fails, it deletes the namespaces it made (processes in them first) and
raises, so a failed ``up`` leaves nothing behind. ``down`` stops every
process still running in the fleet's namespaces and deletes them (deleting a
namespace deletes its veth ends). Both need root.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from syncsafe.fleet.hosts import Fleet, up_commands


class FleetError(RuntimeError):
    """A fleet could not be built, torn down or used (the CLI exits 1 with this line)."""


def _ip(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FleetError(f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def require_root() -> None:
    if os.geteuid() != 0:
        raise FleetError("network namespaces need root: run as root (CI does)")


def existing(fleet: Fleet) -> list[str]:
    """The fleet's namespaces that exist now."""
    names = {line.split()[0] for line in _ip(["ip", "netns", "list"]).splitlines() if line.strip()}
    return [ns for ns in fleet.namespaces() if ns in names]


def is_up(fleet: Fleet) -> bool:
    return set(existing(fleet)) == set(fleet.namespaces())


def up(fleet: Fleet) -> None:
    """Build the fleet; a fleet whose switch exists already is refused (down it first)."""
    require_root()
    if fleet.switch in existing(fleet):
        raise FleetError(f"fleet {fleet.name} is already up (namespace {fleet.switch} exists): "
                         f"scripts/fleet.sh down --name {fleet.name} first")
    made: list[str] = []
    try:
        for cmd in up_commands(fleet):
            _ip(cmd)
            if cmd[:3] == ["ip", "netns", "add"]:
                made.append(cmd[3])
    except BaseException:
        _delete(made)
        raise


def down(fleet: Fleet) -> list[str]:
    """Stop what runs on the fleet and delete its namespaces; returns the namespaces deleted."""
    require_root()
    found = existing(fleet)
    _delete(found)
    left = existing(fleet)
    if left:
        raise FleetError(f"fleet {fleet.name}: namespaces {left} are still there after down")
    return found


def pids(namespace: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _delete(namespaces: list[str], grace_s: float = 5.0) -> None:
    """Stop every process in `namespaces` (SIGTERM, then SIGKILL after `grace_s`), then delete them."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        running = [p for ns in namespaces for p in pids(ns)]
        for pid in running:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while running and time.monotonic() < deadline and any(pids(ns) for ns in namespaces):
            time.sleep(0.1)
    for ns in reversed(namespaces):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run_on(fleet: Fleet, host: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run `argv` on `host` and wait for it (keyword arguments as for `subprocess.run`)."""
    return subprocess.run(fleet.exec_argv(host, argv), **kw)


def addresses(fleet: Fleet, host: str) -> list[str]:
    """The IPv4 addresses `host` holds (loopback included)."""
    out = _ip(["ip", "-n", fleet.namespace(host), "-4", "-o", "addr", "show"])
    return [line.split()[3].split("/")[0] for line in out.splitlines()]
