"""Sizing the real arm's plan: power from simulated planned replays, the budget, and informative spans."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from syncsafe.control.serving_model import Calibration
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.span import span_count
from syncsafe.realarm.gate import gate_statistic
from syncsafe.realarm.sizing import (
    PlanError,
    RegimeDesign,
    SeedInputs,
    expected_pairs,
    floor_met,
    nominal_lives,
    informative,
    plan_power,
    realisations,
    size_plans,
    wall_s,
)

pytestmark = pytest.mark.slow  # each plan evaluates the power of several spans (about a minute in all)

SPACE = ActionSpace.of_controller(step_s=5.0, min_h=4, max_h=16, window_s=8.0, duration_s=240.0)
SERVER = Calibration(iter_base_ms=3.0, prefill_ms_per_token=0.01, decode_ms_per_seq=0.3, merge_compute_share=0.7,
                     pressure_slowdown=0.0, residual_sigma=0.0)


def seed_inputs(seed: int) -> SeedInputs:
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, 240.0, 0.5)
    timeline = pd.DataFrame({"t_s": t, "busy": False, "arrival_rate": 4.0, "inference_pressure": 0.2,
                             "network_pressure": 0.1, "checkpoint_pressure": 0.0})
    arrival = np.sort(rng.uniform(0.0, 240.0, 960))
    requests = pd.DataFrame({"arrival_s": arrival, "prompt_tokens": 48, "output_tokens": 24})
    make = lambda policy, source, starts: Schedule(  # noqa: E731
        regime="bursty", policy=policy, seed=seed, source=source, duration_s=240.0, window_s=8.0, min_gap_s=10.0,
        merge_starts_s=starts)
    controllers = {"primary": make("primary", "train", SPACE.sample(6, rng)),
                   "second": make("second", "train", SPACE.sample(7, rng))}
    return SeedInputs(seed, requests, timeline, controllers, make("no_sync", "no_sync", []))


def design(time_scale: float = 4.0, noise_sd: float = 0.05) -> RegimeDesign:
    noise = np.random.default_rng(9).normal(0.0, noise_sd * np.sqrt(2.0), 400)
    return RegimeDesign(regime="bursty", seeds=[seed_inputs(s) for s in range(3)], space=SPACE, time_scale=time_scale,
                        prior=SERVER, noise_log_ratios=noise, controls=3)


def test_the_planned_pairs_come_from_the_very_draws_the_replay_makes():
    d = design()
    pairs = expected_pairs(d, ["primary"], 120.0, draws=2)
    assert pairs.size > 0 and (pairs.mine >= pairs.twin - 1e-9).all()
    assert np.array_equal(pairs.other, pairs.twin)  # noise-free: the controls agree
    assert expected_pairs(d, ["primary"], 120.0, draws=2).size == pairs.size  # seeded draws


def test_the_planned_replay_wander_widens_the_realisations_and_costs_power():
    """Each planned replay has its own id (the seed's two controls, then every replay with merges, unique
    across seeds); a replay-level sd shifts all of a replay's rows alike, spreading the realisations' gate."""
    d = design()
    pairs = expected_pairs(d, ["primary"], 120.0, draws=2)
    assert pairs.replay is not None and pairs.replay.shape == (3, pairs.size)
    for series in pairs.replay:  # one id per (seed, replay): never shared across seeds
        seeds_of = pd.Series(pairs.block // 1_000_000).groupby(series).nunique()
        assert (seeds_of == 1).all()
    assert not set(pairs.replay[0]) & set(pairs.replay[1]) and not set(pairs.replay[1]) & set(pairs.replay[2])
    spread = lambda sd: np.std([np.log(gate_statistic(r)[2])  # noqa: E731
                                for r in realisations(pairs, d.noise_log_ratios, 24, seed=1, replay_sd=sd)])
    assert spread(0.2) > 2 * spread(0.0)
    flat, wandering = (plan_power(replace(d, replay_sd=sd), ["primary"], 120.0, 2, threshold=1.05) for sd in (0.0, 0.3))
    assert wandering.power <= flat.power and wandering.sd > flat.sd


def test_the_plan_fits_its_budget_and_adds_controllers_only_while_it_fits():
    d = {"bursty": design()}
    small = size_plans(d, ["primary", "second"], budget_s=400.0, threshold=1.05, power_target=0.8, max_draws=2)
    plan = small.regimes["bursty"]
    assert plan.wall_s <= 400.0 and plan.controllers == ["primary"] and plan.draws == 2
    assert plan.power.power >= 0.8 and informative(d["bursty"], "primary", plan.span_s)
    large = size_plans(d, ["primary", "second"], budget_s=2000.0, threshold=1.05, power_target=0.8, max_draws=2)
    assert large.regimes["bursty"].controllers == ["primary", "second"] and large.regimes["bursty"].draws == 2
    assert large.regimes["bursty"].span_s >= plan.span_s and large.regimes["bursty"].wall_s <= 2000.0
    # a budget that is only a ceiling: the same controllers and draws, each at its shortest powered span
    ceiling = size_plans(d, ["primary", "second"], budget_s=2000.0, threshold=1.05, power_target=0.8, max_draws=2,
                         fill_budget=False).regimes["bursty"]
    assert (ceiling.controllers, ceiling.draws) == (["primary", "second"], 2) and ceiling.power.power >= 0.8
    assert ceiling.span_s < large.regimes["bursty"].span_s and ceiling.wall_s < large.regimes["bursty"].wall_s
    higher = size_plans(d, ["primary", "second"], budget_s=4000.0, threshold=1.05, power_target=0.8, max_draws=2,
                        fill_budget=False).regimes["bursty"]
    assert (higher.span_s, higher.wall_s) == (ceiling.span_s, ceiling.wall_s)  # it does not grow with the budget


def test_a_further_controller_is_added_only_on_a_span_that_holds_its_merges():
    """A further controller used to be added at the primary's span even when that span ended before its first
    merge: its replay, its draw and its cadence then replayed no merge at all."""
    d = design()
    starts = {"primary": [20.0, 60.0, 100.0, 140.0, 180.0, 220.0], "second": [80.0, 160.0, 220.0]}
    d = replace(d, seeds=[replace(s, controllers={c: s.controllers[c].model_copy(update={"merge_starts_s": v})
                                                  for c, v in starts.items()}) for s in d.seeds])
    kwargs = dict(threshold=1.05, power_target=0.8, max_draws=2)
    # 700 s pays for both controllers at the primary's 60 s span, not for a span reaching the second's merges
    assert wall_s(d, 2, 2, 60.0) <= 700.0 < wall_s(d, 2, 2, 85.0)
    alone = size_plans({"bursty": d}, ["primary", "second"], budget_s=700.0, **kwargs).regimes["bursty"]
    assert alone.controllers == ["primary"] and alone.wall_s <= 700.0
    both = size_plans({"bursty": d}, ["primary", "second"], budget_s=4000.0, **kwargs).regimes["bursty"]
    assert both.controllers == ["primary", "second"] and informative(d, "second", both.span_s)
    fixed = size_plans({"bursty": replace(d, min_merge_active=1)}, ["primary", "second"], budget_s=4000.0,
                       fixed_spans={"bursty": 60.0}, **kwargs).regimes["bursty"]
    assert fixed.controllers == ["primary"] and fixed.span_s == 60.0  # a fixed span that misses them


def test_draws_give_way_before_the_span_does_and_a_budget_that_cannot_pay_for_the_primary_fails():
    d = {"bursty": design()}
    three = size_plans(d, ["primary"], budget_s=460.0, threshold=1.05, power_target=0.8, max_draws=3).regimes["bursty"]
    two = size_plans(d, ["primary"], budget_s=400.0, threshold=1.05, power_target=0.8, max_draws=3).regimes["bursty"]
    assert (three.draws, two.draws) == (3, 2) and two.wall_s <= 400.0 and two.power.power >= 0.8
    # never fewer than two draws: one can never bring the rank test below alpha
    with pytest.raises(PlanError, match=r"budget_s 340 s cannot pay for the primary's regime bursty: .* needs about "
                                        r"\d+ s of replays with 2 draw\(s\)"):
        size_plans(d, ["primary"], budget_s=340.0, threshold=1.05, power_target=0.8, max_draws=3)
    assert size_plans(d, ["primary"], budget_s=340.0, threshold=1.05, power_target=0.8,
                      max_draws=1).regimes["bursty"].draws == 1  # what params allow


def test_a_regime_no_span_can_power_is_planned_underpowered_and_says_so():
    d = {"bursty": design(noise_sd=30.0)}  # noise swamps the merge effect on every span
    none = size_plans(d, ["primary"], budget_s=400.0, threshold=1.05, power_target=0.8, max_draws=2).regimes["bursty"]
    assert none.draws == 1 and none.power.power < 0.8 and none.wall_s <= 400.0


def test_every_planned_replay_meets_the_request_floor():
    d = replace(design(), min_requests=300, min_merge_active=30)
    sized = size_plans({"bursty": d}, ["primary"], budget_s=4000.0, threshold=1.05, power_target=0.8,
                       max_draws=2).regimes["bursty"]
    assert floor_met(d, "primary", sized.span_s, sized.draws)
    for seed in d.seeds:  # 4 requests per trace second: 300 requests need a 75 s span
        assert (seed.requests["arrival_s"] < sized.span_s).sum() >= 300
    assert not floor_met(d, "primary", 60.0, 2)
    lives = nominal_lives(d)  # requests in flight when a window opens count as merge-active too
    assert all(life > 0 for life in lives)
    strict = replace(d, min_requests=1, min_merge_active=60)
    spans = np.arange(20.0, 240.0, 5.0)
    inside = [g for g in spans if floor_met(strict, "primary", g, 2)]
    with_life = [g for g in spans if floor_met(strict, "primary", g, 2, lives)]
    assert set(inside) <= set(with_life) and (not inside or with_life[0] <= inside[0])
    unreachable = replace(design(), min_requests=5000)
    assert "every replay has 5000 requests" in size_plans(
        {"other": replace(design(), regime="other"), "bursty": unreachable}, ["primary"], budget_s=4000.0,
        threshold=1.05, power_target=0.8, max_draws=2).left_out["bursty"]
    with pytest.raises(PlanError, match="the primary's regime bursty has no span: .* 5000 requests"):
        size_plans({"bursty": unreachable}, ["primary"], budget_s=4000.0, threshold=1.05, power_target=0.8,
                   max_draws=2)


def test_regimes_come_in_order_while_the_budget_allows_and_one_that_does_not_fit_is_left_out_with_why():
    fast, slow = design(), design(time_scale=1.0)  # trace time at wall speed: its spans cost four times more
    d = {"bursty": fast, "slow": replace(slow, regime="slow")}
    sized = size_plans(d, ["primary"], budget_s=400.0, threshold=1.05, power_target=0.8, max_draws=2)
    assert list(sized.regimes) == ["bursty"] and sized.regimes["bursty"].power.power >= 0.8
    assert "does not fit" in sized.left_out["slow"] and "budget_s left" in sized.left_out["slow"]
    both = size_plans(d, ["primary"], budget_s=4000.0, threshold=1.05, power_target=0.8, max_draws=2)
    assert set(both.regimes) == {"bursty", "slow"} and both.left_out == {}
    assert sum(p.wall_s for p in both.regimes.values()) <= 4000.0
    with pytest.raises(PlanError, match="primary's regime bursty"):  # the first regime is never left out
        size_plans(d, ["primary"], budget_s=5.0, threshold=1.05, power_target=0.8, max_draws=2)


def test_a_fixed_span_is_kept_and_its_power_stated():
    d = {"bursty": design()}
    sized = size_plans(d, ["primary"], budget_s=900.0, threshold=1.05, power_target=0.8, max_draws=2,
                       fixed_spans={"bursty": 100.0}).regimes["bursty"]
    assert sized.span_s == 100.0 and sized.wall_s == pytest.approx(wall_s(d["bursty"], 1, sized.draws, 100.0))
    assert 0.0 <= sized.power.power <= 1.0


def test_a_fixed_span_below_the_request_floor_fails_naming_the_span_that_meets_it():
    """A fixed span used to be replayed as given: a span that ended before the controller's first merge
    replayed no merge at all, and every merge-active comparison was empty."""
    floor = replace(design(), min_requests=100, min_merge_active=10)
    first = min(s.controllers["primary"].merge_starts_s[0] for s in floor.seeds)
    kwargs = dict(budget_s=4000.0, threshold=1.05, power_target=0.8, max_draws=2)
    with pytest.raises(PlanError, match=rf"primary's regime bursty: replay.vllm.span_s {first:g} s leaves a planned "
                                        r"replay below the request floor \(100 requests, 10 in the merge windows .*"
                                        r"the shortest span that meets it is (\d+(\.\d+)?) s"):
        size_plans({"bursty": floor}, ["primary"], fixed_spans={"bursty": first}, **kwargs)
    with pytest.raises(PlanError) as err:
        size_plans({"bursty": floor}, ["primary"], fixed_spans={"bursty": first}, **kwargs)
    meets = float(str(err.value).split("the shortest span that meets it is ")[1].split(" s")[0])
    # a pinned span's floor counts arrivals inside merge windows, not simulated lifetimes: the same on any machine
    assert meets > first and floor_met(floor, "primary", meets, 2)
    kept = size_plans({"bursty": floor}, ["primary"], fixed_spans={"bursty": meets}, **kwargs).regimes["bursty"]
    assert kept.span_s == meets
    # a later regime is left out with the reason instead
    sized = size_plans({"other": replace(design(), regime="other"), "bursty": floor}, ["primary"],
                       fixed_spans={"other": first, "bursty": first}, **kwargs)
    assert list(sized.regimes) == ["other"] and "below the request floor" in sized.left_out["bursty"]


def test_a_span_where_the_draws_must_copy_the_controller_is_not_informative():
    d = design()
    first = min(s.controllers["primary"].merge_starts_s[0] for s in d.seeds)
    assert not informative(d, "primary", first)  # no merge inside yet on some seed
    spans = [g for g in np.arange(5.0, 240.0, 5.0) if informative(d, "primary", g)]
    assert spans, "some span is informative"
    for seed in d.seeds:
        s = seed.controllers["primary"]
        assert span_count(s.merge_starts_s, 8.0, spans[0]).merges >= 1
