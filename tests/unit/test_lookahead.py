"""wa_lookahead: the cheaper of two futures, causality, and its place among the policies."""

from __future__ import annotations

import numpy as np
import pandas as pd

from syncsafe.config import ControlConfig, MergeConfig
from syncsafe.control.controller import ControlPlan, run_controller
from syncsafe.control.harness import ProgressModelLearners
from syncsafe.control.lookahead import WaLookahead
from syncsafe.control.policies import build_policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.control.types import ClockState, FleetSignals, LearnerReport
from syncsafe.control.serving_model import Calibration
from syncsafe.traces.timeline import generate_timeline

GRID = 0.5


def lookahead() -> WaLookahead:
    policy = build_policy("wa_lookahead", ControlConfig(), MergeConfig(), 0, Calibration(), GRID)
    assert isinstance(policy, WaLookahead)
    return policy


def sample(t: float, rate: float) -> FleetSignals:
    return FleetSignals(t_s=t, busy=rate > 4, arrival_rate=rate, inference_pressure=min(rate / 8, 1.0),
                        network_pressure=0.1, checkpoint_pressure=0.05)


def clock(t: float, since: int = 4) -> ClockState:
    return ClockState(t_s=t, step=since, steps_since_merge=since, min_h=4, max_h=16, cycle=0)


def reports() -> list[LearnerReport]:
    return [LearnerReport(island=0, loss_start=4.0, loss_end=3.99, tokens_since_merge=1, staleness_steps=4)]


def feed(policy: WaLookahead, rate_at, until: float) -> None:
    policy.observe([sample(t, rate_at(t)) for t in np.arange(0.0, until + GRID / 2, GRID)])


# Hand-built futures: a 100 s square wave, bursts (7 req/s) over [95, 145), [195, 245), ..., quiet (1 req/s)
# in between. Cycles are 20 s apart and max_h allows three more cycles after the present one.
def square_wave(t: float) -> float:
    return 7.0 if (t + 5.0) % 100.0 < 50.0 else 1.0


def test_lookahead_merges_now_when_now_is_the_cheapest_future():
    now = 470.0  # quiet now; the next cycles (490, 510, 530) catch the burst starting at 495
    policy = lookahead()
    feed(policy, square_wave, now)
    cost, _, method = policy.plan(reports(), now, clock(now))
    assert method.startswith("seasonal")
    decision = policy.decide(reports(), sample(now, square_wave(now)), clock(now))
    assert cost[0] < min(cost[1:]) and decision.merge, decision.reason


def test_lookahead_defers_when_a_cheaper_cycle_is_ahead():
    now = 430.0  # inside the burst [395, 445); the cycle at 450 is quiet
    policy = lookahead()
    feed(policy, square_wave, now)
    cost, value, _ = policy.plan(reports(), now, clock(now))
    decision = policy.decide(reports(), sample(now, square_wave(now)), clock(now))
    assert cost[1] < cost[0] and value[1] < cost[0] and not decision.merge, decision.reason


def test_without_history_it_merges_and_at_max_h_it_must():
    policy = lookahead()
    assert policy.decide(reports(), sample(20.0, 1.0), clock(20.0)).merge
    feed(policy, square_wave, 435.0)
    forced = policy.decide(reports(), sample(435.0, 7.0), clock(435.0, since=16))
    assert forced.merge and forced.forced


def test_decisions_before_t_ignore_any_change_to_the_trace_after_t(params):
    cfg = params.regimes["steady"].model_copy(update={"duration_s": 600})
    timeline = generate_timeline("steady", cfg, GRID, 3)
    cut = 300.0
    changed = timeline.copy()
    late = changed["t_s"] > cut
    changed.loc[late, "arrival_rate"] = changed.loc[late, "arrival_rate"][::-1].to_numpy() * 3
    changed.loc[late, "inference_pressure"] = 1.0 - changed.loc[late, "inference_pressure"]
    plan = ControlPlan(step_s=5.0, min_h=4, max_h=16, window_s=8.0, min_gap_s=10.0, duration_s=600.0)

    def decisions(tl: pd.DataFrame) -> list[tuple]:
        policy = build_policy("wa_lookahead", params.control, params.merge, 3, Calibration(), GRID)
        result = run_controller(policy, ProgressModelLearners(params.harness, 3), TimelineSignals(tl), plan)
        return [(d.t_s, d.merge, d.reason) for d in result.decisions]

    base, other = decisions(timeline), decisions(changed)
    before = [d for d in base if d[0] <= cut]
    assert len(before) > 5
    assert [d for d in other if d[0] <= cut] == before
    assert base != other, "the change after t must matter to later decisions"


def test_lookahead_is_a_configured_controller(params):
    assert "wa_lookahead" in params.control.policies
    assert params.control.lookahead.history_s > 0


def test_without_a_period_a_spike_reverts_to_the_mean():
    # 600 s of irregular quiet load, then a spike in the last 10 s: no period, the spike is expected to pass.
    rng = np.random.default_rng(5)
    quiet = dict(zip(np.arange(0.0, 600.0, GRID), 1.5 + rng.uniform(0, 1, 1200)))
    policy = lookahead()
    feed(policy, lambda t: 7.0 if t > 590 else quiet[t], 600.0)
    cost, value, method = policy.plan(reports(), 600.0, clock(600.0))
    assert method == "mean reversion"
    assert cost[0] > max(cost[1:]) and value[1] < cost[0]
    assert not policy.decide(reports(), sample(600.0, 7.0), clock(600.0)).merge
    calm = lookahead()
    feed(calm, lambda t: quiet[t] if t < 590 else 1.5, 600.0)  # at the bottom of its range: merge now
    assert calm.decide(reports(), sample(600.0, 1.5), clock(600.0)).merge


def test_the_lookahead_ablation_plans_one_cycle_ahead_only():
    now = 430.0  # inside a burst, three more cycles feasible before max_h
    full, myopic = lookahead(), build_policy("wa_lookahead-lookahead", ControlConfig(), MergeConfig(), 0, Calibration(), GRID)
    for policy in (full, myopic):
        feed(policy, square_wave, now)
    cost_full, _, _ = full.plan(reports(), now, clock(now))
    cost_myopic, value, _ = myopic.plan(reports(), now, clock(now))
    assert len(cost_full) == 4 and len(cost_myopic) == 2
    assert np.allclose(cost_myopic, cost_full[:2])  # the same forecast, cut at the next cycle
    assert value[1] == cost_myopic[1]  # the next cycle is priced as if it were the forced one
    assert myopic.name == "wa_lookahead-lookahead"
