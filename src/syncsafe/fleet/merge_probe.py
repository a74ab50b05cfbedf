"""Measure merge time against link rate and delay on two test hosts, and fit the merge link model.

For each link setting, host b's link is shaped (:mod:`syncsafe.fleet.links`)
and one island process per host runs `python -m syncsafe.diloco.merge_probe`
(real outer steps over a gloo all-reduce between the hosts); the merge wall
times come back as a :class:`~syncsafe.control.merge_link.LinkMeasurement`.
:func:`syncsafe.control.merge_link.fit_merge_link` then turns the rate sweep
into the model the calibrated policies read (`control.calibrated.merge_link`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from syncsafe.control.merge_link import LinkMeasurement
from syncsafe.fleet import links
from syncsafe.fleet.hosts import HOST_IFNAME, Fleet
from syncsafe.fleet.netns import FleetError


def probe_env(fleet: Fleet, rank: int, port: int, base: dict[str, str]) -> dict[str, str]:
    """The environment of the probe island on host number `rank` (rank 0 on the first host serves the store)."""
    return {**base, "RANK": str(rank), "WORLD_SIZE": str(len(fleet.hosts)), "MASTER_ADDR": fleet.address(fleet.hosts[0]),
            "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": HOST_IFNAME, "OMP_NUM_THREADS": "1"}


def measure(fleet: Fleet, shape: links.Shape, floats: int, merges: int = 5, port: int = 29500,
            timeout_s: float = 300.0) -> tuple[LinkMeasurement, int]:
    """Merges of a `floats`-parameter payload with the links of every host but the first shaped as `shape`
    (between two hosts: one shaped link, `shape`'s rate and delay each way); returns the measurement and
    the payload in bytes."""
    for host in fleet.hosts[1:]:
        links.shape(fleet, host, shape)
    try:
        with tempfile.TemporaryDirectory(prefix="syncsafe-merge-probe-") as tmp:
            out = Path(tmp) / "merges.json"
            procs = []
            for rank, host in enumerate(fleet.hosts):
                cmd = [sys.executable, "-m", "syncsafe.diloco.merge_probe", "--floats", str(floats),
                       "--merges", str(merges), "--out", str(out)]
                procs.append(subprocess.Popen(fleet.exec_argv(host, cmd), env=probe_env(fleet, rank, port, dict(os.environ)),
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            logs = []
            for p in procs:
                try:
                    logs.append(p.communicate(timeout=timeout_s)[0])
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    raise FleetError(f"merge probe at {shape.describe()} did not finish within {timeout_s:.0f} s") from None
            if any(p.returncode for p in procs) or not out.is_file():
                tail = "\n".join(logs[-1].splitlines()[-10:])
                raise FleetError(f"merge probe at {shape.describe()} failed (exit codes "
                                 f"{[p.returncode for p in procs]}):\n{tail}")
            result = json.loads(out.read_text())
    finally:
        for host in fleet.hosts[1:]:
            links.clear(fleet, host)
    return LinkMeasurement(rate_mbit=shape.rate_mbit, delay_ms=shape.delay_ms, merge_s=result["merge_s"]), \
        int(result["payload_bytes"])
