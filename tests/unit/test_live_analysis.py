"""The report's live section: per-seed sync-excess, compute share, the rank test and the live tier."""

from __future__ import annotations

import pandas as pd
import pytest

from syncsafe.analysis.live import LIVE_TEST, TIER_BEATS, TIER_NONE, live_section, live_seeds, live_tests, live_tier, live_verdicts
from syncsafe.analysis.evidence import MechanismEvidence, RegimeMechanism
from syncsafe.analysis.protocol import with_adjusted_p
from syncsafe.artifacts.layout import LIVE_INDEX
from syncsafe.artifacts.live_runs import INDEX_COLUMNS


def _index(rates: dict[int, tuple[float, float, float, float]], degraded: tuple[int, ...] = ()) -> pd.DataFrame:
    """rates[seed] = (policy, matched_random, train_no_merge, no_train) SLO violation rates."""
    rows = []
    for seed, values in rates.items():
        for order, (condition, rate) in enumerate(zip(("policy", "matched_random", "train_no_merge", "no_train"), values)):
            rows.append({"regime": "bursty", "policy": "wa_forecast" if condition == "policy" else condition,
                         "seed": seed, "draw": 0 if condition == "matched_random" else None,
                         "matched_to": "wa_forecast" if condition == "matched_random" else None,
                         "condition": condition, "order": order, "backend": "vllm-live", "slo_violation_rate": rate,
                         "p95_ms": 100.0 * (1 + rate), "p99_ms": 200.0, "n_requests": 100, "n_failed": 0,
                         "n_merges": 2 if condition in ("policy", "matched_random") else 0,
                         "requests_during_merges": 10, "degraded": condition == "policy" and seed in degraded,
                         "degraded_cycles": 0, "scrape_failures": 0,
                         "feasible": True if condition in ("policy", "matched_random") else None,
                         "max_lag_s": 0.0, "path": f"runs/live/bursty/seed-{seed}/{condition}"})
    return pd.DataFrame(rows, columns=list(INDEX_COLUMNS))


def test_per_seed_excess_is_against_training_without_merges_and_compute_against_no_training():
    seeds = live_seeds(_index({0: (0.10, 0.20, 0.04, 0.01)}))
    (row,) = seeds.itertuples()
    assert row.sync_excess_policy == pytest.approx(0.06)
    assert row.sync_excess_matched_random == pytest.approx(0.16)
    assert row.compute_pp == pytest.approx(0.03)
    assert row.compute_share == pytest.approx(0.03 / 0.09)  # compute's part of the policy run's excess over no training


SHOWN = MechanismEvidence(regimes={"bursty": RegimeMechanism(sync_ratio_paired=2.0, drift_ratio=1.0, gate_ratio=2.0,
                                                             gate_ratio_ci_low=1.8, gate_ratio_ci_high=2.2)})


def test_winning_every_seed_earns_the_live_tier_and_a_degraded_seed_counts_as_a_loss():
    wins = {s: (0.05, 0.10 + 0.01 * s, 0.04, 0.0) for s in range(6)}
    verdict = live_verdicts(live_seeds(_index(wins))).iloc[0]
    assert verdict.n_used == 6 and verdict.p_rank == pytest.approx(1 / 64)  # one draw per seed: (1/2)^6
    assert live_tier("bursty", verdict.p_rank, 0.05, SHOWN)[0] == TIER_BEATS
    assert live_tier("bursty", 0.05, 0.05, SHOWN)[0] == TIER_NONE, "p must be below alpha, not at it"
    lost = live_verdicts(live_seeds(_index(wins, degraded=(0,)))).iloc[0]
    assert (lost.n_used, lost.n_degraded, lost.n_lost) == (6, 1, 1)  # kept, ranked worst
    assert lost.p_rank == pytest.approx(7 / 64)  # P(at most one of 6 seeds lost) = (1 + 6) / 64


def test_a_live_line_needs_the_mechanism_gate_of_its_regime():
    tier, why = live_tier("bursty", 1e-4, 0.05, None)
    assert tier == TIER_NONE and "mechanism gate" in why
    tier, why = live_tier("steady", 1e-4, 0.05, SHOWN)
    assert tier == TIER_NONE and "no real-backend" in why


def test_live_tests_join_the_verdict_table_s_family(tmp_path):
    path = tmp_path / LIVE_INDEX
    path.parent.mkdir(parents=True)
    _index({s: (0.05, 0.10 + 0.01 * s, 0.04, 0.0) for s in range(6)}).to_csv(path, index=False)
    tests = live_tests(tmp_path)
    assert tests == {(LIVE_TEST, "wa_forecast", "bursty"): pytest.approx(1 / 64)}
    table = pd.DataFrame({"regime": ["bursty"] * 2, "policy": ["wa_diloco", "fixed_h"], "p_rank": [1e-4, 0.5],
                          "p_vs_fixed_cadence": [0.01, 0.5]})
    _, extra = with_adjusted_p(table, ("wa_diloco", "bursty"), tests)
    # the primary passes its gate; then Holm over 4 tests (2 cadence, 1 other matched random, 1 live):
    # the live p (1/64) is the second smallest: 3 x 1/64 after the cadence test 0.01 x 4 = 0.04
    assert extra[(LIVE_TEST, "wa_forecast", "bursty")] == pytest.approx(3 / 64)


def test_the_section_says_when_there_are_no_live_runs_and_tabulates_them_when_there_are(tmp_path):
    assert "No live runs" in live_section(tmp_path, 0.05, SHOWN)
    path = tmp_path / LIVE_INDEX
    path.parent.mkdir(parents=True)
    _index({0: (0.05, 0.10, 0.04, 0.0), 1: (0.30, 0.10, 0.04, 0.0)}).to_csv(path, index=False)
    render = live_section(tmp_path, 0.05, SHOWN)
    text = render({(LIVE_TEST, "wa_forecast", "bursty"): 0.75})
    assert "## Live" in text and TIER_NONE in text and "| bursty | wa_forecast | 1 |" in text and "0.750" in text
