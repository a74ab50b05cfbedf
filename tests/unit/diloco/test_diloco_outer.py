"""Outer step: pseudo-gradient sign, (weighted) averaging and Nesterov momentum, by hand.

Islands are simulated in-process (threads meeting in a fake all-reduce); the same
case over real ``torch.distributed`` gloo processes: tests/integration/test_outer_gloo.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn

from outer_case import LR, MOMENTUM, ThreadedAllReduce, hand_outer_steps, island_delta, make_model, train_island
from syncsafe.diloco.outer import (
    MergeStats,
    OuterOptimizer,
    blocking_start,
    flatten_parameters,
    ring_all_reduce_bytes,
)


def merge_all(
    outers: Sequence[OuterOptimizer], models: Sequence[nn.Module], weights: Sequence[float]
) -> list[MergeStats]:
    """Run one merge on every simulated island concurrently."""
    collective = ThreadedAllReduce(len(outers))
    with ThreadPoolExecutor(max_workers=len(outers)) as pool:
        futures = [
            pool.submit(outer.merge, model, collective.for_island(i), weight)
            for i, (outer, model, weight) in enumerate(zip(outers, models, weights))
        ]
        return [future.result(timeout=60) for future in futures]


def simulate(weights: Sequence[float], num_merges: int) -> tuple[list[OuterOptimizer], list[nn.Module]]:
    models = [make_model() for _ in weights]
    outers = [OuterOptimizer(model, num_islands=len(weights), lr=LR, momentum=MOMENTUM) for model in models]
    for merge in range(num_merges):
        for island, model in enumerate(models):
            train_island(model, island, merge)
        merge_all(outers, models, weights)
    return outers, models


# --------------------------------------------------------------------------- in-process


def test_pseudo_gradient_is_global_minus_local() -> None:
    model = make_model()
    outer = OuterOptimizer(model, num_islands=2)
    train_island(model, island=0, merge=0)
    expected = -island_delta(0, 0).to(torch.float32)
    torch.testing.assert_close(outer.pseudo_gradient(model), expected)


def test_plain_sgd_step_moves_global_to_island_average() -> None:
    """lr 1, no momentum: global - mean(pg) is exactly the mean of the islands' weights."""
    models = [make_model() for _ in range(3)]
    outers = [OuterOptimizer(m, num_islands=3, lr=1.0, momentum=0.0, nesterov=False) for m in models]
    for island, model in enumerate(models):
        train_island(model, island, merge=0)
    island_average = torch.stack([flatten_parameters(m) for m in models]).mean(dim=0)
    merge_all(outers, models, [1.0, 1.0, 1.0])
    for outer, model in zip(outers, models):
        torch.testing.assert_close(outer.global_flat.detach(), island_average)
        torch.testing.assert_close(flatten_parameters(model), island_average)


@pytest.mark.parametrize("num_islands", [2, 3])
def test_nesterov_over_two_merges_matches_hand_computation(num_islands: int) -> None:
    weights = [1.0] * num_islands
    outers, models = simulate(weights, num_merges=2)
    expected = hand_outer_steps(weights, num_merges=2).to(torch.float32)
    for outer, model in zip(outers, models):
        torch.testing.assert_close(outer.global_flat.detach(), expected, rtol=1e-5, atol=1e-6)
        assert torch.equal(flatten_parameters(model), outer.global_flat.detach())
    assert all(torch.equal(o.global_flat, outers[0].global_flat) for o in outers)


def test_second_merge_uses_the_momentum_buffer() -> None:
    """Without momentum the second merge lands elsewhere: the buffer really is carried."""
    weights = [1.0, 1.0]
    outers, _ = simulate(weights, num_merges=2)
    with_momentum = hand_outer_steps(weights, 2).to(torch.float32)
    no_momentum = hand_outer_steps(weights, 2, momentum=0.0).to(torch.float32)
    torch.testing.assert_close(outers[0].global_flat.detach(), with_momentum, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(outers[0].global_flat.detach(), no_momentum, atol=1e-3)


def test_token_weighting() -> None:
    tokens = [100.0, 300.0, 600.0]
    outers, _ = simulate(tokens, num_merges=2)
    expected = hand_outer_steps(tokens, num_merges=2).to(torch.float32)
    torch.testing.assert_close(outers[0].global_flat.detach(), expected, rtol=1e-5, atol=1e-6)
    unweighted = hand_outer_steps([1.0, 1.0, 1.0], num_merges=2).to(torch.float32)
    assert not torch.allclose(expected, unweighted, atol=1e-3)


def test_zero_total_weight_is_rejected() -> None:
    models = [make_model(), make_model()]
    outers = [OuterOptimizer(m, num_islands=2) for m in models]
    with pytest.raises(ValueError, match="weights sum"):
        merge_all(outers, models, [0.0, 0.0])


def test_merge_stats_report_ring_cost_and_time() -> None:
    models = [make_model(), make_model()]
    outers = [OuterOptimizer(m, num_islands=2) for m in models]
    stats = merge_all(outers, models, [1.0, 1.0])[0]
    payload = (8 + 1) * 4  # 8 fp32 parameters + the weight slot
    assert stats.payload_bytes == payload
    assert stats.bytes_communicated == ring_all_reduce_bytes(payload, 2) == payload
    assert ring_all_reduce_bytes(1000, 4) == 1500
    assert ring_all_reduce_bytes(1000, 1) == 0
    assert stats.wall_time_s > 0
    assert stats.merge_index == 0 and stats.to_dict()["num_islands"] == 2


def test_state_dict_round_trip_continues_identically() -> None:
    weights = [1.0, 1.0]
    outers, models = simulate(weights, num_merges=1)
    restored = [OuterOptimizer(make_model(), num_islands=2) for _ in weights]
    for source, target in zip(outers, restored):
        target.load_state_dict(source.state_dict())
        assert target.merges_done == 1
    for island, model in enumerate(models):
        train_island(model, island, merge=1)
    restored_models = [make_model() for _ in weights]
    for model, source in zip(restored_models, models):
        model.load_state_dict(source.state_dict())
    merge_all(outers, models, weights)
    merge_all(restored, restored_models, weights)
    assert torch.equal(outers[0].global_flat, restored[0].global_flat)


def test_state_dict_for_another_model_is_rejected() -> None:
    state = OuterOptimizer(make_model(), num_islands=2).state_dict()
    with pytest.raises(ValueError, match="different model"):
        OuterOptimizer(nn.Linear(4, 2), num_islands=2).load_state_dict(state)


@pytest.mark.parametrize("weight", [-1.0, float("inf"), float("nan")])
def test_invalid_weight_is_rejected_before_communicating(weight: float) -> None:
    def must_not_communicate(tensor: torch.Tensor) -> torch.Tensor:
        raise AssertionError("all-reduce called with an invalid weight")

    with pytest.raises(ValueError, match="weight"):
        OuterOptimizer(make_model(), num_islands=2).merge(make_model(), must_not_communicate, weight)


def test_a_merge_applied_later_or_relaunched_from_its_state_takes_the_same_outer_step() -> None:
    """launch + apply is the outer step with the local model left alone; a checkpointed launch, sent again
    after a restart, gives the same global parameters; finish is apply plus the local reset of merge."""
    weights = [1.0, 2.0]
    outers, models = simulate(weights, num_merges=0)
    for island, model in enumerate(models):
        train_island(model, island, merge=0)
    locals_before = [flatten_parameters(model) for model in models]
    reference = [OuterOptimizer(make_model(), num_islands=2) for _ in weights]
    reference_models = [make_model() for _ in weights]
    for model, source in zip(reference_models, models):
        model.load_state_dict(source.state_dict())
    merge_all(reference, reference_models, weights)

    def run_all(step):
        with ThreadPoolExecutor(max_workers=2) as pool:
            return [f.result(timeout=60) for f in [pool.submit(step, i) for i in range(2)]]

    collective = ThreadedAllReduce(2)
    pending = run_all(lambda i: outers[i].launch(models[i], blocking_start(collective.for_island(i)), weights[i],
                                                 apply_step=7))
    assert [p.index for p in pending] == [0, 0] and all(o.merges_launched == 1 and o.merges_done == 0 for o in outers)
    saved = [p.state() for p in pending]
    assert saved[0]["apply_step"] == 7
    stats = [outer.apply(p) for outer, p in zip(outers, pending)]
    assert all(o.merges_done == 1 for o in outers) and stats[0].merge_index == 0
    assert torch.equal(outers[0].global_flat, reference[0].global_flat)
    assert all(torch.equal(flatten_parameters(m), before) for m, before in zip(models, locals_before))

    restarted = [OuterOptimizer(make_model(), num_islands=2) for _ in weights]
    again = ThreadedAllReduce(2)
    relaunched = run_all(lambda i: restarted[i].relaunch(saved[i], blocking_start(again.for_island(i))))
    finished = [outer.finish(model, p) for outer, model, p in zip(restarted, models, relaunched)]
    assert torch.equal(restarted[1].global_flat, reference[1].global_flat)
    assert torch.equal(flatten_parameters(models[1]), flatten_parameters(reference_models[1]))
    assert finished[1].averaged_pseudo_gradient_norm == pytest.approx(stats[1].averaged_pseudo_gradient_norm)


def test_a_relaunch_of_another_models_sync_is_rejected() -> None:
    model = make_model()
    pending = OuterOptimizer(model, num_islands=1).launch(model, blocking_start(lambda t: t.clone()))
    state = {**pending.state(), "sent": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"checkpointed sync of fragment 0 sent \(3,\)"):
        OuterOptimizer(make_model(), num_islands=1).relaunch(state, blocking_start(lambda t: t.clone()))
