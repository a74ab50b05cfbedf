"""The outer-step case both the in-process and the gloo tests check: a two-tensor model,
seeded island deltas standing in for inner steps, and the outer steps computed by hand; the fake
all-reduce of in-process islands."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
from torch import nn

from syncsafe.diloco.outer import AllReduceMean, flatten_parameters

LR = 0.7
MOMENTUM = 0.9


def make_model() -> nn.Module:
    """A small model with two parameter tensors and known initial values."""
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]))
        model.bias.copy_(torch.tensor([0.1, -0.2]))
    return model


def island_delta(island: int, merge: int) -> torch.Tensor:
    """The flat change island ``island`` makes in its inner steps before merge ``merge``."""
    generator = torch.Generator().manual_seed(1000 * merge + island)
    return torch.randn(8, generator=generator, dtype=torch.float64) * (island + 1)


def train_island(model: nn.Module, island: int, merge: int) -> None:
    """Stand-in for H inner steps: local = global + delta."""
    delta = island_delta(island, merge).to(torch.float32)
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(delta[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def hand_outer_steps(
    weights: Sequence[float], num_merges: int, lr: float = LR, momentum: float = MOMENTUM
) -> torch.Tensor:
    """Global parameters after ``num_merges`` merges, computed by hand in float64.

    pg_i = global - local_i = -delta_i; avg = sum w_i pg_i / sum w_i;
    Nesterov (torch SGD, dampening 0): buf = momentum * buf + avg (buf = avg at first);
    global -= lr * (avg + momentum * buf).
    """
    global_params = flatten_parameters(make_model()).to(torch.float64)
    total = sum(weights)
    buf: torch.Tensor | None = None
    for merge in range(num_merges):
        averaged = sum(w * -island_delta(i, merge) for i, w in enumerate(weights)) / total
        buf = averaged.clone() if buf is None else momentum * buf + averaged
        global_params = global_params - lr * (averaged + momentum * buf)
    return global_params


class ThreadedAllReduce:
    """Fake collective: each island's thread deposits its buffer; all get the list's mean."""

    def __init__(self, num_islands: int) -> None:
        self.barrier = threading.Barrier(num_islands, timeout=30)
        self.deposits: list[torch.Tensor | None] = [None] * num_islands
        self.mean: torch.Tensor | None = None

    def for_island(self, island: int) -> AllReduceMean:
        def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
            self.deposits[island] = tensor.clone()
            if self.barrier.wait() == 0:
                self.mean = torch.stack(self.deposits).mean(dim=0)
            self.barrier.wait()
            return self.mean.clone()

        return all_reduce_mean
