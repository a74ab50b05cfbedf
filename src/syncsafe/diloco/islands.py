"""Learner islands joined by torch.distributed, driven by the shared controller loop.

One process per island. Rank 0 runs the trace-time controller
(`syncsafe.control.controller.run_controller`) with `DistributedLearners`,
which turns each `train_cycle` and `merge` into a command broadcast to the
other ranks; those run `follow`, executing commands until told to stop. Every
island trains on its own shard with its own inner AdamW; a merge is the
DiLoCo outer step (`OuterOptimizer.merge`) over one all-reduce.

Every collective runs under the process group's timeout, so a lost island
raises on its peers instead of hanging them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from syncsafe.control.types import LearnerReport
from syncsafe.diloco.checkpoint import TrainingCheckpoint, capture_rng_state, restore_rng_state
from syncsafe.diloco.comm import torch_all_reduce_mean
from syncsafe.diloco.model import causal_lm_loss, eval_loss
from syncsafe.diloco.outer import MergeStats, OuterOptimizer

CMD_TRAIN, CMD_MERGE, CMD_STOP = 1, 2, 3


@dataclass(frozen=True)
class Fault:
    """A fault drill: island `island` kills itself (SIGKILL) before inner step `step`."""

    island: int
    step: int

    @classmethod
    def from_env(cls) -> Fault | None:
        raw = os.environ.get("SYNCSAFE_FAULT", "")
        if not raw:
            return None
        island, step = raw.split(":")
        return cls(int(island), int(step))


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
    step: int = 0
    tokens_since_merge: int = 0
    tokens_seen: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)

    def train_steps(self, n: int) -> LearnerReport:
        """n inner AdamW steps; the report carries the cycle's first and last training loss."""
        self.model.train()
        first = last = float("nan")
        for i in range(n):
            if self.fault is not None and self.fault.island == self.island_id and self.fault.step == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
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

    def merge(self, token_weighted: bool) -> MergeStats:
        """The outer step on every island, then a check that all islands hold the same weights."""
        weight = float(self.tokens_since_merge) if token_weighted else 1.0
        stats = self.outer.merge(self.model, torch_all_reduce_mean(device=_collective_device(self.model)), weight=weight)
        self.tokens_since_merge = 0
        digests: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(digests, self.weights_digest())
        if len(set(digests)) != 1:
            raise RuntimeError(f"island {self.island_id}: islands hold different weights after merge "
                               f"{self.outer.merges_done}: {digests}")
        return stats

    def weights_digest(self) -> str:
        """sha256 of the local parameters (equal on every island right after a merge)."""
        digest = hashlib.sha256()
        for p in self.model.parameters():
            digest.update(p.detach().cpu().float().numpy().tobytes())
        return digest.hexdigest()

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
            outer_optimizer_state=self.outer.state_dict(),
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


def _collective_device(model: torch.nn.Module) -> torch.device | None:
    device = next(model.parameters()).device
    return device if device.type == "cuda" else None


def _broadcast_command(cmd: int, arg: int = 0) -> tuple[int, int]:
    buf = torch.tensor([cmd, arg], dtype=torch.long)
    if dist.get_backend() == "nccl":
        buf = buf.cuda()
    dist.broadcast(buf, src=0)
    return int(buf[0]), int(buf[1])


def _gather_reports(report: LearnerReport) -> list[LearnerReport]:
    """Every island's report, in rank order (one all-gather of 5 floats per island)."""
    mine = torch.tensor(
        [report.island, report.loss_start, report.loss_end, report.tokens_since_merge, report.staleness_steps],
        dtype=torch.float64,
    )
    if dist.get_backend() == "nccl":
        mine = mine.cuda()
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    return [
        LearnerReport(island=int(p[0]), loss_start=float(p[1]), loss_end=float(p[2]),
                      tokens_since_merge=int(p[3]), staleness_steps=int(p[4]))
        for p in (t.cpu() for t in parts)
    ]


class DistributedLearners:
    """Rank 0's view of all islands: the `Learners` the controller loop drives."""

    def __init__(self, island: Island, token_weighted: bool, on_merged: Callable[[MergeStats], None]) -> None:
        self.island = island
        self.token_weighted = token_weighted
        self.on_merged = on_merged
        #: Wall seconds spent in control cycles (training plus the command and report collectives).
        self.cycle_wall_s = 0.0

    def train_cycle(self, steps: int) -> list[LearnerReport]:
        started = time.perf_counter()
        _broadcast_command(CMD_TRAIN, steps)
        reports = _gather_reports(self.island.train_steps(steps))
        self.cycle_wall_s += time.perf_counter() - started
        return reports

    def merge(self) -> None:
        _broadcast_command(CMD_MERGE)
        self.on_merged(self.island.merge(self.token_weighted))

    def stop(self) -> None:
        _broadcast_command(CMD_STOP)


def follow(island: Island, token_weighted: bool, on_merged: Callable[[MergeStats], None]) -> None:
    """Ranks > 0: execute rank 0's commands until it says stop."""
    while True:
        cmd, arg = _broadcast_command(0)
        if cmd == CMD_TRAIN:
            _gather_reports(island.train_steps(arg))
        elif cmd == CMD_MERGE:
            on_merged(island.merge(token_weighted))
        elif cmd == CMD_STOP:
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
