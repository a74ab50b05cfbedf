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

The global parameters are held as one flat fp32 vector. SGD is elementwise,
so this is the same update as one SGD over per-tensor copies, with one
optimizer kernel and no (un)flatten of the global side; named per-tensor views
are available for export.

Streaming DiLoCo (`train.sync.mode: streaming`) merges one *fragment*
(`syncsafe.diloco.fragments`) per sync event: each fragment is a contiguous
range of the flat vector with its own ``nn.Parameter`` view (so its own
momentum) and its own all-reduce buffer; a merge of fragment f touches that
range alone. One fragment is the whole model: the same arithmetic, byte for
byte, as the full merge. A merge is `launch` (pseudo-gradient, all-reduce
started) then `finish` (average, outer step, local update), which mixes the
fragment's local parameters with the new global ones
(``local = alpha * local + (1 - alpha) * global``; alpha 0 overwrites them).
Between the two the islands may train on (`fragment_sync_delay`); `apply` is
the outer step alone, for an overlapped merge whose islands set their local
parameters themselves (`syncsafe.diloco.islands`). A launched merge's state
(`PendingSync.state`) goes into a checkpoint and is launched again on resume.
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

from syncsafe.diloco.fragments import Fragment, cut_fragments

AllReduceMean = Callable[[torch.Tensor], torch.Tensor]
#: Starts an all-reduce mean of a tensor; the callable it returns waits for the result (`blocking_start`).
AllReduceStart = Callable[[torch.Tensor], Callable[[], torch.Tensor]]

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
    #: The fragment merged (0: the whole model when there is one).
    fragment: int = 0
    #: The island's inner step when the outer step was applied (-1: not known here; the islands set it).
    applied_step: int = -1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PendingSync:
    """A launched merge of one fragment: its all-reduce in flight until `OuterOptimizer.finish` (or `apply`)."""

    fragment: int
    wait: Callable[[], torch.Tensor]
    weight: float
    local_norm: float
    started: float
    #: The buffer sent (this island's weighted pseudo-gradient and weight), kept intact for a checkpoint.
    sent: torch.Tensor
    #: The merge's ordinal among all merges launched (0 first).
    index: int
    #: The inner step at which its outer step is applied (the launch step when it is applied at once).
    apply_step: int

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: enough to launch the same all-reduce again on resume."""
        return {"fragment": self.fragment, "sent": self.sent.clone(), "weight": self.weight,
                "local_norm": self.local_norm, "index": self.index, "apply_step": self.apply_step}


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


def blocking_start(all_reduce_mean: AllReduceMean) -> AllReduceStart:
    """A blocking all-reduce as a started one whose result is ready at once."""
    def start(buffer: torch.Tensor) -> Callable[[], torch.Tensor]:
        reduced = all_reduce_mean(buffer)
        return lambda: reduced

    return start


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


def _flatten_range(model: nn.Module, fragment: Fragment, out: torch.Tensor) -> torch.Tensor:
    """`fragment`'s parameters of ``model`` as one flat fp32 vector, into ``out``."""
    offset = 0
    for p in list(model.parameters())[fragment.first_param : fragment.end_param]:
        out[offset : offset + p.numel()].copy_(p.detach().reshape(-1))
        offset += p.numel()
    return out


def _assign_range(model: nn.Module, fragment: Fragment, flat: torch.Tensor) -> None:
    """Overwrite `fragment`'s parameters of ``model`` from its flat range."""
    offset = 0
    with torch.no_grad():
        for p in list(model.parameters())[fragment.first_param : fragment.end_param]:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


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
    """Global parameters of one island plus the outer Nesterov SGD that updates them, fragment by fragment."""

    def __init__(
        self,
        model: nn.Module,
        num_islands: int,
        lr: float = DEFAULT_OUTER_LR,
        momentum: float = DEFAULT_OUTER_MOMENTUM,
        nesterov: bool = True,
        fragments: int = 1,
    ) -> None:
        if num_islands < 1:
            raise ValueError(f"num_islands must be >= 1, got {num_islands}")
        self.layout = ParameterLayout.of(model)
        self.num_islands = num_islands
        self.fragments: list[Fragment] = cut_fragments(self.layout.names, self.layout.numels, fragments)
        self.global_flat = flatten_parameters(model)
        #: One leaf view of `global_flat` per fragment: the outer step updates the flat vector in place.
        self.fragment_params = [nn.Parameter(self.global_flat[f.start:f.end]) for f in self.fragments]
        self.sgd = torch.optim.SGD(self.fragment_params, lr=lr, momentum=momentum, nesterov=nesterov)
        #: Merges whose outer step is applied, and merges launched (ahead by those still in flight).
        self.merges_done = 0
        self.merges_launched = 0
        # Reused each merge of a fragment: its weighted pseudo-gradient followed by the weight itself.
        self._send_buffers = [torch.empty(f.numel + 1, dtype=torch.float32) for f in self.fragments]

    def payload_bytes_of(self, fragment: int = 0) -> int:
        """Size of the one all-reduce buffer of a merge of `fragment`."""
        buffer = self._send_buffers[fragment]
        return buffer.numel() * buffer.element_size()

    @property
    def payload_bytes(self) -> int:
        """Size of the all-reduce buffer of a whole-model merge (the first fragment's when there are several)."""
        return self.payload_bytes_of(0)

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The global parameters by name (views; copy before mutating)."""
        return self.layout.views(self.global_flat.detach())

    def pseudo_gradient(self, local_model: nn.Module) -> torch.Tensor:
        """``global - local`` as a flat fp32 vector."""
        return self.global_flat.detach() - flatten_parameters(local_model)

    def merge(self, local_model: nn.Module, all_reduce_mean: AllReduceMean, weight: float = 1.0,
              fragment: int = 0) -> MergeStats:
        """Average pseudo-gradients across islands, take the outer step, reset the local model (`fragment` of it).

        ``weight`` is this island's share before normalisation (e.g. tokens
        trained since the last merge; equal weights give the plain mean). The
        buffer sent is ``[weight * pg, weight]``, so after ``all_reduce_mean``
        the averaged pseudo-gradient is ``sum_i w_i pg_i / sum_i w_i`` from a
        single collective. Every island must call this together.
        """
        return self.finish(local_model, self.launch(local_model, blocking_start(all_reduce_mean), weight, fragment))

    def launch(self, local_model: nn.Module, start: AllReduceStart, weight: float = 1.0, fragment: int = 0,
               reference: torch.Tensor | None = None, apply_step: int = 0) -> PendingSync:
        """The merge of `fragment` up to its all-reduce: this island's weighted pseudo-gradient, sent.

        The pseudo-gradient is ``reference - local`` over the fragment's range; `reference` defaults to the
        global parameters (an overlapped merge passes the local parameters its round started from).
        """
        if not (math.isfinite(weight) and weight >= 0.0):
            raise ValueError(f"merge weight must be finite and >= 0, got {weight}")
        started = time.perf_counter()
        frag = self.fragments[fragment]
        buffer = self._send_buffers[fragment]
        pseudo_gradient = buffer[: frag.numel]
        _flatten_range(local_model, frag, pseudo_gradient)
        base = self.global_flat.detach() if reference is None else reference
        torch.sub(base[frag.start : frag.end], pseudo_gradient, out=pseudo_gradient)
        local_norm = float(pseudo_gradient.norm())
        pseudo_gradient.mul_(weight)
        buffer[frag.numel] = weight
        index = self.merges_launched
        self.merges_launched += 1
        return PendingSync(fragment, start(buffer), float(weight), local_norm, started, buffer, index, apply_step)

    def relaunch(self, state: Mapping[str, Any], start: AllReduceStart) -> PendingSync:
        """A checkpointed launched merge (`PendingSync.state`), its all-reduce started again (on resume)."""
        fragment = int(state["fragment"])
        buffer = self._send_buffers[fragment]
        if tuple(state["sent"].shape) != tuple(buffer.shape):
            raise ValueError(f"checkpointed sync of fragment {fragment} sent {tuple(state['sent'].shape)}, "
                             f"this model's buffer is {tuple(buffer.shape)}")
        buffer.copy_(state["sent"])
        return PendingSync(fragment, start(buffer), float(state["weight"]), float(state["local_norm"]),
                           time.perf_counter(), buffer, int(state["index"]), int(state["apply_step"]))

    def apply(self, pending: PendingSync) -> MergeStats:
        """The outer step of a launched merge: wait for its average and update the fragment's global range.

        The local parameters are left as they are (`finish` sets them; an overlapped merge sets them itself).
        """
        frag = self.fragments[pending.fragment]
        reduced = pending.wait().to(device="cpu", dtype=torch.float32)
        averaged = self._average_from(reduced, frag.numel)
        param = self.fragment_params[pending.fragment]
        param.grad = averaged
        self.sgd.step()
        param.grad = None
        self.merges_done += 1
        return self.stats_of(pending, wall_time_s=time.perf_counter() - pending.started,
                             averaged_norm=float(averaged.norm()))

    def stats_of(self, pending: PendingSync, wall_time_s: float = 0.0, averaged_norm: float = float("nan"),
                 applied_step: int = -1) -> MergeStats:
        """A launched merge's statistics; before its outer step (the defaults) no averaged pseudo-gradient yet."""
        payload = self.payload_bytes_of(pending.fragment)
        return MergeStats(
            merge_index=pending.index,
            num_islands=self.num_islands,
            weight=pending.weight,
            payload_bytes=payload,
            bytes_communicated=ring_all_reduce_bytes(payload, self.num_islands),
            wall_time_s=wall_time_s,
            local_pseudo_gradient_norm=pending.local_norm,
            averaged_pseudo_gradient_norm=averaged_norm,
            fragment=pending.fragment,
            applied_step=applied_step,
        )

    def finish(self, local_model: nn.Module, pending: PendingSync, alpha: float = 0.0) -> MergeStats:
        """The rest of a launched merge: the averaged pseudo-gradient, the outer step of its fragment, and the
        fragment's local parameters set to ``alpha * local + (1 - alpha) * global`` (alpha 0: the global ones)."""
        stats = self.apply(pending)
        frag = self.fragments[pending.fragment]
        merged = self.global_flat.detach()[frag.start : frag.end]
        if alpha:
            merged = alpha * _flatten_range(local_model, frag, torch.empty(frag.numel)) + (1.0 - alpha) * merged
        _assign_range(local_model, frag, merged)
        return stats

    def _average_from(self, reduced: torch.Tensor, n: int) -> torch.Tensor:
        if reduced.shape != (n + 1,):
            raise ValueError(f"all_reduce_mean returned shape {tuple(reduced.shape)}, expected ({n + 1},)")
        mean_weight = float(reduced[n])
        if not mean_weight > 0.0:
            raise ValueError(f"merge weights sum to {mean_weight * self.num_islands}; at least one island must weigh > 0")
        return reduced[:n] / mean_weight

    def state_dict(self) -> dict[str, Any]:
        """Global parameters, momentum buffers and counters, for checkpoints (copies, not views)."""
        return {
            "format": STATE_FORMAT,
            "fragments": len(self.fragments),
            "names": list(self.layout.names),
            "shapes": [list(shape) for shape in self.layout.shapes],
            "num_islands": self.num_islands,
            "merges_done": self.merges_done,
            "merges_launched": self.merges_launched,
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
        if state.get("fragments", 1) != len(self.fragments):
            raise ValueError(f"outer state is for {state.get('fragments', 1)} fragment(s), this run has "
                             f"{len(self.fragments)} (train.sync.fragments)")
        if state["num_islands"] != self.num_islands and not islands_may_change:
            raise ValueError(f"outer state is for {state['num_islands']} islands, this run has {self.num_islands}")
        with torch.no_grad():
            self.global_flat.copy_(state["global_flat"])
        # deepcopy: torch would otherwise alias the caller's momentum buffers.
        self.sgd.load_state_dict(copy.deepcopy(state["sgd"]))
        self.merges_done = int(state["merges_done"])
        self.merges_launched = int(state["merges_launched"])
