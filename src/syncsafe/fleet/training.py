"""One training run across a fleet's hosts: each host's `syncsafe train` node, started together.

The first host serves the c10d rendezvous; every host runs `syncsafe train
--nnodes N --nproc-per-node K --rdzv-endpoint A:PORT --local-addr <its
address> --ifname eth0` in its namespace. Used by the multi-host tests and
`benchmarks/bench_island_loss.py`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil

from syncsafe.diloco.launch import is_island_process
from syncsafe.fleet import netns
from syncsafe.fleet.hosts import HOST_IFNAME, Fleet


def islands_on(fleet: Fleet, host: str) -> list[psutil.Process]:
    """The island processes running on `host`."""
    found = []
    for pid in netns.pids(fleet.namespace(host)):
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        if is_island_process(proc):
            found.append(proc)
    return found


def node_argv(fleet: Fleet, host: str, params_path: Path, root: Path, port: int, nproc_per_node: int = 1,
              extra: tuple[str, ...] = ()) -> list[str]:
    """The train stage as `host`'s node (run inside its namespace)."""
    syncsafe = str(Path(sys.executable).with_name("syncsafe"))
    cmd = [syncsafe, "train", "--params", str(params_path), "--root", str(root), "--nnodes", str(len(fleet.hosts)),
           "--nproc-per-node", str(nproc_per_node), "--rdzv-endpoint", f"{fleet.address(fleet.hosts[0])}:{port}",
           "--local-addr", fleet.address(host), "--ifname", HOST_IFNAME, *extra]
    return fleet.exec_argv(host, cmd)


def start_nodes(fleet: Fleet, params_path: Path, root: Path, port: int, env: Mapping[str, str],
                host_env: Mapping[str, Mapping[str, str]] | None = None,
                extra: tuple[str, ...] = ()) -> dict[str, subprocess.Popen]:
    """Every host's node, started together (stdout and stderr piped); `host_env` adds to one host's
    environment (a fault drill on that host's islands)."""
    procs = {}
    for host in fleet.hosts:
        node_env = {**env, **(host_env or {}).get(host, {})}
        procs[host] = subprocess.Popen(node_argv(fleet, host, params_path, root, port, extra=extra), env=node_env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return procs
