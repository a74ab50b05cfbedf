"""The outer step over real ``torch.distributed`` gloo processes: two islands, two merges,
token-weighted, against the hand computation (tests/support/outer_case.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from outer_case import LR, MOMENTUM, hand_outer_steps, make_model, train_island
from syncsafe.diloco.comm import torch_all_reduce_mean
from syncsafe.diloco.outer import OuterOptimizer, flatten_parameters



def gloo_island(rank: int, world_size: int, init_file: str, out_dir: str, weights: list[float]) -> None:
    """One island process: two merges over a real gloo process group."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )
    try:
        model = make_model()
        outer = OuterOptimizer(model, num_islands=world_size, lr=LR, momentum=MOMENTUM)
        all_reduce_mean = torch_all_reduce_mean()
        for merge in range(2):
            train_island(model, rank, merge)
            outer.merge(model, all_reduce_mean, weight=weights[rank])
        torch.save(
            {"global": outer.global_flat.detach().clone(), "local": flatten_parameters(model)},
            Path(out_dir) / f"island-{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def spawn_islands(fn: Callable[..., None], nprocs: int, args: tuple, timeout_s: float) -> None:
    """``mp.spawn`` with a deadline: kill the islands rather than hang the test suite."""
    context = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"gloo islands did not finish within {timeout_s} s")


@pytest.mark.slow
def test_gloo_merge_matches_hand_computation_on_every_island(tmp_path: Path) -> None:
    weights = [1.0, 3.0]
    spawn_islands(
        gloo_island,
        nprocs=len(weights),
        args=(len(weights), str(tmp_path / "rendezvous"), str(tmp_path), weights),
        timeout_s=120,
    )
    results = [torch.load(tmp_path / f"island-{rank}.pt") for rank in range(len(weights))]
    expected = hand_outer_steps(weights, num_merges=2).to(torch.float32)
    for result in results:
        assert torch.equal(result["global"], results[0]["global"])
        assert torch.equal(result["local"], result["global"])
        torch.testing.assert_close(result["global"], expected, rtol=1e-5, atol=1e-6)
