"""Protocol numbers on constructed data: sync-excess, envelope, wins, p-values."""

from __future__ import annotations

import numpy as np
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


def test_rank_and_sign_flip_p_values_and_gap_closed(clear_winner):
    result = protocol_of(clear_winner)
    policies = result.policies.set_index("policy")
    winner = policies.loc["wa_diloco"]
    assert winner["n_seeds"] == 6 and winner["seeds_won"] == 6
    assert winner["p_rank"] == pytest.approx(4.0 ** -6)  # lowest of 4 on all 6 seeds
    assert winner["rank_mean"] == 0.0
    assert winner["p_vs_matched_random"] == pytest.approx(1 / 64)
    assert winner["p_vs_fixed_cadence"] == pytest.approx(1 / 64)  # 6/6 below the even cadence
    assert winner["gap_closed_mean"] == pytest.approx(0.8) and winner["gap_closed_seeds"] == "6/6"
    assert winner["even_sync_excess_pct_mean"] == pytest.approx(4.0)
    assert winner["oracle_sync_excess_pct_mean"] == pytest.approx(0.0)
    assert winner["ci_low"] < winner["sync_excess_pct_mean"] < winner["ci_high"]
    assert policies.loc["fixed_h", "p_vs_fixed_cadence"] == 1.0  # ties its own even cadence everywhere
    assert result.seeds.loc[result.seeds["policy"] == "wa_diloco", "gap_closed"].tolist() == pytest.approx([0.8] * 6)


def test_adjusted_p_gatekeeps_on_the_declared_primary(clear_winner):
    plain = run_protocol(load_runs_table(clear_winner)).policies.set_index("policy")
    # one Holm family of four: both tier tests (matched random, fixed cadence) of both controllers
    assert plain.loc["wa_diloco", "p_adjusted"] == pytest.approx(4 * 4.0 ** -6)
    gated = run_protocol(load_runs_table(clear_winner), primary=("fixed_h", "bursty")).policies.set_index("policy")
    assert gated.loc["fixed_h", "p_adjusted"] == gated.loc["fixed_h", "p_rank"]
    assert gated.loc["wa_diloco", "p_adjusted"] == gated.loc["fixed_h", "p_rank"]  # the failed gate caps it
    assert bool(gated.loc["fixed_h", "primary"]) and not bool(gated.loc["wa_diloco", "primary"])


def test_a_gap_random_already_closed_is_left_out(build_runs):
    frame = build_runs(
        no_sync=[0.1, 0.1], policies={"wa_diloco": [0.1, 0.15]}, draws={"wa_diloco": [[0.1, 0.1], [0.2, 0.2]]},
        references={"slo_oracle": {"wa_diloco": [0.1, 0.1]}},
    )
    summary = protocol_of(frame).policies.set_index("policy").loc["wa_diloco"]
    assert summary["gap_closed_seeds"] == "1/2" and summary["gap_closed_mean"] == pytest.approx(0.5)
    # a gap smaller than one request (rates over 200 requests: 0.5 pp) is no gap to close
    frame["n_requests"] = 200
    frame.loc[(frame["policy"] == "matched_random") & (frame["seed"] == 1), "slo_violation_rate"] = [0.102, 0.102]
    tiny = protocol_of(frame).policies.set_index("policy").loc["wa_diloco"]
    assert tiny["gap_closed_seeds"] == "0/2" and np.isnan(tiny["gap_closed_mean"])


def test_training_non_inferiority_against_fixed_h(build_runs):
    no_sync = [0.1] * 6
    frame = build_runs(no_sync=no_sync, policies={"fixed_h": no_sync, "wa_diloco": no_sync, "wa_forecast": no_sync},
                       draws={p: [[0.2]] * 6 for p in ("fixed_h", "wa_diloco", "wa_forecast")})
    losses = {"fixed_h": [4.0] * 6, "wa_diloco": [4.0, 4.01, 3.99, 4.0, 4.02, 3.98], "wa_forecast": [4.2] * 6}
    frame["eval_loss"] = [
        losses[r.policy][r.seed] if r.policy in losses else np.nan for r in frame.itertuples()
    ]
    policies = run_protocol(load_runs_table(frame), loss_margin=0.01).policies.set_index("policy")
    assert policies.loc["fixed_h", "training"] == "non-inferior"
    assert policies.loc["wa_diloco", "training"] == "non-inferior"
    assert policies.loc["wa_forecast", "training"] == "hurts training"
    assert policies.loc["wa_forecast", "loss_rel_diff_mean"] == pytest.approx(0.05)
    no_losses = protocol_of(frame.drop(columns="eval_loss")).policies.set_index("policy")
    assert no_losses.loc["wa_diloco", "training"] == "not measured"


def test_references_are_columns_and_no_sync_the_only_reference_row(clear_winner):
    policies = protocol_of(clear_winner).policies.set_index("policy")
    assert set(policies.index) == {"no_sync", "wa_diloco", "fixed_h"}
    assert policies.loc["no_sync", "sync_excess_pct_mean"] == 0.0
    assert policies.loc["no_sync", ["p_rank", "p_vs_matched_random", "p_vs_fixed_cadence", "p_adjusted"]].tolist() == [1.0] * 4


def test_single_seed_gives_no_evidence_but_no_nan(build_runs):
    frame = build_runs(no_sync=[0.1], policies={"wa_diloco": [0.1]}, draws={"wa_diloco": [[0.3, 0.4]]})
    winner = protocol_of(frame).policies.set_index("policy").loc["wa_diloco"]
    assert winner["seeds_won"] == 1
    assert winner["p_vs_matched_random"] == 1.0 and winner["p_vs_fixed_cadence"] == 1.0
    assert winner["p_rank"] == pytest.approx(1 / 3)  # one seed: the smallest exact p is 1 / (K + 1)
    assert (winner["ci_low"], winner["ci_high"]) == (float("-inf"), float("inf"))


def test_latency_columns_are_averaged_when_present(build_runs):
    frame = build_runs(no_sync=[0.1, 0.2], policies={"wa_diloco": [0.1, 0.2]}, draws={"wa_diloco": [[0.1], [0.2]]})
    frame["p95_ms"] = [100.0, 200.0, 300.0, 500.0, 0.0, 0.0]
    frame["n_merges"] = [0, 0, 4, 6, 4, 6]
    policies = protocol_of(frame).policies.set_index("policy")
    assert policies.loc["wa_diloco", "p95_ms_mean"] == pytest.approx(400.0)
    assert policies.loc["wa_diloco", "n_merges_mean"] == pytest.approx(5.0)
    assert "p99_ms_mean" not in policies.columns
