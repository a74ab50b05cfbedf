"""The real-server replay plan: seeds split, span-matched draws, no-sync controls interleaved, nearest controls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import ConfigError, parse_params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.span import span_count
from syncsafe.serving.vllm_plan import (
    check_span_budget,
    nearest_controls,
    replay_order,
    span_draws,
    vllm_controllers,
    vllm_seed_split,
)

SPACE = ActionSpace.of_controller(step_s=5.0, min_h=4, max_h=16, window_s=8.0, duration_s=600.0)


def rows(seed: int, draws: int = 4) -> list[pd.Series]:
    names = ["no_sync", "wa_diloco", *(f"matched_random_span/wa_diloco-{d:03d}" for d in range(draws))]
    return [pd.Series({"source": "no_sync" if n == "no_sync" else "train" if n == "wa_diloco" else "matched_random",
                       "path": f"runs/x/bursty/seed-{seed}/{n}.json"}) for n in names]


def test_no_sync_controls_run_first_between_and_last_and_the_rest_in_a_seeded_shuffle():
    orders = {}
    for seed in range(6):
        order = replay_order("bursty", seed, rows(seed), controls=3)
        controls = [(i, c) for i, (_, c) in enumerate(order) if c is not None]
        assert controls == [(0, 0), (3, 1), (7, 2)], "first, in the middle (5 replays split 2 / 3) and last"
        assert all(r["source"] == "no_sync" for i, _ in controls for r in [order[i][0]])
        assert sum(r["source"] != "no_sync" for r, _ in order) == 5
        again = replay_order("bursty", seed, rows(seed), controls=3)  # seeded
        assert [(r["path"], c) for r, c in again] == [(r["path"], c) for r, c in order]
        orders[seed] = tuple(r["path"].rsplit("/", 1)[1] for r, c in order if c is None)
    assert len(set(orders.values())) > 1  # not the same order on every seed
    four = replay_order("bursty", 0, rows(0, draws=6), controls=4)
    assert [i for i, (_, c) in enumerate(four) if c is not None] == [0, 3, 7, 10]


def test_nearest_controls_by_distance_in_replay_order_the_earlier_on_a_tie():
    positions = {0: 0, 1: 3, 2: 6}
    assert nearest_controls(1, positions) == [0, 1, 2]
    assert nearest_controls(2, positions) == [1, 0, 2]
    assert nearest_controls(5, positions) == [2, 1, 0]
    assert nearest_controls(4, positions)[:2] == [1, 2]
    assert nearest_controls(3, {0: 0, 1: 6}) == [0, 1]  # tie: the earlier control first


def controller(starts: list[float], seed: int = 0) -> Schedule:
    return Schedule(regime="bursty", policy="wa_diloco", seed=seed, source="train", duration_s=600.0, window_s=8.0,
                    min_gap_s=10.0, merge_starts_s=starts)


def test_every_span_draw_works_the_controllers_merge_budget_inside_the_span():
    """Property test: random controllers (from the action space) and spans; every draw count-matched."""
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(60):
        n = int(rng.choice(list(SPACE.merge_counts())))
        ctrl = controller(SPACE.sample(n, rng), seed=trial)
        span = float(rng.uniform(10.0, 600.0))
        for draw in span_draws(ctrl, SPACE, span, draws=3):
            check_span_budget(ctrl, draw, span)
            assert draw.n_merges == ctrl.n_merges and SPACE.contains(draw.merge_starts_s)
            assert span_count(draw.merge_starts_s, 8.0, span) == span_count(ctrl.merge_starts_s, 8.0, span)
            assert (draw.source, draw.matched_to) == ("matched_random", "wa_diloco")
            checked += 1
    assert checked == 180
    ctrl = controller(SPACE.sample(20, np.random.default_rng(1)))
    assert span_draws(ctrl, SPACE, 100.0, 2) == span_draws(ctrl, SPACE, 100.0, 2)  # seeded


def test_a_draw_with_another_budget_in_the_span_is_refused():
    ctrl = controller([20.0, 48.0, 76.0])
    moved = ctrl.model_copy(update={"policy": "matched_random", "source": "matched_random", "draw": 0,
                                    "matched_to": "wa_diloco", "merge_starts_s": [20.0, 100.0, 128.0]})
    with pytest.raises(ValueError, match="not budget-matched in the span"):
        check_span_budget(ctrl, moved, 90.0)
    check_span_budget(ctrl, moved, 30.0)  # one merge in [0, 30) each: matched there


def test_seed_split(raw_params):
    raw_params["seeds"] = [0, 1, 2, 3, 4]
    raw_params["replay"]["vllm"].update({"seeds": None, "fit_seeds": None, "held_out_seeds": None})
    params = parse_params(raw_params)
    assert vllm_seed_split(params) == ([0], [1, 2, 3])
    assert vllm_controllers(params)[0] == params.analysis.primary.policy


def test_fit_and_held_out_seeds_may_not_overlap(raw_params):
    raw_params["replay"]["vllm"].update({"seeds": [0, 1], "fit_seeds": [0], "held_out_seeds": [0, 1]})
    with pytest.raises(ConfigError, match="share \\[0\\]"):
        parse_params(raw_params)


def test_fewer_than_three_no_sync_controls_are_refused(raw_params):
    raw_params["replay"]["vllm"]["no_sync_controls"] = 2
    with pytest.raises(ConfigError, match="no_sync_controls"):
        parse_params(raw_params)
