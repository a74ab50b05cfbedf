"""Learner islands joined by torch.distributed, driven by the shared controller loop.

One process per island. Rank 0 runs the trace-time controller
(`syncsafe.control.controller.run_controller`) with `DistributedLearners`,
which turns each `train_cycle` and `merge` into a command sent to the other
ranks over a `Channel` (commands down, reports up, one wait per cycle on each
side); those run `follow`, executing commands until told to stop. Every
island trains on its own shard with its own inner AdamW; a merge is the
DiLoCo outer step over one all-reduce: applied at once (`full`), a fragment's
`fragment_sync_delay` inner steps after its launch (`streaming`), or at the
next merge (`overlapped`), the all-reduce running as async work beside the
inner steps meanwhile (`Island.merge`).

Every collective runs under the process group's timeout, so a lost island
raises on its peers instead of hanging them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from syncsafe.control.types import LearnerReport, SyncEvent
from syncsafe.diloco.checkpoint import TrainingCheckpoint, capture_rng_state, restore_rng_state
from syncsafe.diloco.comm import torch_all_reduce_start
from syncsafe.diloco.model import causal_lm_loss, eval_loss
from syncsafe.diloco.outer import (AllReduceStart, MergeStats, OuterOptimizer, PendingSync, assign_parameters,
                                   flatten_parameters)

CMD_TRAIN, CMD_MERGE, CMD_STOP = 1, 2, 3


@dataclass(frozen=True)
class Fault:
    """A fault drill, from `SYNCSAFE_FAULT=ISLAND:STEP[:ACTION]`: before inner step `step`, island
    `island` (`any`: every island that has the variable, e.g. those of one host) either kills itself
    (SIGKILL, the default `kill`) or `hold`s: its training stops there while its process (and heartbeat)
    lives on, so a test can kill it or cut its link at a known point. With `SYNCSAFE_FAULT_MARK` set, it
    first writes the wall time there (a test's readiness file)."""

    island: int | None
    step: int
    action: Literal["kill", "hold"] = "kill"

    def fires_on(self, island: int, step: int) -> bool:
        return step == self.step and self.island in (None, island)

    def fire(self) -> None:
        mark = os.environ.get("SYNCSAFE_FAULT_MARK")
        if mark:
            with open(mark, "w") as fh:
                fh.write(f"{time.time()!r}\n")
        if self.action == "hold":
            while True:
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    @classmethod
    def from_env(cls) -> Fault | None:
        raw = os.environ.get("SYNCSAFE_FAULT", "")
        if not raw:
            return None
        island, step, *action = raw.split(":")
        if action and action[0] not in ("kill", "hold"):
            raise ValueError(f"SYNCSAFE_FAULT={raw!r}: expected ISLAND:STEP[:kill|hold]")
        return cls(None if island == "any" else int(island), int(step), *action)  # type: ignore[arg-type]


@dataclass
class Island:
    """One learner: local model, inner optimizer, the global copy and its outer optimizer."""

    island_id: int
    model: torch.nn.Module
    inner: torch.optim.Optimizer
    outer: OuterOptimizer
    batches: Callable[[int], torch.Tensor]
    tokens_per_step: int
    fault: Fault | None = None
    #: Streaming DiLoCo's mix of a merged fragment's local and new global parameters (0: the global ones).
    alpha: float = 0.0
    #: Streaming: inner steps from a fragment's all-reduce launch to its outer step (`fragment_sync_delay`).
    sync_delay: int = 0
    #: Overlapped merges (`train.sync.mode: overlapped`) and how many merges their outer step waits (0 or 1).
    overlapped: bool = False
    overlap_rounds: int = 0
    #: Called with every merge's statistics once its outer step is applied (rank 0 logs them).
    on_applied: Callable[[MergeStats], None] | None = None
    step: int = 0
    tokens_since_merge: int = 0
    tokens_seen: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)
    #: The launched merge whose outer step is still to be applied.
    pending: PendingSync | None = None
    #: Overlapped: the local parameters this round started from (a round's pseudo-gradient is anchor - local).
    anchor: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.overlapped:
            self.anchor = flatten_parameters(self.model)

    def train_steps(self, n: int) -> LearnerReport:
        """n inner AdamW steps; the report carries the cycle's first and last training loss. A launched
        merge whose outer step falls due at one of these steps is applied there (`fragment_sync_delay`)."""
        self.model.train()
        first = last = float("nan")
        for i in range(n):
            self._apply_due()
            if self.fault is not None and self.fault.fires_on(self.island_id, self.step):
                self.fault.fire()
            device = next(self.model.parameters()).device
            loss = causal_lm_loss(self.model, self.batches(self.step).to(device))
            self.inner.zero_grad(set_to_none=True)
            loss.backward()
            self.inner.step()
            value = float(loss.detach())
            first = value if i == 0 else first
            last = value
            self.step += 1
            self.tokens_since_merge += self.tokens_per_step
            self.tokens_seen += self.tokens_per_step
            self.losses.append((self.step, value))
        return LearnerReport(
            island=self.island_id,
            loss_start=first,
            loss_end=last,
            tokens_since_merge=self.tokens_since_merge,
            staleness_steps=self.step_since_merge,
        )

    @property
    def step_since_merge(self) -> int:
        return self.tokens_since_merge // self.tokens_per_step

    @property
    def next_fragment(self) -> int:
        """The fragment the next merge syncs: each in turn (always 0 for a whole-model merge)."""
        return self.outer.merges_launched % len(self.outer.fragments)

    @property
    def merges_launched(self) -> int:
        """Merges launched so far (their checkpoints are numbered by it; some may not be applied yet)."""
        return self.outer.merges_launched

    def merge(self, token_weighted: bool, fragment: int = 0) -> MergeStats:
        """Launch the merge of `fragment` on every island; apply its outer step now or, with a delay, later.

        Returns the merge's statistics as far as they are known: a merge applied later has no averaged
        pseudo-gradient yet (NaN) and its `applied_step` is its due step (-1: at the next merge);
        `on_applied` gets the complete ones when its outer step is applied.
        """
        weight = float(self.tokens_since_merge) if token_weighted else 1.0
        start = torch_all_reduce_start(device=_collective_device(self.model))
        self.tokens_since_merge = 0
        if self.overlapped:
            return self._overlapped_merge(start, weight)
        self._apply_due(every=True)
        pending = self.outer.launch(self.model, start, weight, fragment, apply_step=self.step + self.sync_delay)
        if self.sync_delay == 0:
            return self._apply(pending)
        self.pending = pending
        return self.outer.stats_of(pending, applied_step=pending.apply_step)

    def _overlapped_merge(self, start: AllReduceStart, weight: float) -> MergeStats:
        """One-step delay: this round's pseudo-gradient (anchor - local) is launched after the previous round's
        outer step is applied; the islands then train on from the new global parameters plus their own
        progress of this round, which the round's average replaces at the next merge (overlap_rounds 1), or
        from the new global parameters at once (overlap_rounds 0: the full merge, byte for byte)."""
        assert self.anchor is not None
        own = self.anchor - flatten_parameters(self.model) if self.overlap_rounds else None
        self._apply_due(every=True)
        pending = self.outer.launch(self.model, start, weight, 0, reference=self.anchor, apply_step=-1)
        if own is None:
            stats = self._apply(pending)
        else:
            self.pending = pending
            assign_parameters(self.model, self.outer.global_flat.detach() - own)
            stats = self.outer.stats_of(pending, applied_step=pending.apply_step)
        self.anchor = flatten_parameters(self.model)
        return stats

    def _apply_due(self, every: bool = False) -> None:
        """Apply the launched merge if its outer step is due at this step (`every`: whenever one is pending)."""
        pending = self.pending
        if pending is not None and (every or 0 <= pending.apply_step <= self.step):
            self.pending = None
            stats = self._apply(pending, local=not self.overlapped)
            if self.on_applied is not None:
                self.on_applied(stats)

    def settle(self) -> None:
        """Apply the merge still in flight at the end of training (every island together)."""
        self._apply_due(every=True)

    def _apply(self, pending: PendingSync, local: bool = True) -> MergeStats:
        """The outer step of a launched merge (and, with `local`, the fragment's local update), then a check
        that all islands hold the same weights (the local ones after a whole-model merge, else the global
        ones: the other fragments' local parameters, or an overlapped round's progress, have trained apart)."""
        stats = self.outer.finish(self.model, pending, self.alpha) if local else self.outer.apply(pending)
        stats = dataclasses.replace(stats, applied_step=self.step)
        digests: list[str] = [""] * dist.get_world_size()
        whole = local and len(self.outer.fragments) == 1 and not self.alpha
        dist.all_gather_object(digests, self.weights_digest() if whole else _digest([self.outer.global_flat]))
        if len(set(digests)) != 1:
            raise RuntimeError(f"island {self.island_id}: islands hold different weights after merge "
                               f"{self.outer.merges_done}: {digests}")
        return stats

    def weights_digest(self) -> str:
        """sha256 of the local parameters (equal on every island right after a whole-model merge)."""
        return _digest(self.model.parameters())

    def eval_loss(self, batches: list[torch.Tensor]) -> float:
        return eval_loss(self.model, batches)

    def checkpoint(self, controller_state: dict[str, Any] | None = None) -> TrainingCheckpoint:
        return TrainingCheckpoint(
            island=self.island_id,
            inner_step=self.step,
            outer_step=self.outer.merges_done,
            tokens_seen=self.tokens_seen,
            model_state={k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            inner_optimizer_state=self.inner.state_dict(),
            outer_optimizer_state={**self.outer.state_dict(),
                                   "in_flight": self.pending.state() if self.pending is not None else {},
                                   "anchor": self.anchor.clone() if self.anchor is not None else torch.empty(0)},
            rng_state=capture_rng_state(),
            controller_state=controller_state or {},
            extra={"losses": self.losses, "tokens_since_merge": self.tokens_since_merge},
        )

    def restore(self, ckpt: TrainingCheckpoint) -> None:
        """Continue from a merge checkpoint (possibly on fewer islands than wrote it)."""
        self.model.load_state_dict(ckpt.model_state)
        self.inner.load_state_dict(ckpt.inner_optimizer_state)
        self.outer.load_state_dict(ckpt.outer_optimizer_state, islands_may_change=True)
        restore_rng_state(ckpt.rng_state)
        self.step = ckpt.inner_step
        self.tokens_seen = ckpt.tokens_seen
        self.losses = [(int(s), float(v)) for s, v in ckpt.extra["losses"]]
        self.tokens_since_merge = int(ckpt.extra["tokens_since_merge"])
        in_flight = ckpt.outer_optimizer_state["in_flight"]
        if self.overlapped:
            self.anchor = ckpt.outer_optimizer_state["anchor"].clone()
        # every island restores the same merge, so each launches the same all-reduce again
        self.pending = (self.outer.relaunch(in_flight, torch_all_reduce_start(device=_collective_device(self.model)))
                        if in_flight else None)


def _digest(tensors: Iterable[torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().cpu().float().numpy().tobytes())
    return digest.hexdigest()


def _collective_device(model: torch.nn.Module) -> torch.device | None:
    device = next(model.parameters()).device
    return device if device.type == "cuda" else None


REPORT_FIELDS = 5


class Channel:
    """Rank 0's commands down and every island's report up, each side blocking once per cycle.

    A cycle is: rank 0 sends the command, every island trains, the reports go
    up to rank 0, rank 0 decides. Rank 0 does not wait for its command to be
    received (the broadcast runs in the background and is settled before the
    next collective), and a follower does not wait for its report to be
    received (the gather runs in the background while it waits for the next
    command). So rank 0 waits only for the reports it decides on, and a
    follower only for the command it executes: the same commands and reports
    as one blocking broadcast and one all-gather per cycle, with one wait
    fewer on each side. Buffers are allocated once.
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = device if device is not None else (torch.device("cuda") if dist.get_backend() == "nccl"
                                                         else torch.device("cpu"))
        self._cmd = torch.zeros(2, dtype=torch.long, device=self.device)
        self._mine = torch.zeros(REPORT_FIELDS, dtype=torch.float64, device=self.device)
        self._parts = [torch.empty_like(self._mine) for _ in range(self.size)] if self.rank == 0 else None
        self._pending: list[dist.Work] = []

    def settle(self) -> None:
        """Wait for the collectives still in flight (before reusing a buffer or issuing another collective)."""
        while self._pending:
            self._pending.pop(0).wait()

    def send(self, cmd: int, arg: int = 0) -> None:
        """Rank 0: broadcast a command without waiting for it to be received."""
        self.settle()
        self._cmd[0], self._cmd[1] = cmd, arg
        self._pending.append(dist.broadcast(self._cmd, src=0, async_op=True))

    def receive(self) -> tuple[int, int]:
        """Ranks > 0: the next command (the only wait of a follower's cycle; its report may still be in flight)."""
        dist.broadcast(self._cmd, src=0)
        cmd, arg = self._cmd.tolist()
        return int(cmd), int(arg)

    def report(self, report: LearnerReport) -> list[LearnerReport] | None:
        """Every island's report to rank 0, in rank order; rank 0 waits for them, the others do not."""
        self.settle()
        self._mine.copy_(torch.tensor([report.island, report.loss_start, report.loss_end, report.tokens_since_merge,
                                       report.staleness_steps], dtype=torch.float64))
        if self.rank != 0:
            self._pending.append(dist.gather(self._mine, None, dst=0, async_op=True))
            return None
        dist.gather(self._mine, self._parts, dst=0)
        return [
            LearnerReport(island=int(p[0]), loss_start=float(p[1]), loss_end=float(p[2]),
                          tokens_since_merge=int(p[3]), staleness_steps=int(p[4]))
            for p in (t.tolist() for t in self._parts)
        ]


class DistributedLearners:
    """Rank 0's view of all islands: the `Learners` the controller loop drives."""

    def __init__(self, island: Island, token_weighted: bool, on_merged: Callable[[MergeStats], None]) -> None:
        self.island = island
        self.token_weighted = token_weighted
        self.on_merged = on_merged
        self.channel = Channel(_collective_device(island.model))
        #: Wall seconds spent in control cycles (training plus the command and report collectives).
        self.cycle_wall_s = 0.0

    def train_cycle(self, steps: int) -> list[LearnerReport]:
        started = time.perf_counter()
        self.channel.send(CMD_TRAIN, steps)
        reports = self.channel.report(self.island.train_steps(steps))
        self.cycle_wall_s += time.perf_counter() - started
        assert reports is not None
        return reports

    def merge(self) -> SyncEvent:
        fragment = self.island.next_fragment
        self.channel.send(CMD_MERGE, fragment)
        self.channel.settle()
        stats = self.island.merge(self.token_weighted, fragment)
        self.on_merged(stats)
        return SyncEvent(stats.fragment, stats.payload_bytes, stats.bytes_communicated, stats.applied_step)

    def stop(self) -> None:
        """Tell every island to stop; each applies the merge still in flight first."""
        self.channel.send(CMD_STOP)
        self.channel.settle()
        self.island.settle()


def follow(island: Island, token_weighted: bool, on_merged: Callable[[MergeStats], None]) -> None:
    """Ranks > 0: execute rank 0's commands until it says stop."""
    channel = Channel(_collective_device(island.model))
    while True:
        cmd, arg = channel.receive()
        if cmd == CMD_TRAIN:
            channel.report(island.train_steps(arg))
            continue
        channel.settle()
        if cmd == CMD_MERGE:
            if arg != island.next_fragment:  # pragma: no cover - protocol violation
                raise RuntimeError(f"island {island.island_id}: told to merge fragment {arg}, its next is "
                                   f"{island.next_fragment}")
            on_merged(island.merge(token_weighted, arg))
        elif cmd == CMD_STOP:
            island.settle()
            return
        else:  # pragma: no cover - protocol violation
            raise RuntimeError(f"island {island.island_id}: unknown command {cmd} from rank 0")


def step_batches(batches: Any, start: int = 0) -> Callable[[int], torch.Tensor]:
    """Adapt step-indexed batches (cpu corpus) or a stream starting at `start` (gpu dataset) to `batch(step)`."""
    if hasattr(batches, "__getitem__"):
        return lambda step: batches[step]
    stream: Iterator[torch.Tensor] = iter(batches)
    state = {"next": start}

    def take(step: int) -> torch.Tensor:
        if step != state["next"]:
            raise RuntimeError(f"streamed batches are consumed in order: asked for step {step}, next is {state['next']}")
        state["next"] += 1
        return next(stream)

    return take
