"""`python -m syncsafe.diloco.merge_probe`: time real DiLoCo merges between island processes, nothing else.

Each process holds a parameter vector the size of a model's payload and runs
`--merges` merges of the real outer step (`OuterOptimizer.merge` over
`torch_all_reduce_mean`, gloo), each after a barrier, so a merge's wall time
is its own. It reads its place like torchrun gives it (`RANK`, `WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`, `GLOO_SOCKET_IFNAME`); rank 0 writes the merge
wall times as JSON to `--out`. `syncsafe.fleet.merge_probe` runs it on two
test hosts over a shaped link.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from syncsafe.diloco.comm import torch_all_reduce_mean
from syncsafe.diloco.outer import OuterOptimizer
from syncsafe.io import write_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m syncsafe.diloco.merge_probe", description=__doc__.splitlines()[0])
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
