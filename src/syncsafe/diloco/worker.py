"""An island process: `python -m syncsafe.diloco.worker --params params.yaml --regime R`.

Reads its place in the group like torchrun does (`RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), so the same module runs under
the stage's own launcher on one machine or under `torchrun` across nodes:

    torchrun --nnodes 2 --nproc-per-node 4 ... -m syncsafe.diloco.worker \\
        --params params.yaml --regime bursty

It trains every (policy, seed) run of the regime in turn (or those named).
gloo on CPU, NCCL on GPU; every collective times out after
`train.collective_timeout_s`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from syncsafe.config import Params, load_params
from syncsafe.errors import BAD_INPUT_MARK, EXIT_BAD_INPUT, BadInput
from syncsafe.diloco.heartbeat import Heartbeat, Identity
from syncsafe.diloco.islands import Fault
from syncsafe.diloco.resources import builtin_resources, hub_resources
from syncsafe.diloco.run import World, is_complete, train_dir, train_run
from syncsafe.procs import LOOPBACK, host_label, inherited_listener, local_address_towards, loopback_store


def _world(params: Params, island_ids: list[int] | None) -> World:
    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ids = tuple(island_ids) if island_ids else tuple(range(size))
    if len(ids) != size:
        raise SystemExit(f"--island-ids names {len(ids)} islands but WORLD_SIZE is {size}")
    if params.train.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return World(rank=rank, world_size=size, island_ids=ids, num_islands=params.train.islands, device=device)


def start_heartbeat(params: Params, world: World) -> Heartbeat:
    """This island's heartbeat over a client connection of its own to the process group's store."""
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    def connect(timeout: timedelta) -> dist.TCPStore:
        return dist.TCPStore(addr, port, is_master=False, timeout=timeout)

    me = Identity(world.island_id, host_label(), local_address_towards(addr))
    return Heartbeat(connect, me, list(world.island_ids), params.train.heartbeat_timeout_s,
                     store_address=f"{addr}:{port}").start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m syncsafe.diloco.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--regime", required=True)
    ap.add_argument("--policy", action="append", help="policy to train (repeatable); default: all")
    ap.add_argument("--seed", type=int, action="append", help="seed to train (repeatable); default: all")
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--resume", action="store_true", help="skip complete runs, continue others from their last merge")
    ap.add_argument("--island-ids", type=lambda s: [int(x) for x in s.split(",")], default=None)
    args = ap.parse_args(argv)
    params = load_params(args.params)
    world = _world(params, args.island_ids)
    torch.set_num_threads(params.train.torch_threads)
    backend = "nccl" if world.device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=params.train.collective_timeout_s)
    heartbeat: Heartbeat | None = None
    if os.environ.get("MASTER_ADDR") == LOOPBACK:  # one machine: the store listens on loopback only
        store = loopback_store(world.rank, world.world_size, int(os.environ["MASTER_PORT"]), timeout,
                               inherited_listener())
        dist.init_process_group(backend, store=store, rank=world.rank, world_size=world.world_size, timeout=timeout)
    else:  # across nodes (torchrun): the rendezvous address torchrun gives
        dist.init_process_group(backend, init_method="env://", rank=world.rank, world_size=world.world_size,
                                timeout=timeout)
    try:
        heartbeat = start_heartbeat(params, world)
        print(f"{heartbeat.me.describe()}: rank {world.rank} of {world.world_size}", flush=True)
        res = hub_resources(params, world) if params.train.source == "hub" else builtin_resources(params, args.root, world)
        fault = Fault.from_env()
        for policy in args.policy or params.control.policies:
            for seed in args.seed or params.seeds:
                if args.resume and is_complete(train_dir(args.root, args.regime, policy, seed)):
                    continue
                train_run(params, args.regime, policy, seed, args.root, world, res, resume=args.resume, fault=fault)
                if world.rank == 0:
                    print(f"trained {args.regime}/{policy}/seed-{seed}", flush=True)
    except BadInput as err:  # input the launcher should have refused: the stage exits 2 naming it, not "island lost"
        print(f"{BAD_INPUT_MARK} {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except Exception as err:  # one clear line naming the island, then the traceback for the log
        if heartbeat is not None:  # a collective that failed because a peer is gone: the heartbeat names it
            heartbeat.wait_for_verdict()
        print(f"island {world.island_id} (rank {world.rank}) failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1
    else:
        if heartbeat is not None:
            heartbeat.stop(done=True)
        heartbeat = None
    finally:
        if heartbeat is not None:
            heartbeat.stop(done=False)
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
