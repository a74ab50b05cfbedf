"""Measure merge time against link rate and delay on two test hosts, and fit the merge link model.

For each link setting, host b's link is shaped (:mod:`syncsafe.fleet.links`)
and one island process per host runs this module (`python -m
syncsafe.fleet.merge_probe`, :func:`main`): it holds a parameter vector the
size of a model's payload and runs real merges (`OuterOptimizer.merge` over
`torch_all_reduce_mean`, gloo between the hosts), each after a barrier so its
wall time is its own, reading its place like torchrun gives it (`RANK`,
`WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `GLOO_SOCKET_IFNAME`). Rank 0's
merge wall times come back as a
:class:`~syncsafe.control.merge_link.LinkMeasurement`.
:func:`syncsafe.control.merge_link.fit_merge_link` then turns the rate sweep
into the model the calibrated policies read (`control.calibrated.merge_link`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from syncsafe.control.merge_link import LinkMeasurement
from syncsafe.io import write_text
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
                cmd = [sys.executable, "-m", "syncsafe.fleet.merge_probe", "--floats", str(floats),
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


def main(argv: list[str] | None = None) -> int:
    """One probe island (see the module docstring); rank 0 writes the merge wall times to `--out`.
    torch is imported here: the fleet side above runs without it."""
    import torch
    import torch.distributed as dist

    from syncsafe.diloco.comm import torch_all_reduce_mean
    from syncsafe.diloco.outer import OuterOptimizer

    ap = argparse.ArgumentParser(prog="python -m syncsafe.fleet.merge_probe",
                                 description="time real merges between island processes")
    ap.add_argument("--floats", type=int, required=True, help="parameters in the payload (float32)")
    ap.add_argument("--merges", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size,
                            timeout=timedelta(seconds=args.timeout_s))
    try:
        torch.manual_seed(rank)
        model = torch.nn.Linear(args.floats, 1, bias=False)  # `floats` parameters
        outer = OuterOptimizer(model, num_islands=size)
        walls, payload = [], 0
        for _ in range(args.merges):
            with torch.no_grad():
                model.weight.add_(0.01 * torch.randn_like(model.weight))  # a pseudo-gradient to average
            dist.barrier()
            stats = outer.merge(model, torch_all_reduce_mean())
            walls.append(stats.wall_time_s)
            payload = stats.payload_bytes
        if rank == 0:
            write_text(args.out, json.dumps({"merge_s": walls, "payload_bytes": payload, "islands": size}) + "\n")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
