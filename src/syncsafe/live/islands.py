"""The real DiLoCo islands of a live run, with the sidecar as rank 0.

`IslandGroup` starts `train.islands - 1` follower processes
(`python -m syncsafe.live.islands`, the training islands' `follow`
loop) and joins them as rank 0 in the sidecar's own process, so the
controller that drives rank 0 (`DistributedLearners`) runs beside the
scraper of the server's `/metrics`. The group is the one training uses:
gloo over loopback, every collective under `train.collective_timeout_s`,
the same islands, inner AdamW, outer Nesterov merge and weight check.

A merge (`LiveLearners.merge`) is the islands' real all-reduce of
pseudo-gradients, the outer step and a checkpoint of every island; its
window on the fleet is `merge.window_s` trace seconds, filled beside the
server by the merge workload of the replay stage (`MergeInterference`: the
same all-reduce and checkpoint, repeated for a model-sized payload), while
the islands wait. Wall-clock start, real merge end and window end are
logged per merge.

Followers die with the sidecar (`PR_SET_PDEATHSIG`); a follower that dies
mid-run makes rank 0's next collective fail (at the latest after
`train.collective_timeout_s`), and the live command fails naming it
(`IslandLost`, exit 3) whatever `train.on_island_failure` says: training's
`continue` resumes from the last merge checkpoint on the survivors, which a
live run cannot do, its arrivals having passed on the wall clock.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from syncsafe import timebase
from syncsafe.artifacts import layout
from syncsafe.config import Params, load_params
from syncsafe.control.clock import WallClock
from syncsafe.control.types import SyncEvent
from syncsafe.diloco.checkpoint import save_checkpoint
from syncsafe.diloco.islands import DistributedLearners, Island, follow
from syncsafe.diloco.outer import MergeStats
from syncsafe.diloco.run import Resources, World, make_island
from syncsafe.errors import EXIT_ISLAND_LOST
from syncsafe.procs import LOOPBACK_ENV, die_with_parent, listening_socket, log_tail, loopback_store
from syncsafe.serving.interference import MergeInterference


class IslandLost(RuntimeError):
    """An island of the live run died (the CLI exits 3)."""

    exit_code = EXIT_ISLAND_LOST


def cpu_world(rank: int, size: int, params: Params) -> World:
    return World(rank=rank, world_size=size, island_ids=tuple(range(size)), num_islands=params.train.islands,
                 device=torch.device("cpu"))


def checkpointer(run_dir: Path, island: Island, log: list[dict[str, Any]] | None = None):
    """on_merged callback: every island writes its checkpoint, then all wait for each other."""

    def save(stats: MergeStats) -> None:
        if log is not None:
            log.append(stats.to_dict())
        k = island.merges_launched
        save_checkpoint(layout.island_state_file(layout.merge_checkpoint_dir(run_dir, k), island.island_id),
                        island.checkpoint())
        dist.barrier()
        if island.island_id == 0:
            for merge, old in layout.merge_checkpoint_dirs(run_dir):
                if merge != k:
                    shutil.rmtree(old, ignore_errors=True)

    return save


class LiveLearners:
    """The controller's learners on the wall clock: real islands, merges that occupy their window."""

    def __init__(self, learners: DistributedLearners, clock: WallClock, window_s: float, work: MergeInterference,
                 timeout_s: float) -> None:
        self.learners = learners
        self.clock = clock
        self.window_s = window_s
        self.work = work
        self.timeout_s = timeout_s
        self.merges: list[dict[str, Any]] = []
        #: Wall seconds of each control cycle's training (commands and reports included).
        self.cycle_wall_s: list[float] = []

    def train_cycle(self, steps: int):
        started = time.perf_counter()
        reports = self.learners.train_cycle(steps)
        self.cycle_wall_s.append(time.perf_counter() - started)
        return reports

    def merge(self) -> SyncEvent:
        t_s = self.clock.log[-1][0]  # the decision time just reached
        began = timebase.now()
        window_end = max(self.clock.epoch(t_s + self.window_s), began)
        self.work.submit([(began, window_end)])
        event = self.learners.merge()  # all-reduce, outer Nesterov step, weight check, checkpoint
        merged = timebase.now()
        worked = self.work.collect(timeout_s=self.timeout_s + (window_end - began))  # returns when the window closes
        self.merges.append({"t_s": t_s, "start_epoch": began, "merge_end_epoch": merged, "window_end_epoch": timebase.now(),
                            "merge_wall_s": merged - began, "fill_iterations": sum(n for _, _, n in worked)})
        return event


class IslandGroup:
    """`with IslandGroup(...) as group:` -> rank 0's island and learners; followers in subprocesses."""

    def __init__(self, params: Params, params_path: Path, root: Path, seed: int, run_dir: Path, res: Resources) -> None:
        self.params = params
        self.params_path = Path(params_path)
        self.root = Path(root)
        self.seed = seed
        self.run_dir = Path(run_dir)
        self.res = res
        self.size = params.train.islands
        self.merge_stats: list[dict[str, Any]] = []
        self._procs: list[tuple[int, subprocess.Popen, Path]] = []
        self.island: Island | None = None
        self.learners: DistributedLearners | None = None

    def __enter__(self) -> IslandGroup:
        listener = listening_socket()  # this process is rank 0: its store serves on it
        port = listener.getsockname()[1]
        os.environ.update(LOOPBACK_ENV)  # gloo of rank 0 binds to loopback like the followers'
        logs = self.run_dir / layout.RUN_LOGS_DIR
        logs.mkdir(parents=True, exist_ok=True)
        for rank in range(1, self.size):
            env = {**os.environ, **LOOPBACK_ENV, "RANK": str(rank), "WORLD_SIZE": str(self.size),
                   "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, "-m", "syncsafe.live.islands", "--params", str(self.params_path),
                   "--root", str(self.root), "--seed", str(self.seed), "--run-dir", str(self.run_dir)]
            log = logs / f"island-{rank}.log"
            with open(log, "w") as fh:
                proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                        preexec_fn=functools.partial(die_with_parent, os.getpid()))
            self._procs.append((rank, proc, log))
        timeout = timedelta(seconds=self.params.train.collective_timeout_s)
        torch.set_num_threads(self.params.train.torch_threads)  # as the followers: no spinning OpenMP team
        try:
            dist.init_process_group("gloo", store=loopback_store(0, self.size, port, timeout, listener), rank=0,
                                    world_size=self.size, timeout=timeout)
        except Exception as err:
            self._raise_lost(err)
        world = cpu_world(0, self.size, self.params)
        self.island = make_island(self.params, world, self.res, self.seed)
        self.learners = DistributedLearners(self.island, self.params.train.token_weighted,
                                            checkpointer(self.run_dir, self.island, self.merge_stats))
        try:
            dist.barrier()  # every island built: the run's wall clock may start
        except Exception as err:
            self._raise_lost(err)
        return self

    def _raise_lost(self, err: BaseException) -> None:
        time.sleep(0.5)
        for rank, proc, log in self._procs:
            if proc.poll() not in (None, 0):
                raise IslandLost(f"live: island {rank} exited with code {proc.returncode}; log {log}:\n"
                                 f"{log_tail(log, 15)}") from err
        raise IslandLost(f"live: the island group failed: {type(err).__name__}: {err}") from err

    def check(self, err: BaseException) -> None:
        """Turn a failed collective into IslandLost naming the dead follower."""
        self._raise_lost(err)

    def stop(self) -> None:
        if self.learners is not None:
            self.learners.stop()

    def __exit__(self, exc_type, exc, tb) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        deadline = time.monotonic() + 10.0
        for _, proc, _ in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.run_dir / layout.CHECKPOINTS_DIR, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """A follower island of a live run: train and merge on rank 0's commands until told to stop."""
    ap = argparse.ArgumentParser(prog="python -m syncsafe.live.islands")
    ap.add_argument("--params", type=Path, required=True)
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--run-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    params = load_params(args.params)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(params.train.torch_threads)
    timeout = timedelta(seconds=params.train.collective_timeout_s)
    dist.init_process_group("gloo", store=loopback_store(rank, size, int(os.environ["MASTER_PORT"]), timeout),
                            rank=rank, world_size=size, timeout=timeout)
    try:
        from syncsafe.diloco.resources import builtin_resources

        world = cpu_world(rank, size, params)
        island = make_island(params, world, builtin_resources(params, args.root, world), args.seed)
        dist.barrier()
        follow(island, params.train.token_weighted, checkpointer(args.run_dir, island))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
