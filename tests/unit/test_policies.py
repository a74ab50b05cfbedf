"""Merge policies: the shared min_h/max_h rules and each policy's own rule."""

from __future__ import annotations

import pytest

from syncsafe.config import CONTROLLER_POLICIES, ControlConfig, MergeConfig, ScoreWeights
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
    with pytest.raises(ValueError, match="unknown policy"):
        build_policy("oracle", ControlConfig(), MergeConfig(), 0, Calibration(), 0.5)
