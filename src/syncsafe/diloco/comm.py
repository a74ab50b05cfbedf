"""The all-reduce that :class:`~syncsafe.diloco.outer.OuterOptimizer` is given.

Kept apart from the outer step so that the merge arithmetic stays free of
process-group knowledge: tests inject an in-process average, training injects
:func:`torch_all_reduce_mean` over the islands' ``torch.distributed`` group
(gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from syncsafe.diloco.outer import AllReduceMean


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
