"""The report's live section: per-seed sync-excess, compute share, the rank test and the live tier."""

from __future__ import annotations

import pandas as pd
import pytest

from syncsafe.analysis.live import TIER_BEATS, TIER_NONE, live_section, live_seeds, live_verdicts
from syncsafe.serving.live import INDEX_COLUMNS, LIVE_INDEX


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


def test_winning_every_seed_earns_the_live_tier_and_degraded_seeds_are_left_out():
    wins = {s: (0.05, 0.10 + 0.01 * s, 0.04, 0.0) for s in range(5)}
    verdict = live_verdicts(live_seeds(_index(wins)), alpha=0.05).iloc[0]
    assert verdict.n_used == 5 and verdict.p_rank == pytest.approx(1 / 32)  # one draw per seed: (1/2)^5
    assert verdict.tier == TIER_BEATS
    verdict = live_verdicts(live_seeds(_index(wins, degraded=(0,))), alpha=0.05).iloc[0]
    assert (verdict.n_used, verdict.n_degraded) == (4, 1)
    assert verdict.p_rank == pytest.approx(1 / 16) and verdict.tier == TIER_NONE


def test_the_section_says_when_there_are_no_live_runs_and_tabulates_them_when_there_are(tmp_path):
    assert "No live runs" in live_section(tmp_path, 0.05)
    path = tmp_path / LIVE_INDEX
    path.parent.mkdir(parents=True)
    _index({0: (0.05, 0.10, 0.04, 0.0), 1: (0.30, 0.10, 0.04, 0.0)}).to_csv(path, index=False)
    text = live_section(tmp_path, 0.05)
    assert "## Live" in text and TIER_NONE in text and "| bursty | wa_forecast | 1 |" in text
