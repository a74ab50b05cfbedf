"""No hole in the verdict: each way a report line could claim more than its evidence, closed and checked."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from syncsafe.analysis import analyze_runs
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence, RegimeFidelity, SignAgreement
from syncsafe.analysis.multiplicity import gatekept_adjusted
from syncsafe.analysis.protocol import ProtocolError, run_protocol
from syncsafe.analysis.runs_table import RunsTableError, load_runs_table
from syncsafe.analysis.synthetic import synthetic_runs
from syncsafe.analysis.verdicts import Tier, assign_tiers, assign_verdict
from syncsafe.cli import app
from syncsafe.config import ConfigError, FidelityTargets, parse_params
from verdict_rows import winner_row


def agreement(seed: int, real: float, sim: float, policy: str = "wa_diloco", regime: str = "bursty") -> dict:
    return {"regime": regime, "policy": policy, "seed": seed, "n_draws": 2, "real_delta_pct": real,
            "sim_delta_pct": sim}


def fidelity(held_out=(1, 2, 3), signs=None, **fields) -> FidelityEvidence:
    signs = [agreement(s, -2.0, -1.0) for s in held_out] if signs is None else signs
    return FidelityEvidence.model_validate({
        "calibration": "fitted", "fit_seeds": [0], "held_out_seeds": list(held_out), "n_held_out_replays": 12,
        "p95_rel_error_max": 0.1, "slo_abs_error_pp_max": 1.0, "sync_ratio_paired_sim_over_real": 1.0,
        "sign_agreement": signs, **fields})


def test_a_row_rests_on_the_simulator_unless_every_replay_behind_it_is_real(mechanism, clear_winner):
    evidence = mechanism("bursty")
    # controller and no-sync on vLLM, its draws and references on the simulator: the row needs a licence
    mixed = clear_winner.copy()
    mixed.loc[mixed["policy"].isin(["wa_diloco", "no_sync"]), "backend"] = "vllm"
    policies = run_protocol(load_runs_table(mixed)).policies
    row = policies.set_index("policy").loc["wa_diloco"]
    assert row["backend"] == "simulator+vllm"
    assert assign_tiers(policies, evidence).set_index("policy").loc["wa_diloco", "tier"] == "mechanism transfers"
    # some seeds unmarked: unspecified counts as not real
    assert assign_verdict(winner_row(backend="unspecified+vllm"), evidence).tier is Tier.MECHANISM_TRANSFERS
    assert assign_verdict(winner_row(backend="vllm"), evidence).tier is Tier.BEATS_MATCHED_RANDOM


def test_every_declared_held_out_seed_needs_a_valid_agreement():
    assert fidelity().licenses("wa_diloco", "bursty")
    missing = fidelity(signs=[agreement(1, -2.0, -1.0), agreement(2, -2.0, -1.0)])
    assert any("held-out seed(s) [3]" in f for f in missing.failures("wa_diloco", "bursty"))
    no_held_out = fidelity(held_out=(), signs=[agreement(0, -2.0, -1.0)])
    assert any("no held-out seeds declared" in f for f in no_held_out.failures("wa_diloco", "bursty"))
    fit_only = fidelity(signs=[agreement(0, -2.0, -1.0)])  # the fit seed's agreement does not stand in
    assert not fit_only.licenses("wa_diloco", "bursty")


def test_zero_against_zero_is_a_tie_that_carries_no_information():
    tie = SignAgreement(**agreement(1, 0.0, 0.0))
    assert tie.agree and tie.tie
    all_ties = fidelity(signs=[agreement(s, 0.0, 0.0) for s in (1, 2, 3)])
    [reason] = all_ties.failures("wa_diloco", "bursty")
    assert "no held-out seed of wa_diloco in bursty with a non-zero real" in reason and "3 of 3 zero" in reason
    one_real = fidelity(signs=[agreement(1, 0.0, 0.0), agreement(2, 0.0, 0.0), agreement(3, 1.0, 0.5)])
    assert one_real.licenses("wa_diloco", "bursty")


def test_not_measured_training_blocks_the_top_tier(mechanism):
    evidence = mechanism("bursty")
    for training in ("not measured", "not shown non-inferior", "hurts training"):
        verdict = assign_verdict(winner_row(backend="vllm", training=training), evidence)
        assert verdict.tier is Tier.BEATS_FIXED_CADENCE and training in verdict.reason
    no_column = {k: v for k, v in winner_row(backend="vllm").items() if k != "training"}
    assert assign_verdict(no_column, evidence).tier is Tier.BEATS_FIXED_CADENCE


def test_non_inferiority_needs_a_loss_on_every_seed(clear_winner):
    frame = clear_winner.copy()
    frame.loc[(frame["policy"] == "wa_diloco") & (frame["seed"] == 3), "eval_loss"] = np.nan
    row = run_protocol(load_runs_table(frame)).policies.set_index("policy").loc["wa_diloco"]
    assert row["training"] == "not measured" and row["loss_seeds"] == "5/6"


@pytest.mark.parametrize("key, value", [
    ("fidelity.p95_rel_error_max", 100), ("fidelity.slo_abs_error_pp_max", 5.0),
    ("fidelity.sync_ratio_paired_low", 0.5), ("fidelity.sync_ratio_paired_high", 2.0),
    ("loss_margin", 1.0), ("gate_ratio_threshold", 1.0), ("alpha", 0.5),
])
def test_the_schema_lets_a_user_tighten_the_targets_never_loosen_them(raw_params, key, value):
    node = raw_params["analysis"]
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    with pytest.raises(ConfigError, match=f"analysis.{key}"):
        parse_params(raw_params)


def test_verdicts_judge_against_params_not_the_targets_the_evidence_files_recorded(clear_winner, mechanism, tmp_path):
    # the file recorded a loose p95 target (built around the schema, as an old or hand-made file could be)
    stored = fidelity(p95_rel_error_max=0.5).model_copy(
        update={"targets": FidelityTargets.model_construct(p95_rel_error_max=1.0, slo_abs_error_pp_max=3.0,
                                                           sync_ratio_paired_low=0.8, sync_ratio_paired_high=1.25)})
    assert stored.licenses("wa_diloco", "bursty")
    out = analyze_runs(clear_winner, tmp_path / "a", mechanism("bursty"), fidelity=stored, targets=FidelityTargets())
    row = out.policy_table.set_index("policy").loc["wa_diloco"]
    assert row["tier"] == "mechanism transfers" and "held-out p95 error 50% misses its target <= 15%" in row["reason"]
    strict_gate = analyze_runs(clear_winner, tmp_path / "b", mechanism("bursty"), fidelity=fidelity(),
                               gate_ratio_threshold=2.0)
    assert strict_gate.policy_table.set_index("policy").loc["wa_diloco", "tier"] == "stress harness only"
    assert "gate threshold used: 2" in strict_gate.report


def test_a_policy_not_checked_on_the_real_server_stops_at_mechanism_transfers(mechanism):
    checked = fidelity()  # wa_diloco on bursty only
    assert checked.licenses("wa_diloco", "bursty")
    verdict = assign_verdict(winner_row(policy="wa_forecast"), mechanism("bursty"), fidelity=checked)
    assert verdict.tier is Tier.MECHANISM_TRANSFERS and "wa_forecast was not checked on the real server" in verdict.reason
    other_regime = assign_verdict(winner_row(regime="steady"), mechanism("bursty", "steady"), fidelity=checked)
    assert other_regime.tier is Tier.MECHANISM_TRANSFERS and "not checked on the real server in steady" in other_regime.reason


def test_a_regime_s_own_fidelity_figures_license_its_rows(mechanism):
    per_regime = fidelity(regimes={"bursty": RegimeFidelity(n_held_out_replays=6, p95_rel_error_max=0.4,
                                                            slo_abs_error_pp_max=1.0,
                                                            sync_ratio_paired_sim_over_real=1.0)})
    assert any("held-out p95 error in bursty 40%" in f for f in per_regime.failures("wa_diloco", "bursty"))


def test_a_non_finite_p95_error_fails_its_target():
    unknown = RegimeFidelity(n_held_out_replays=3, p95_rel_error_max=float("inf"), slo_abs_error_pp_max=1.0,
                             sync_ratio_paired_sim_over_real=1.0)
    assert any("p95 error in bursty not computable" in f
               for f in fidelity(regimes={"bursty": unknown}).failures("wa_diloco", "bursty"))


def test_one_family_across_both_tier_tests_keeps_the_family_wise_error_at_alpha():
    """Global null, 8 (policy, regime) rows x 2 tests, independent uniform p: rejections of any claim."""
    rng = np.random.default_rng(0)
    keys = [(kind, f"p{i}", "r") for kind in ("matched random", "fixed cadence") for i in range(8)]
    sims, alpha = 20000, 0.05
    any_rejected = 0
    for _ in range(sims):
        p = dict(zip(keys, rng.uniform(size=len(keys))))
        adjusted = gatekept_adjusted(p, ("matched random", "p0", "r"))
        any_rejected += min(adjusted.values()) < alpha
    rate = any_rejected / sims
    assert rate <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / sims), rate  # two separate Holm families reach ~2 alpha


def test_the_cadence_test_is_gatekept_by_the_primary(clear_winner):
    gated = run_protocol(load_runs_table(clear_winner), primary=("fixed_h", "bursty")).policies.set_index("policy")
    gate = gated.loc["fixed_h", "p_rank"]
    assert gated.loc["wa_diloco", "p_vs_fixed_cadence_adjusted"] >= gate > 0.05  # nothing passes a failed gate


def test_external_tables_with_other_merge_counts_or_a_losing_oracle_are_refused():
    frame = synthetic_runs(regimes=("bursty",), effects={"wa_diloco": -0.02}, n_seeds=3, n_draws=3)
    draws = frame.index[frame["policy"] == "matched_random"]
    bad = frame.copy()
    bad.loc[draws[4], "n_merges"] = 5
    with pytest.raises(RunsTableError, match=rf"row {draws[4]}: matched_random of 'wa_diloco'.*has 5 merges, its controller 6"):
        load_runs_table(bad)
    worse = frame.copy()
    oracle = worse.index[worse["policy"] == "slo_oracle"][1]
    worse.loc[oracle, "slo_violation_rate"] = 0.99
    with pytest.raises(RunsTableError, match=rf"row {oracle}: slo_oracle of 'wa_diloco'.*seed 1.*never worse"):
        load_runs_table(worse)


def test_a_negative_gap_to_the_oracle_is_an_error_naming_the_seed(build_runs):
    frame = build_runs(no_sync=[0.1, 0.1], policies={"wa_diloco": [0.12, 0.15]},
                       draws={"wa_diloco": [[0.12, 0.14], [0.2, 0.2]]},
                       references={"slo_oracle": {"wa_diloco": [0.1, 0.1]}})
    table = load_runs_table(frame)
    # the table passes its own check (oracle <= min); a contradicting oracle set after loading fails the protocol
    table.frame.loc[(table.frame["policy"] == "slo_oracle") & (table.frame["seed"] == 1), "slo_violation_rate"] = 0.3
    with pytest.raises(ProtocolError, match="bursty/wa_diloco/seed 1: the SLO oracle"):
        run_protocol(table)


def test_gap_closed_shows_its_seeds_and_undefined_where_no_seed_defines_it(build_runs, tmp_path, mechanism):
    frame = build_runs(no_sync=[0.1, 0.1], policies={"wa_diloco": [0.1, 0.1]},
                       draws={"wa_diloco": [[0.1, 0.1], [0.1, 0.1]]},
                       references={"slo_oracle": {"wa_diloco": [0.1, 0.1]}})
    result = analyze_runs(frame, tmp_path, mechanism("bursty"))
    row = result.policy_table.set_index("policy").loc["wa_diloco"]
    assert row["gap_closed_seeds"] == "0/2" and np.isnan(row["gap_closed_mean"])
    assert "undefined (0/2 seeds)" in result.report


def test_analyze_runs_takes_alpha_from_params_and_caps_it(tmp_path, params_file):
    runs = tmp_path / "runs.csv"
    synthetic_runs(regimes=("bursty",), n_seeds=2, n_draws=2).to_csv(runs, index=False)
    too_lax = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "a"), "--alpha", "0.5",
                                       "--params", str(params_file)])
    assert too_lax.exit_code == 2
    ok = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "b"), "--params",
                                  str(params_file)])
    assert ok.exit_code == 0, ok.output
    assert "alpha = 0.05" in (tmp_path / "b" / "report.md").read_text()
