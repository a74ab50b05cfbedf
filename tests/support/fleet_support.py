"""Test hosts for the integration tests: a fleet of network namespaces, or a skip where none can be made.

A skip is only allowed off CI: under CI (``CI`` set, as ``.ci/run`` does) a
machine that cannot make namespaces fails the test instead of hiding it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

from syncsafe.fleet import netns
from syncsafe.fleet.hosts import Fleet


def require_namespaces() -> None:
    """Skip (off CI) or fail (under CI) where this process cannot make a network namespace."""
    probe = "ssf-probe-test"
    made = os.geteuid() == 0 and subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return
    reason = "network namespaces cannot be made here (needs root and iproute2)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}: CI must run these tests")
    pytest.skip(reason)


@contextlib.contextmanager
def fleet_up(fleet: Fleet) -> Iterator[Fleet]:
    """`fleet` up for the block, down after it (also when the block fails); a leftover of a killed run is
    taken down first."""
    require_namespaces()
    netns.down(fleet)
    netns.up(fleet)
    try:
        yield fleet
    finally:
        netns.down(fleet)
