"""The real arm's own checks: warm-up until a stable pace, pooled SLO, noise floor, overload, intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import parse_params
from syncsafe.serving.metrics import derive_slo
from syncsafe.realarm.evidence import control_spread, overload_reason, pooled_slo, replay_intervals
from scipy import stats

from syncsafe.realarm.warmup import decode_pace_ms, falling_pace_p, pace_is_stable, warm_until_stable


def table(e2e: np.ndarray, ttft: np.ndarray | None = None, tokens: int = 25) -> pd.DataFrame:
    ttft = np.full(e2e.size, 50.0) if ttft is None else ttft
    return pd.DataFrame({"e2e_ms": e2e, "ttft_ms": ttft, "output_tokens_received": tokens, "error": ""})


def test_the_decode_pace_is_the_median_time_per_token_after_the_first():
    rows = table(np.array([50.0 + 24 * 2.0, 50.0 + 24 * 3.0, 50.0 + 24 * 10.0]))
    assert decode_pace_ms(rows) == pytest.approx(3.0)
    failed = rows.assign(error=["HTTP 500", "", ""])
    assert decode_pace_ms(failed) == pytest.approx(6.5)  # failed requests do not count
    assert decode_pace_ms(rows.assign(output_tokens_received=1)) is None and decode_pace_ms(rows.iloc[:0]) is None


def test_the_pace_is_stable_once_the_last_probes_show_no_falling_trend():
    assert falling_pace_p([3.0, 3.0, 3.0], 3) == 1.0 and falling_pace_p([3.0, 3.0], 3) is None
    assert falling_pace_p([3.0, None, 3.0], 3) is None
    assert not pace_is_stable([3.0, 3.0], 0.1, 3), "fewer probes than asked for"
    assert not pace_is_stable([8.3, 6.2, 5.4, 4.6, 3.8], 0.1, 5)  # still speeding up
    assert pace_is_stable([3.0, 3.4, 2.9, 3.3, 3.1], 0.1, 5)  # 15 % apart, but no trend: the old 5 % band refused it
    assert pace_is_stable([2.0, 2.1, 2.2, 2.3, 2.4], 0.1, 5)  # slowing down is not warming up
    # the p is linregress's one-sided slope test of log pace on the probe index
    paces = [5.0, 4.1, 4.4, 3.9, 4.0]
    expected = stats.linregress(range(5), np.log(paces), alternative="less").pvalue
    assert falling_pace_p(paces, 5) == pytest.approx(expected)


def test_the_warm_up_stops_once_the_pace_stops_falling_and_not_before():
    paces = iter([8.30, 6.20, 5.44, 3.84, 3.99, 4.00, 4.10, 3.90, 4.05, 3.95])  # a recorded warm-up, then settled
    sent = []

    def probe() -> pd.DataFrame:
        sent.append(1)
        return table(np.array([50.0 + 24 * next(paces)] * 5))

    record = warm_until_stable(probe, alpha=0.1, stable_probes=5, max_s=1e9)
    assert record.stable and len(sent) == 7 and record.trend_p >= 0.1
    assert falling_pace_p(record.paces_ms[:6], 5) < 0.1, "one probe earlier it was still falling"
    assert "stopped falling over the last 5" in record.describe()


def test_a_warm_up_that_runs_out_of_time_says_it_never_settled():
    ticks = iter(range(100))
    paces = iter([5.0 * 0.8 ** i for i in range(20)])
    record = warm_until_stable(lambda: table(np.array([50.0 + 24 * next(paces)])), 0.1, 3, max_s=4,
                               clock=lambda: float(next(ticks)))
    assert not record.stable and len(record.paces_ms) == 4 and "still falling" in record.describe()


def _warm_up_run(rng: np.random.Generator, true_pace, noise_sd: float, alpha: float, probes: int) -> int:
    """Probes a simulated warm-up sends: each probe's pace the true pace at that probe times log-normal noise."""
    paces: list[float | None] = []
    for i in range(60):
        paces.append(float(true_pace(i) * np.exp(rng.normal(0.0, noise_sd))))
        if pace_is_stable(paces, alpha, probes):
            return len(paces)
    return len(paces)


def test_simulated_warm_ups_stop_a_settled_server_at_once_and_warm_a_speeding_one_until_it_has_settled():
    """A settled server whose probes wander by sd 0.15 (what 2 cores show) is kept warming past the first
    possible stop at most `alpha` of the time; one starting 2x slower and speeding up (e-fold every 1.5 probes,
    the recorded warm-ups' pace) stops within 10 % of its settled pace in every run. (A slower drift, e-fold
    every 3+ probes, is only partly caught within the probe scatter: the controls' drift test is its check.)"""
    rng = np.random.default_rng(7)
    alpha, probes, runs = 0.1, 5, 400
    settled = [_warm_up_run(rng, lambda i: 1.0, 0.15, alpha, probes) for _ in range(runs)]
    kept = sum(n > probes for n in settled)
    assert stats.binomtest(kept, runs, alpha, alternative="greater").pvalue > 0.01, kept
    assert np.mean(settled) < probes + 1
    decay = lambda i: 1.0 + np.exp(-i / 1.5)  # noqa: E731
    stops = [_warm_up_run(rng, decay, 0.15, alpha, probes) for _ in range(runs)]
    assert max(decay(n) - 1.0 for n in stops) < 0.10
    assert np.mean(stops) > np.mean(settled)


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
