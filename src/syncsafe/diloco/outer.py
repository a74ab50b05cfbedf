"""The DiLoCo outer step: pseudo-gradient averaging and an outer Nesterov SGD step.

Each island keeps a copy of the *global* parameters (the state after the last
merge, fp32 on CPU). At a merge every island

1. computes its pseudo-gradient ``pg_i = global - local_i`` (so an SGD step
   ``global - lr * pg`` moves toward the islands' average),
2. averages pseudo-gradients across islands, optionally weighted by the
   tokens each island trained on, with **one** all-reduce of a flat buffer,
3. sets the averaged pseudo-gradient as ``.grad`` of the global parameters and
   takes a ``torch.optim.SGD(nesterov=True)`` step (defaults lr 0.7,
   momentum 0.9),
4. overwrites its local parameters with the new global ones.

The module knows nothing about process groups: the caller injects
``all_reduce_mean(tensor) -> tensor`` (see :mod:`syncsafe.diloco.comm` for the
``torch.distributed`` one). Every island runs the same arithmetic on the same
reduced buffer, so global parameters stay bit-identical across islands.

The global parameters are held as one flat fp32 vector (a single
``nn.Parameter``). SGD is elementwise, so this is the same update as one SGD
over per-tensor copies, with one optimizer kernel and no (un)flatten of the
global side; named per-tensor views are available for export.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

AllReduceMean = Callable[[torch.Tensor], torch.Tensor]

DEFAULT_OUTER_LR = 0.7
DEFAULT_OUTER_MOMENTUM = 0.9
STATE_FORMAT = "syncsafe.diloco.outer/1"


@dataclass(frozen=True)
class MergeStats:
    """What one merge cost and did (for the decision log and the cost model)."""

    merge_index: int
    num_islands: int
    weight: float
    payload_bytes: int
    bytes_communicated: int
    wall_time_s: float
    local_pseudo_gradient_norm: float
    averaged_pseudo_gradient_norm: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of a model's parameters inside one flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParameterLayout:
        named = list(model.named_parameters())
        return cls(tuple(name for name, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(shape).numel()) for shape in self.shapes)

    @property
    def total(self) -> int:
        return sum(self.numels)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-parameter views into ``flat`` (no copy)."""
        pieces = torch.split(flat, list(self.numels))
        return {name: piece.view(shape) for name, shape, piece in zip(self.names, self.shapes, pieces)}


def ring_all_reduce_bytes(payload_bytes: int, num_islands: int) -> int:
    """Bytes each island sends in a ring all-reduce of ``payload_bytes``: 2·n·(W−1)/W."""
    if num_islands < 1:
        raise ValueError(f"num_islands must be >= 1, got {num_islands}")
    return round(2 * payload_bytes * (num_islands - 1) / num_islands)


def flatten_parameters(model: nn.Module, out: torch.Tensor | None = None) -> torch.Tensor:
    """All parameters of ``model`` as one fp32 CPU vector (into ``out`` when given)."""
    params = [p.detach().reshape(-1) for p in model.parameters()]
    if out is None:
        return torch.cat([p.to(device="cpu", dtype=torch.float32) for p in params])
    offset = 0
    for p in params:
        out[offset : offset + p.numel()].copy_(p)
        offset += p.numel()
    return out


def assign_parameters(model: nn.Module, flat: torch.Tensor) -> None:
    """Overwrite ``model``'s parameters from a flat vector (casting to their dtype/device)."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if total != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} elements, model has {total}")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


class OuterOptimizer:
    """Global parameters of one island plus the outer Nesterov SGD that updates them."""

    def __init__(
        self,
        model: nn.Module,
        num_islands: int,
        lr: float = DEFAULT_OUTER_LR,
        momentum: float = DEFAULT_OUTER_MOMENTUM,
        nesterov: bool = True,
    ) -> None:
        if num_islands < 1:
            raise ValueError(f"num_islands must be >= 1, got {num_islands}")
        self.layout = ParameterLayout.of(model)
        self.num_islands = num_islands
        self.global_flat = nn.Parameter(flatten_parameters(model))
        self.sgd = torch.optim.SGD([self.global_flat], lr=lr, momentum=momentum, nesterov=nesterov)
        self.merges_done = 0
        # Reused each merge: weighted pseudo-gradient followed by the weight itself.
        self._send_buffer = torch.empty(self.layout.total + 1, dtype=torch.float32)

    @property
    def payload_bytes(self) -> int:
        """Size of the single all-reduce buffer of one merge."""
        return self._send_buffer.numel() * self._send_buffer.element_size()

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The global parameters by name (views; copy before mutating)."""
        return self.layout.views(self.global_flat.detach())

    def pseudo_gradient(self, local_model: nn.Module) -> torch.Tensor:
        """``global - local`` as a flat fp32 vector."""
        return self.global_flat.detach() - flatten_parameters(local_model)

    def merge(self, local_model: nn.Module, all_reduce_mean: AllReduceMean, weight: float = 1.0) -> MergeStats:
        """Average pseudo-gradients across islands, take the outer step, reset the local model.

        ``weight`` is this island's share before normalisation (e.g. tokens
        trained since the last merge; equal weights give the plain mean). The
        buffer sent is ``[weight * pg, weight]``, so after ``all_reduce_mean``
        the averaged pseudo-gradient is ``sum_i w_i pg_i / sum_i w_i`` from a
        single collective. Every island must call this together.
        """
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"merge weight must be finite and >= 0, got {weight}")
        started = time.perf_counter()
        n = self.layout.total
        pseudo_gradient = self._send_buffer[:n]
        flatten_parameters(local_model, out=pseudo_gradient)
        torch.sub(self.global_flat.detach(), pseudo_gradient, out=pseudo_gradient)
        local_norm = float(pseudo_gradient.norm())
        pseudo_gradient.mul_(weight)
        self._send_buffer[n] = weight

        reduced = all_reduce_mean(self._send_buffer).to(device="cpu", dtype=torch.float32)
        averaged = self._average_from(reduced)

        self.global_flat.grad = averaged
        self.sgd.step()
        self.global_flat.grad = None
        assign_parameters(local_model, self.global_flat.detach())
        self.merges_done += 1
        return MergeStats(
            merge_index=self.merges_done - 1,
            num_islands=self.num_islands,
            weight=float(weight),
            payload_bytes=self.payload_bytes,
            bytes_communicated=ring_all_reduce_bytes(self.payload_bytes, self.num_islands),
            wall_time_s=time.perf_counter() - started,
            local_pseudo_gradient_norm=local_norm,
            averaged_pseudo_gradient_norm=float(averaged.norm()),
        )

    def _average_from(self, reduced: torch.Tensor) -> torch.Tensor:
        n = self.layout.total
        if reduced.shape != (n + 1,):
            raise ValueError(f"all_reduce_mean returned shape {tuple(reduced.shape)}, expected ({n + 1},)")
        mean_weight = float(reduced[n])
        if not mean_weight > 0.0:
            raise ValueError(f"merge weights sum to {mean_weight * self.num_islands}; at least one island must weigh > 0")
        return reduced[:n] / mean_weight

    def state_dict(self) -> dict[str, Any]:
        """Global parameters, momentum buffer and counters, for checkpoints (copies, not views)."""
        return {
            "format": STATE_FORMAT,
            "names": list(self.layout.names),
            "shapes": [list(shape) for shape in self.layout.shapes],
            "num_islands": self.num_islands,
            "merges_done": self.merges_done,
            "global_flat": self.global_flat.detach().clone(),
            "sgd": copy.deepcopy(self.sgd.state_dict()),
        }

    def load_state_dict(self, state: Mapping[str, Any], islands_may_change: bool = False) -> None:
        """Restore from :meth:`state_dict`; the model layout and (unless allowed) the island count must match.

        ``islands_may_change`` is for continuing on the surviving islands after
        one is lost: the global state is the same on every island, only the
        number averaged over from now on differs.
        """
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not an outer optimizer state (format {state.get('format')!r})")
        saved_layout = ParameterLayout(tuple(state["names"]), tuple(tuple(s) for s in state["shapes"]))
        if saved_layout != self.layout:
            raise ValueError("outer optimizer state was saved for a different model (parameter names/shapes differ)")
        if state["num_islands"] != self.num_islands and not islands_may_change:
            raise ValueError(f"outer state is for {state['num_islands']} islands, this run has {self.num_islands}")
        with torch.no_grad():
            self.global_flat.copy_(state["global_flat"])
        # deepcopy: torch would otherwise alias the caller's momentum buffers.
        self.sgd.load_state_dict(copy.deepcopy(state["sgd"]))
        self.merges_done = int(state["merges_done"])
