"""The real arm's own checks: warm-up until a stable pace, pooled SLO, noise floor, overload, intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import parse_params
from syncsafe.serving.metrics import derive_slo
from syncsafe.realarm.evidence import control_spread, overload_reason, pooled_slo, replay_intervals
from syncsafe.realarm.warmup import decode_pace_ms, pace_is_stable, warm_until_stable


def table(e2e: np.ndarray, ttft: np.ndarray | None = None, tokens: int = 25) -> pd.DataFrame:
    ttft = np.full(e2e.size, 50.0) if ttft is None else ttft
    return pd.DataFrame({"e2e_ms": e2e, "ttft_ms": ttft, "output_tokens_received": tokens, "error": ""})


def test_the_decode_pace_is_the_median_time_per_token_after_the_first():
    rows = table(np.array([50.0 + 24 * 2.0, 50.0 + 24 * 3.0, 50.0 + 24 * 10.0]))
    assert decode_pace_ms(rows) == pytest.approx(3.0)
    failed = rows.assign(error=["HTTP 500", "", ""])
    assert decode_pace_ms(failed) == pytest.approx(6.5)  # failed requests do not count
    assert decode_pace_ms(rows.assign(output_tokens_received=1)) is None and decode_pace_ms(rows.iloc[:0]) is None


def test_the_pace_is_stable_only_when_the_last_probes_agree_within_the_tolerance():
    assert not pace_is_stable([3.0, 3.0], 0.05, 3), "fewer probes than asked for"
    assert pace_is_stable([5.0, 3.02, 3.0, 3.1], 0.05, 3)
    assert not pace_is_stable([3.0, 3.0, 3.2], 0.05, 3)  # 6.7 % apart
    assert not pace_is_stable([3.0, None, 3.0], 0.05, 3)


def test_the_warm_up_stops_on_a_stable_pace_and_not_before():
    paces = iter([5.5, 4.6, 3.9, 3.1, 2.6, 2.35, 2.32, 2.31, 2.30, 2.30])  # a server speeding up, then settled
    sent = []

    def probe() -> pd.DataFrame:
        sent.append(1)
        return table(np.array([50.0 + 24 * next(paces)] * 5))

    record = warm_until_stable(probe, tolerance=0.05, stable_probes=3, max_s=1e9)
    assert record.stable and len(sent) == 8  # 2.35, 2.32, 2.31: the first three within 5 %
    assert record.paces_ms[-3:] == pytest.approx([2.35, 2.32, 2.31])
    assert "stable within 5%" in record.describe()


def test_a_warm_up_that_runs_out_of_time_says_it_never_settled():
    ticks = iter(range(100))
    paces = iter([5.0, 4.0, 3.0, 2.0, 1.0] * 4)
    record = warm_until_stable(lambda: table(np.array([50.0 + 24 * next(paces)])), 0.05, 3, max_s=4,
                               clock=lambda: float(next(ticks)))
    assert not record.stable and len(record.paces_ms) == 4 and "NOT stable" in record.describe()


def test_the_slo_comes_from_every_control_pooled(raw_params):
    params = parse_params(raw_params)
    rng = np.random.default_rng(1)
    controls = [table(rng.lognormal(5.0, 0.3, 300)) for _ in range(3)]
    pooled = pooled_slo(params, controls)
    assert pooled == derive_slo(pd.concat(controls, ignore_index=True), params.replay.slo.multiplier)
    assert pooled != derive_slo(controls[0], params.replay.slo.multiplier)
    raw_params["replay"]["slo"].update({"ttft_ms": 500.0})
    assert pooled_slo(parse_params(raw_params), controls).ttft_ms == 500.0  # a fixed threshold wins
    with pytest.raises(ValueError, match="no no-sync control"):
        pooled_slo(params, [])


def test_control_spread_and_overload():
    base = np.linspace(100.0, 200.0, 101)  # p95 195
    assert control_spread([table(base), table(base * 1.05), table(base * 0.98)]) == pytest.approx(0.07 / 1.0)
    assert control_spread([table(base)]) is None
    quiet = table(base, ttft=np.full(101, 40.0))
    assert overload_reason(quiet, 120.0) is None and overload_reason(quiet, None) is None
    assert overload_reason(table(base, ttft=np.full(101, 400.0)), 120.0).startswith("overloaded: no-sync TTFT p95 400")


def test_bootstrap_intervals_hold_the_estimates_and_are_seeded():
    rng = np.random.default_rng(2)
    rows = table(rng.lognormal(5.0, 0.4, 400))
    slo = derive_slo(rows, 1.0)
    a = replay_intervals(rows, slo, 500, (0, 1))
    assert a == replay_intervals(rows, slo, 500, (0, 1))
    low, high = a["e2e_p95_ci_ms"]
    assert low < float(np.percentile(rows["e2e_ms"], 95)) < high
    rate = float((rows["e2e_ms"] > slo.e2e_ms).mean())
    assert a["slo_violation_rate_ci"][0] <= rate <= a["slo_violation_rate_ci"][1]
    none = replay_intervals(rows, derive_slo(rows, 100.0), 500, (0, 1))  # nothing violates: a zero-width interval
    assert none["slo_violation_rate_ci"] == [0.0, 0.0]
