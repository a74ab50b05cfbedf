"""Merge policies: the shared min_h/max_h rules and each policy's own rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from syncsafe.config import CONTROLLER_POLICIES, ConfigError, ControlConfig, MergeConfig, ScoreWeights, parse_params
from syncsafe.control.forecasters import EwmaForecaster
from syncsafe.control.policies import FixedH, PressureGate, RandomDeferral, WaCalibrated, WaDiloco, WaForecast, build_policy
from syncsafe.control.types import ClockState, FleetSignals, LearnerReport
from syncsafe.control.serving_model import Calibration


def clock(since: int, min_h: int = 20, max_h: int = 80, t: float = 100.0) -> ClockState:
    return ClockState(t_s=t, step=since, steps_since_merge=since, min_h=min_h, max_h=max_h, cycle=0)


def signals(inference=0.1, network=0.1, checkpoint=0.05, rate=1.0, t=100.0) -> FleetSignals:
    return FleetSignals(t_s=t, busy=inference > 0.5, arrival_rate=rate, inference_pressure=inference,
                        network_pressure=network, checkpoint_pressure=checkpoint)


def reports(drop=0.02, n=2) -> list[LearnerReport]:
    return [LearnerReport(island=i, loss_start=4.0, loss_end=4.0 * (1 - drop), tokens_since_merge=1000, staleness_steps=20)
            for i in range(n)]


def all_policies(seed=0):
    control, merge = ControlConfig(), MergeConfig()
    return [build_policy(name, control, merge, seed, Calibration(), 0.5) for name in CONTROLLER_POLICIES]


@pytest.mark.parametrize("policy", all_policies(), ids=lambda p: p.name)
def test_no_merge_before_min_h_even_when_idle(policy):
    d = policy.decide(reports(drop=0.5), signals(inference=0.0, network=0.0, checkpoint=0.0), clock(since=19))
    assert not d.merge
    assert "min_h" in d.reason


@pytest.mark.parametrize("policy", all_policies(), ids=lambda p: p.name)
def test_forced_merge_at_max_h_even_under_full_pressure(policy):
    d = policy.decide(reports(drop=0.0), signals(inference=1.0, network=1.0, checkpoint=1.0, rate=50), clock(since=80))
    assert d.merge and d.forced
    assert "max_h" in d.reason


def test_fixed_h_merges_exactly_at_h():
    p = FixedH(40)
    assert not p.decide(reports(), signals(), clock(since=39)).merge
    assert p.decide(reports(), signals(), clock(since=40)).merge
    assert p.decide(reports(), signals(inference=1.0), clock(since=41)).merge


def test_pressure_gate_threshold_is_inclusive_and_uses_the_worst_pressure():
    gate = PressureGate(0.5)
    assert gate.decide(reports(), signals(inference=0.5, network=0.2), clock(since=20)).merge
    assert not gate.decide(reports(), signals(inference=0.51), clock(since=20)).merge
    assert not gate.decide(reports(), signals(inference=0.1, network=0.6), clock(since=20)).merge
    assert not gate.decide(reports(), signals(inference=0.1, checkpoint=0.9), clock(since=20)).merge


def test_random_deferral_is_seeded_and_matches_its_probability():
    a = [RandomDeferral(0.3, seed=7).decide(reports(), signals(), clock(since=20)).merge for _ in range(1)]
    runs = []
    for seed in (7, 7, 8):
        p = RandomDeferral(0.3, seed=seed)
        runs.append([p.decide(reports(), signals(), clock(since=20)).merge for _ in range(2000)])
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert a[0] == runs[0][0]
    assert abs(sum(runs[0]) / 2000 - 0.7) < 0.04


def test_wa_diloco_score_arithmetic():
    w = ScoreWeights(w_progress=0.5, w_staleness=1.0, w_pressure=1.0, progress_scale=0.05, threshold=0.25)
    p = WaDiloco(w)
    # progress 0.02/0.05 = 0.4 -> +0.2; staleness 40/80 -> +0.5; pressure 0.3 -> -0.3
    d = p.decide(reports(drop=0.02), signals(inference=0.3), clock(since=40))
    assert d.score == pytest.approx(0.4)
    assert d.merge
    # same cycle under heavy pressure defers
    d = p.decide(reports(drop=0.02), signals(inference=0.9), clock(since=40))
    assert d.score == pytest.approx(-0.2) and not d.merge


def test_wa_diloco_more_staleness_tolerates_more_pressure():
    p = WaDiloco(ScoreWeights())
    s = signals(inference=0.6)
    assert not p.decide(reports(), s, clock(since=20)).merge
    assert p.decide(reports(), s, clock(since=70)).merge


def test_wa_calibrated_subtracts_expected_serving_cost():
    cal = Calibration(merge_slowdown=2.0, pressure_slowdown=0.5, capacity_rps=10.0)
    base, calibrated = WaDiloco(ScoreWeights()), WaCalibrated(ScoreWeights(), w_cost=2.0, calibration=cal)
    s = signals(inference=0.4, rate=5.0)
    expected_cost = 0.5 * (2.0 - 1.0) * (1 + 0.5 * 0.4)
    assert cal.expected_merge_cost(s) == pytest.approx(expected_cost)
    diff = base.decide(reports(), s, clock(since=40)).score - calibrated.decide(reports(), s, clock(since=40)).score
    assert diff == pytest.approx(2.0 * expected_cost)


def test_wa_forecast_defers_when_the_forecast_rises():
    p = WaForecast(ScoreWeights(), w_forecast=1.0, window_s=8.0, forecaster=EwmaForecaster(0.5))
    calm = signals(inference=0.2)
    p.observe([calm] * 10)
    assert p.decide(reports(), calm, clock(since=40)).merge
    p.observe([signals(inference=1.0)] * 3)
    assert not p.decide(reports(), calm, clock(since=40)).merge


def test_every_configured_policy_builds():
    names = [p.name for p in all_policies()]
    assert names == list(CONTROLLER_POLICIES)
    with pytest.raises(ValueError, match="not a controller policy"):
        build_policy("oracle", ControlConfig(), MergeConfig(), 0, Calibration(), 0.5)


@pytest.mark.parametrize("term,weights", [
    ("progress", {"w_progress": 0.0}), ("staleness", {"w_staleness": 0.0}), ("pressure", {"w_pressure": 0.0}),
])
def test_an_ablated_wa_diloco_is_the_full_policy_with_that_weight_at_zero(term, weights):
    control, merge = ControlConfig(), MergeConfig()
    ablated = build_policy(f"wa_diloco-{term}", control, merge, 0, Calibration(), 0.5)
    by_hand = WaDiloco(ScoreWeights(**{**ScoreWeights().model_dump(), **weights}))
    assert ablated.name == f"wa_diloco-{term}" and type(ablated) is WaDiloco
    cases = [(reports(drop=d), signals(inference=i), clock(since=s))
             for d in (0.0, 0.01, 0.05) for i in (0.0, 0.4, 0.9) for s in (20, 40, 60)]
    for r, sig, c in cases:
        mine, theirs = ablated.decide(r, sig, c), by_hand.decide(r, sig, c)
        assert (mine.merge, mine.score) == (theirs.merge, theirs.score)
    # and the term is really gone: at full pressure the full policy defers where the ablation without
    # pressure merges (score 0.5 * 1 + 1 * 40/80 = 1.0 against threshold 0.25, minus 1.0 with pressure)
    if term == "pressure":
        full = build_policy("wa_diloco", control, merge, 0, Calibration(), 0.5)
        hot = (reports(drop=0.05), signals(inference=1.0), clock(since=40))
        assert ablated.decide(*hot).merge and not full.decide(*hot).merge


def test_forecast_and_cost_ablations_switch_off_their_own_term_only():
    control, merge = ControlConfig(), MergeConfig()
    forecast = build_policy("wa_forecast-forecast", control, merge, 0, Calibration(), 0.5)
    cost = build_policy("wa_calibrated-cost", control, merge, 0, Calibration(), 0.5)
    assert isinstance(forecast, WaForecast) and forecast.w_forecast == 0.0 and forecast.w == control.score
    assert isinstance(cost, WaCalibrated) and cost.w_cost == 0.0 and cost.w == control.score
    plain = build_policy("wa_diloco", control, merge, 0, Calibration(), 0.5)
    for inference in (0.0, 0.5, 1.0):
        args = (reports(), signals(inference=inference), clock(since=40))
        assert cost.decide(*args).score == pytest.approx(plain.decide(*args).score)


@pytest.mark.parametrize("name", ["wa_diloco-cost", "fixed_h-h", "wa_diloco-", "wa_lookahead-pressure", "nope"])
def test_a_name_that_is_no_policy_or_variant_is_refused_naming_the_choices(name):
    with pytest.raises(ValueError, match="not a controller policy"):
        build_policy(name, ControlConfig(), MergeConfig(), 0, Calibration(), 0.5)
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text(encoding="utf-8"))
    raw["control"]["policies"] = ["fixed_h", name]
    with pytest.raises(ConfigError, match=r"control.policies.1: .*not a controller policy"):
        parse_params(raw)
