"""Protocol numbers on constructed data: sync-excess, envelope, wins, p-values."""

from __future__ import annotations

import pandas as pd
import pytest

from syncsafe.analysis.protocol import run_protocol
from syncsafe.analysis.runs_table import load_runs_table


def protocol_of(frame: pd.DataFrame):
    return run_protocol(load_runs_table(frame))


def seed_row(seeds: pd.DataFrame, policy: str, seed: int) -> pd.Series:
    return seeds[(seeds["policy"] == policy) & (seeds["seed"] == seed)].iloc[0]


def test_sync_excess_uses_the_same_seeds_no_sync(build_runs):
    no_sync = [0.0, 0.5, 0.9]
    frame = build_runs(
        no_sync=no_sync,
        policies={"wa_diloco": [b + 0.05 for b in no_sync]},
        draws={"wa_diloco": [[b + 0.07] for b in no_sync]},
    )
    result = protocol_of(frame.sample(frac=1.0, random_state=3))  # row order must not matter
    for seed, baseline in enumerate(no_sync):
        row = seed_row(result.seeds, "wa_diloco", seed)
        assert row["no_sync_slo_pct"] == pytest.approx(100 * baseline)
        assert row["sync_excess_pct"] == pytest.approx(5.0)
        assert row["mr_sync_excess_pct_mean"] == pytest.approx(7.0)
    summary = result.policies.set_index("policy").loc["wa_diloco"]
    assert summary["sync_excess_pct_mean"] == pytest.approx(5.0)
    assert summary["slo_pct_mean"] == pytest.approx(100 * (sum(no_sync) / 3 + 0.05))


def test_envelope_min_mean_max_and_wins(build_runs):
    frame = build_runs(
        no_sync=[0.05, 0.40],
        policies={"wa_diloco": [0.20, 0.70]},
        draws={"wa_diloco": [[0.10, 0.20, 0.60], [0.50, 0.60, 0.70, 0.80]]},
    )
    seeds = protocol_of(frame).seeds
    first, second = seed_row(seeds, "wa_diloco", 0), seed_row(seeds, "wa_diloco", 1)
    assert [first[f"mr_slo_pct_{s}"] for s in ("min", "mean", "max")] == pytest.approx([10.0, 30.0, 60.0])
    assert [first[f"mr_sync_excess_pct_{s}"] for s in ("min", "mean", "max")] == pytest.approx([5.0, 25.0, 55.0])
    assert [second[f"mr_sync_excess_pct_{s}"] for s in ("min", "mean", "max")] == pytest.approx([10.0, 25.0, 40.0])
    assert (first["n_draws"], second["n_draws"]) == (3, 4)
    assert bool(first["won"]) and not bool(second["won"])  # 20 < 30; 70 > 65
    assert first["delta_vs_mr_pct"] == pytest.approx(-10.0)


def test_a_tie_with_the_envelope_mean_is_not_a_win(build_runs):
    # (0.1 + 0.5 + 0.3) / 3 is 0.30000000000000004 in floating point.
    frame = build_runs(no_sync=[0.0] * 4, policies={"wa_diloco": [0.3] * 4}, draws={"wa_diloco": [[0.1, 0.5, 0.3]] * 4})
    summary = protocol_of(frame).policies.set_index("policy").loc["wa_diloco"]
    assert summary["seeds_won"] == 0
    assert summary["p_vs_matched_random"] == 1.0


def test_paired_p_values_against_matched_random_and_fixed_h(clear_winner):
    policies = protocol_of(clear_winner).policies.set_index("policy")
    winner = policies.loc["wa_diloco"]
    assert winner["n_seeds"] == 6 and winner["seeds_won"] == 6
    assert winner["p_vs_matched_random"] == pytest.approx(1 / 64)
    assert winner["p_vs_fixed_h"] == pytest.approx(1 / 64)
    assert winner["n_seeds_vs_fixed_h"] == 6
    assert winner["ci_low"] < winner["sync_excess_pct_mean"] < winner["ci_high"]
    assert policies.loc["fixed_h", "p_vs_fixed_h"] == 1.0  # not tested against itself


def test_reference_rows_are_described_not_tested(clear_winner):
    policies = protocol_of(clear_winner).policies.set_index("policy")
    assert set(policies.index) == {"no_sync", "matched_random", "wa_diloco", "fixed_h"}
    assert policies.loc["no_sync", "sync_excess_pct_mean"] == 0.0
    assert policies.loc["matched_random", "sync_excess_pct_mean"] == pytest.approx(5.0)
    for policy in ("no_sync", "matched_random"):
        assert policies.loc[policy, ["p_vs_matched_random", "p_unpaired", "p_vs_fixed_h"]].tolist() == [1.0] * 3
    assert not policies[["p_vs_matched_random", "p_unpaired", "p_vs_fixed_h"]].isna().any().any()


def test_single_seed_gives_no_evidence_but_no_nan(build_runs):
    frame = build_runs(no_sync=[0.1], policies={"wa_diloco": [0.1]}, draws={"wa_diloco": [[0.3, 0.4]]})
    winner = protocol_of(frame).policies.set_index("policy").loc["wa_diloco"]
    assert winner["seeds_won"] == 1
    assert (winner["p_vs_matched_random"], winner["p_unpaired"], winner["p_vs_fixed_h"]) == (1.0, 1.0, 1.0)
    assert (winner["ci_low"], winner["ci_high"]) == (float("-inf"), float("inf"))


def test_latency_columns_are_averaged_when_present(build_runs):
    frame = build_runs(no_sync=[0.1, 0.2], policies={"wa_diloco": [0.1, 0.2]}, draws={"wa_diloco": [[0.1], [0.2]]})
    frame["p95_ms"] = [100.0, 200.0, 300.0, 500.0, 0.0, 0.0]
    frame["n_merges"] = [0, 0, 4, 6, 4, 6]
    policies = protocol_of(frame).policies.set_index("policy")
    assert policies.loc["wa_diloco", "p95_ms_mean"] == pytest.approx(400.0)
    assert policies.loc["wa_diloco", "n_merges_mean"] == pytest.approx(5.0)
    assert "p99_ms_mean" not in policies.columns
