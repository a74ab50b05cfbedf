"""The SLO oracle: never worse than any draw, inside the action space, deterministic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import load_params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import matched_random
from syncsafe.schedules.stage import run_harness
from syncsafe.serving import oracle as oracle_module
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.metrics import derive_slo, violation_mask
from syncsafe.serving.oracle import slo_oracle
from syncsafe.serving.simulator import simulate_replay
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng

DURATION_S = 240.0


@pytest.fixture(scope="module")
def setting():
    params = load_params()
    regime = "bursty"
    params = params.model_copy(update={"regimes": {regime: params.regimes[regime].model_copy(
        update={"duration_s": DURATION_S})}})
    timeline = generate_timeline(regime, params.regimes[regime], params.traces.step_s, 0)
    requests = generate_requests(timeline, params.traces.requests, params.traces.step_s, regime_rng(regime, 0, "requests"))
    controller, _ = run_harness(params, regime, "fixed_h", 0, timeline)
    return params, ActionSpace.of_params(params, regime), timeline, requests, controller


def count(requests, timeline, schedule, slo) -> int:
    return int(violation_mask(simulate_replay(requests, timeline, schedule, Calibration(), 0), slo).sum())


def test_oracle_never_loses_to_a_draw_and_stays_in_the_action_space(setting):
    params, space, timeline, requests, controller = setting
    no_sync = controller.model_copy(update={"merge_starts_s": [], "source": "no_sync", "policy": "no_sync"})
    slo = derive_slo(simulate_replay(requests, timeline, no_sync, Calibration(), 0), 1.5)
    draws = [matched_random(controller, d, space) for d in range(8)]
    rivals = [(d, count(requests, timeline, d, slo)) for d in draws]
    found = slo_oracle(controller, space, requests, timeline, Calibration(), 0, slo, rivals, max_evals=12)
    assert found.schedule.n_merges == controller.n_merges > 0
    assert space.contains(found.schedule.merge_starts_s)
    assert (found.schedule.source, found.schedule.policy, found.schedule.matched_to) == ("slo_oracle", "slo_oracle",
                                                                                         controller.policy)
    assert found.violations == count(requests, timeline, found.schedule, slo)  # the count it reports is real
    assert found.violations <= min(c for _, c in rivals)
    assert found.violations <= count(requests, timeline, controller, slo)
    assert found.evaluations <= 12
    again = slo_oracle(controller, space, requests, timeline, Calibration(), 0, slo, rivals, max_evals=12)
    assert again == found


def test_proxy_program_is_exact_for_its_separable_cost():
    space = ActionSpace(cycle_s=20.0, window_s=8.0, duration_s=200.0, max_cycles=4)
    rng = np.random.default_rng(5)
    t = np.arange(0, 200.0, 0.5)
    timeline = pd.DataFrame({"t_s": t, "arrival_rate": rng.random(t.size) * 5, "inference_pressure": rng.random(t.size)})
    cal = Calibration()
    # the proxy by brute force: pressure-weighted arrivals over each window and its 10 s aftermath, step by step
    weighted = timeline["arrival_rate"].to_numpy() * cal.pressure_multiplier(timeline["inference_pressure"].to_numpy())

    def proxy(gaps):
        fine = np.arange(0, 200.0, 0.01)  # 10 ms steps: exact here, since every start is on the 0.5 s grid
        per_step = weighted[np.minimum((fine / 0.5).astype(int), t.size - 1)] * 0.01
        return sum(per_step[(fine >= s) & (fine < s + 18.0)].sum() for s in space.starts(gaps))

    for n in space.merge_counts():
        if n == 0:
            continue
        found = oracle_module._proxy_gaps(space, n, timeline, cal, 10.0)
        best = min(proxy(g) for g in space.enumerate(n))
        assert space.contains(space.starts(found))
        assert proxy(found) == pytest.approx(best)
