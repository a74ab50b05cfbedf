"""Merge interference beside the serving backend, only inside merge windows.

`MergeInterference` keeps a few worker processes alive for a whole replay
stage. For each schedule it is given the merge windows as real-time
intervals; the workers sleep until each window opens and work until it
closes, then report the intervals they actually worked.

- `merge` (default): the real outer-merge work of a DiLoCo island, repeated
  back to back for the window: an all-reduce of a model-sized pseudo-gradient
  among the workers (torch.distributed, gloo), the averaged update applied,
  and a checkpoint written. On a real fleet one merge of a large model takes
  the whole window; for a small model the loop fills it.
- `stress`: a matmul loop in each worker (the paper's synthetic stress).

Rank 0 decides every iteration whether the window is still open and
broadcasts it, so all workers leave the window after the same all-reduce.
`no_sync` replays pass no windows and the workers stay idle.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Literal

from syncsafe import timebase
from syncsafe.procs import LOOPBACK_ENV, die_with_parent, listening_socket, loopback_store
from syncsafe.procs import scratch_dir as new_scratch_dir
from syncsafe.serving.placement import CpuPlacement

Mode = Literal["merge", "stress"]


class InterferenceError(RuntimeError):
    """A worker died or did not report back."""


def _worker(rank: int, world: int, port: int, mode: Mode, numel: int, scratch: str,
            commands: mp.Queue, results: mp.Queue, parent: int, placement: CpuPlacement | None,
            listener: socket.socket | None) -> None:
    die_with_parent(parent)  # a killed stage leaves no worker behind
    if placement is not None:  # beside the server, on its CPUs: the merge takes the server's compute, not the client's
        placement.pin_background()
    os.environ.update(LOOPBACK_ENV)  # gloo binds to loopback: nothing listens beyond this machine
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if mode == "merge":
        timeout = timedelta(seconds=120)
        dist.init_process_group("gloo", store=loopback_store(rank, world, port, timeout, listener), rank=rank,
                                world_size=world, timeout=timeout)
    generator = torch.Generator().manual_seed(rank)
    pseudo_gradient = torch.randn(numel, generator=generator)
    results.put((rank, None))  # ready: windows submitted from now on are worked on time
    weights = torch.zeros(numel)
    a = torch.randn(384, 384, generator=generator)
    checkpoint = Path(scratch) / f"merge-checkpoint-{rank}.pt"
    while True:
        windows = commands.get()
        received = timebase.now()
        if windows is None:
            break
        worked = []
        for start, end in windows:
            time.sleep(max(0.0, start - timebase.now()))
            began, iterations = timebase.now(), 0
            if mode == "merge":
                flag = torch.zeros(1)
                while True:
                    flag[0] = 1.0 if timebase.now() < end else 0.0
                    dist.broadcast(flag, src=0)
                    if flag[0] == 0:
                        break
                    buf = pseudo_gradient.clone()
                    dist.all_reduce(buf)
                    weights.add_(buf, alpha=-0.7 / world)
                    if rank == 0:
                        torch.save(weights, checkpoint)
                    iterations += 1
            else:
                while timebase.now() < end:
                    a = torch.tanh(a @ a / 384.0)
                    iterations += 1
            worked.append((began, timebase.now(), iterations))
        results.put((rank, (received, worked)))
    if mode == "merge":
        dist.destroy_process_group()


class MergeInterference:
    """Worker processes that run merge work during the windows they are given."""

    def __init__(self, mode: Mode, workers: int, payload_numel: int, scratch_dir: Path | None = None,
                 ready_timeout_s: float = 180.0, placement: CpuPlacement | None = None,
                 scratch_root: Path = Path(".")) -> None:
        """`scratch_dir`: where merge checkpoints are written; None = a scratch folder of the project at
        `scratch_root` (`procs.scratch_dir`: outside every stage output, removed on exit, reaped by the next
        stage start when this process is killed first). Entering waits up to `ready_timeout_s` for every
        worker to start. `placement`: the workers run on the server's CPUs (or at its priority)."""
        self.ready_timeout_s = ready_timeout_s
        self.placement = placement
        self.mode = mode
        self.world = workers
        self.numel = payload_numel
        self._own_scratch = scratch_dir is None
        self.scratch = new_scratch_dir(scratch_root, "merge") if scratch_dir is None else Path(scratch_dir)
        self._procs: list[mp.Process] = []
        self._commands: list[mp.Queue] = []
        self._results: mp.Queue | None = None
        #: When rank 0 received the windows of the last `collect`ed submission (an epoch of `syncsafe.timebase`).
        self.received: float | None = None

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty before entering)."""
        return [p.pid for p in self._procs if p.pid is not None]

    def __enter__(self) -> MergeInterference:
        ctx = mp.get_context("spawn")
        self.scratch.mkdir(parents=True, exist_ok=True)
        self._results = ctx.Queue()
        listener = listening_socket()  # rank 0's store serves on it: the port is ours from now on
        port = listener.getsockname()[1]
        for rank in range(self.world):
            q = ctx.Queue()
            p = ctx.Process(target=_worker, args=(rank, self.world, port, self.mode, self.numel, str(self.scratch),
                                                  q, self._results, os.getpid(), self.placement,
                                                  listener if rank == 0 else None), daemon=True)
            p.start()
            self._procs.append(p)
            self._commands.append(q)
        listener.close()  # rank 0 holds its own copy
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _next_report(self, deadline: float, waiting_for: str) -> tuple[int, object]:
        """The next (rank, payload) a worker put on the results queue; a dead worker or the deadline raises."""
        assert self._results is not None
        while True:
            dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
            if dead:
                raise InterferenceError(f"interference worker(s) {dead} died (exit {self._procs[dead[0]].exitcode})")
            try:
                return self._results.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise InterferenceError(f"interference workers did not {waiting_for}") from None

    def _wait_ready(self) -> None:
        """Block until every worker has started (torch imported, process group joined): a window
        submitted before that would be missed, or worked late."""
        deadline = time.monotonic() + self.ready_timeout_s
        ready: set[int] = set()
        while len(ready) < self.world:
            rank, _ = self._next_report(deadline, f"start within {self.ready_timeout_s:.0f} s")
            ready.add(rank)

    def submit(self, windows: list[tuple[float, float]]) -> None:
        """Start working on these (start_epoch, end_epoch) windows in the background."""
        for q in self._commands:
            q.put(list(windows))

    def collect(self, timeout_s: float) -> list[tuple[float, float, int]]:
        """Wait for every worker's report; rank 0's worked intervals (begin, end, iterations).

        `received` then holds when rank 0 took the windows off its queue (`syncsafe.timebase`): a window can
        begin no earlier than that, whenever it was submitted."""
        reports = {}
        deadline = time.monotonic() + timeout_s
        while len(reports) < self.world:
            rank, report = self._next_report(deadline, f"report within {timeout_s:.0f} s")
            reports[rank] = report
        self.received, worked = reports[0]
        return worked

    def __exit__(self, *exc) -> None:
        for q in self._commands:
            q.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        if self._own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
