"""The all-reduce that :class:`~syncsafe.diloco.outer.OuterOptimizer` is given.

Kept apart from the outer step so that the merge arithmetic stays free of
process-group knowledge: tests inject an in-process average, training injects
:func:`torch_all_reduce_mean` over the islands' ``torch.distributed`` group
(gloo on CPU, NCCL on GPU), or :func:`torch_all_reduce_start`, the same
all-reduce as async work whose result is awaited later (a merge whose islands
train on while it is in flight).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from syncsafe.diloco.outer import AllReduceMean, AllReduceStart


def torch_all_reduce_mean(group: dist.ProcessGroup | None = None, device: torch.device | str | None = None) -> AllReduceMean:
    """An ``all_reduce_mean`` over ``group`` (default: the world).

    ``device`` is where the collective runs: leave it None for gloo (CPU
    tensors); pass the island's CUDA device for NCCL, and the buffer is moved
    there and back.
    """

    def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
        buffer = tensor if device is None else tensor.to(device)
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group)
        buffer.div_(dist.get_world_size(group))
        return buffer

    return all_reduce_mean


def torch_all_reduce_start(group: dist.ProcessGroup | None = None,
                           device: torch.device | str | None = None) -> AllReduceStart:
    """The all-reduce mean of :func:`torch_all_reduce_mean` started as async work (gloo's worker threads or
    NCCL's stream run it beside the next inner steps); the callable returned waits for it.

    The collective runs on a copy (or the device's one), so the buffer passed stays what was sent.
    """

    def start(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
        buffer = tensor.clone() if device is None else tensor.to(device)
        work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=group, async_op=True)
        size = dist.get_world_size(group)

        def wait() -> torch.Tensor:
            work.wait()
            return buffer.div_(size)

        return wait

    return start
