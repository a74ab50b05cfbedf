"""The real-server replay plan: seeds split, span-matched draws, no-sync controls interleaved, nearest controls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import ConfigError, parse_params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.span import span_count
from syncsafe.realarm.design import (
    check_span_budget,
    block_order,
    seed_block,
    default_fit_count,
    nearest_controls,
    span_cadence,
    span_draws,
    vllm_controllers,
    vllm_regimes,
    vllm_seed_split,
)

SPACE = ActionSpace.of_controller(step_s=5.0, min_h=4, max_h=16, window_s=8.0, duration_s=600.0)


def rows(seed: int, draws: int = 4) -> list[pd.Series]:
    names = ["no_sync", "wa_diloco", *(f"matched_random_span/wa_diloco-{d:03d}" for d in range(draws))]
    return [pd.Series({"source": "no_sync" if n == "no_sync" else "train" if n == "wa_diloco" else "matched_random",
                       "path": f"runs/x/bursty/seed-{seed}/{n}.json"}) for n in names]


def test_each_seed_is_one_block_of_rounds_each_with_a_control_the_blocks_in_a_seeded_order():
    by_seed = {seed: rows(seed, draws=5) for seed in range(4)}  # per seed: controller + 5 draws + no-sync
    order = block_order("bursty", by_seed, rounds=3)
    assert len(order) == 4 * (6 + 3)
    seeds = [o.seed for o in order]
    blocks = list(dict.fromkeys(seeds))
    assert sorted(blocks) == [0, 1, 2, 3]
    orders = {tuple(dict.fromkeys(o.seed for o in block_order(r, by_seed, 3))) for r in ("bursty", "steady", "azure")}
    assert len(orders) > 1, "the seeds' blocks in a seeded order, per regime"
    assert seeds == [s for s in blocks for _ in range(9)], "a seed's block is contiguous: a unit of its own"
    for seed in range(4):
        mine = [o for o in order if o.seed == seed]
        assert [o.round for o in mine] == sorted(o.round for o in mine), "rounds one after the other"
        for k in range(3):
            inside = [o for o in mine if o.round == k]
            assert [o.control for o in inside if o.control is not None] == [k]  # one control per round
            assert sum(o.control is None for o in inside) == 2  # 6 replays with merges dealt over 3 rounds
        merged = sorted(o.row["path"] for o in mine if o.control is None)  # each replay with merges once
        assert merged == sorted(r["path"] for r in by_seed[seed] if r["source"] != "no_sync")
        assert seed_block("bursty", seed, by_seed[seed], 3) == mine, "a block does not depend on the others"
    again = block_order("bursty", by_seed, rounds=3)
    assert [(o.seed, o.row["path"], o.control) for o in again] == [(o.seed, o.row["path"], o.control) for o in order]
    controls_at = [i for i, o in enumerate(order[:9]) if o.control is not None]
    assert controls_at != [0, 1, 2], "the controls spread over the block, not run first"
    assert [o.row["path"] for o in block_order("steady", by_seed, 3)] != [o.row["path"] for o in order]  # per regime
    with pytest.raises(ValueError, match="expected one no_sync"):
        block_order("bursty", {0: rows(0)[1:]}, 3)
    with pytest.raises(ValueError, match="at least one round"):
        block_order("bursty", by_seed, 0)


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
    assert vllm_seed_split(params) == ([0], [1])  # the first two: one fitted on, one held out
    five = parse_params({**raw_params, "replay": {**raw_params["replay"],
                                                   "vllm": {**raw_params["replay"]["vllm"], "seeds": [0, 1, 2, 3]}}})
    assert vllm_seed_split(five) == ([0, 1], [2, 3])  # half fitted on, half held out
    three = parse_params({**raw_params, "replay": {**raw_params["replay"],
                                                    "vllm": {**raw_params["replay"]["vllm"], "seeds": [2, 3, 4]}}})
    assert vllm_seed_split(three) == ([2, 3], [4])  # two fit seeds as soon as one is left to hold out
    assert [default_fit_count(n) for n in (1, 2, 3, 4, 6, 10)] == [1, 1, 2, 2, 3, 5]
    assert vllm_controllers(params)[0] == params.analysis.primary.policy


def test_the_primary_regime_is_always_planned_first(raw_params):
    raw_params["replay"]["vllm"]["regimes"] = ["azure_conv", "steady"]
    raw_params["analysis"]["primary"]["regime"] = "steady"
    assert vllm_regimes(parse_params(raw_params)) == ["steady", "azure_conv"]
    raw_params["analysis"]["primary"]["regime"] = "bursty"  # not listed: planned all the same
    assert vllm_regimes(parse_params(raw_params)) == ["bursty", "azure_conv", "steady"]


def test_the_span_cadence_has_the_controllers_counts_and_is_the_most_even_such_schedule():
    rng = np.random.default_rng(3)
    for trial in range(40):
        n = int(rng.choice([c for c in SPACE.merge_counts() if c > 0]))
        ctrl = controller(SPACE.sample(n, rng), seed=trial)
        span = float(rng.uniform(40.0, 600.0))
        even = span_cadence(ctrl, SPACE, span)
        check_span_budget(ctrl, even, span)
        assert SPACE.contains(even.merge_starts_s) and (even.source, even.matched_to) == ("even_cadence", "wa_diloco")
        gaps = np.diff([0.0, *even.merge_starts_s])
        for draw in span_draws(ctrl, SPACE, span, draws=3):  # no count-matched draw is more even
            assert np.ptp(gaps) <= np.ptp(np.diff([0.0, *draw.merge_starts_s])) + 1e-9
    whole = controller(SPACE.starts(SPACE.evenly_spaced_gaps(6)))
    assert span_cadence(whole, SPACE, 600.0).merge_starts_s == whole.merge_starts_s  # span = trace: fixed cadence


def test_fit_and_held_out_seeds_may_not_overlap(raw_params):
    raw_params["replay"]["vllm"].update({"seeds": [0, 1], "fit_seeds": [0], "held_out_seeds": [0, 1]})
    with pytest.raises(ConfigError, match="share \\[0\\]"):
        parse_params(raw_params)


def test_fewer_than_three_no_sync_controls_are_refused(raw_params):
    raw_params["replay"]["vllm"]["no_sync_controls"] = 2
    with pytest.raises(ConfigError, match="no_sync_controls"):
        parse_params(raw_params)
