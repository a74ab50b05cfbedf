"""Claim tiers: never more than the evidence licenses."""

from __future__ import annotations

import pydantic
import pytest

from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence, RegimeMechanism
from syncsafe.analysis.protocol import run_protocol
from syncsafe.analysis.runs_table import load_runs_table
from syncsafe.analysis.verdicts import Tier, assign_tiers, assign_verdict
from verdict_rows import winner_row as row


def tiers_of(frame, mechanism, fidelity=None, alpha=0.05, primary=None) -> dict[str, Tier]:
    policies = run_protocol(load_runs_table(frame), primary=primary).policies
    table = assign_tiers(policies, mechanism, fidelity=fidelity, alpha=alpha)
    return {row.policy: Tier(row.tier) for row in table.itertuples()}


def test_clear_winner_with_mechanism_and_licensed_simulator_beats_matched_random(clear_winner, mechanism, fidelity):
    tiers = tiers_of(clear_winner, mechanism("bursty"), fidelity("bursty"))
    assert tiers == {"wa_diloco": Tier.BEATS_MATCHED_RANDOM, "fixed_h": Tier.MECHANISM_TRANSFERS,
                     "no_sync": Tier.REFERENCE}


def test_without_mechanism_evidence_only_stress_harness(clear_winner, mechanism, fidelity):
    licensed = fidelity("bursty")
    assert tiers_of(clear_winner, None, licensed)["wa_diloco"] is Tier.STRESS_HARNESS_ONLY
    assert tiers_of(clear_winner, mechanism("steady"), licensed)["wa_diloco"] is Tier.STRESS_HARNESS_ONLY
    assert tiers_of(clear_winner, mechanism("bursty", sync_ratio_paired=1.06), licensed)["wa_diloco"] is Tier.STRESS_HARNESS_ONLY


def test_a_missing_drift_control_fails_the_mechanism_gate(clear_winner, fidelity):
    no_drift = MechanismEvidence(regimes={"bursty": RegimeMechanism(sync_ratio_paired=3.0)})
    assert not no_drift.shows("bursty") and "no drift control" in no_drift.describe("bursty")
    assert tiers_of(clear_winner, no_drift, fidelity("bursty"))["wa_diloco"] is Tier.STRESS_HARNESS_ONLY


def test_simulator_rows_need_a_fitted_simulator_that_meets_its_targets(clear_winner, mechanism, fidelity):
    evidence = mechanism("bursty")
    assert tiers_of(clear_winner, evidence, None)["wa_diloco"] is Tier.MECHANISM_TRANSFERS
    default = fidelity("bursty").model_copy(update={"calibration": "default"})
    assert tiers_of(clear_winner, evidence, default)["wa_diloco"] is Tier.MECHANISM_TRANSFERS
    inaccurate = fidelity("bursty").model_copy(update={"p95_rel_error_max": 0.39})
    verdict = assign_verdict(row(), evidence, fidelity=inaccurate)
    assert verdict.tier is Tier.MECHANISM_TRANSFERS and "held-out p95 error 39%" in verdict.reason
    flipped = FidelityEvidence.model_validate(fidelity("bursty").model_dump() | {"sign_agreement": [
        {"regime": "bursty", "policy": "wa_diloco", "seed": 1, "n_draws": 3, "real_delta_pct": 2.0, "sim_delta_pct": -1.0}
    ], "held_out_seeds": [1]})
    verdict = assign_verdict(row(), evidence, fidelity=flipped)
    assert verdict.tier is Tier.MECHANISM_TRANSFERS and "disagree on the sign" in verdict.reason
    # a table replayed on the real backend alone needs no simulator
    real = assign_verdict(row(backend="vllm"), evidence, fidelity=None)
    assert real.tier is Tier.BEATS_MATCHED_RANDOM


def test_policy_equal_to_matched_random_never_beats_it(build_runs, mechanism, fidelity):
    """Same SLO as its matched-random mean on every seed (with float noise), far better
    than its even cadence, real mechanism shown: still not 'beats matched random', even at alpha 0.5."""
    no_sync = [0.0, 0.1, 0.2, 0.3, 0.05, 0.15, 0.25, 0.35]
    frame = build_runs(
        no_sync=no_sync,
        policies={"wa_diloco": [b + 0.3 for b in no_sync]},
        draws={"wa_diloco": [[b + 0.1, b + 0.5, b + 0.3] for b in no_sync]},
        references={"even_cadence": {"wa_diloco": [b + 0.5 for b in no_sync]}},
    )
    tier = tiers_of(frame, mechanism("bursty"), fidelity("bursty"), alpha=0.5)["wa_diloco"]
    assert tier is Tier.BEATS_FIXED_CADENCE


@pytest.mark.parametrize("p_adjusted", [0.05, 0.2, 1.0])
def test_not_better_than_matched_random_never_gets_the_top_tier(p_adjusted, mechanism, fidelity):
    verdict = assign_verdict(row(p_adjusted=p_adjusted, p_rank=1e-9), mechanism("bursty"), fidelity=fidelity("bursty"))
    assert verdict.tier is Tier.BEATS_FIXED_CADENCE and "adjusted p" in verdict.reason


@pytest.mark.parametrize("training", ["hurts training", "not shown non-inferior"])
def test_a_policy_that_hurts_training_cannot_take_the_top_tier(training, mechanism, fidelity):
    verdict = assign_verdict(row(training=training, loss_rel_diff_mean=0.03, loss_rel_diff_ci_high=0.05),
                             mechanism("bursty"), fidelity=fidelity("bursty"))
    assert verdict.tier is Tier.BEATS_FIXED_CADENCE and training in verdict.reason


def test_gates_in_order_with_reasons(mechanism, fidelity):
    evidence, licensed = mechanism("bursty"), fidelity("bursty")
    top = assign_verdict(row(), evidence, fidelity=licensed)
    assert top.tier is Tier.BEATS_MATCHED_RANDOM and "10/10 seeds won" in top.reason and "gap closed 80%" in top.reason
    loses_cadence = assign_verdict(row(p_vs_fixed_cadence_adjusted=0.3), evidence, fidelity=licensed)
    assert loses_cadence.tier is Tier.MECHANISM_TRANSFERS and "evenly spaced" in loses_cadence.reason
    weak = assign_verdict(row(), mechanism("bursty", sync_ratio_paired=1.01), fidelity=licensed)
    assert weak.tier is Tier.STRESS_HARNESS_ONLY and "0.99" in weak.reason
    assert assign_verdict(row(), None).reason.startswith("no real-backend mechanism evidence")
    reference = assign_verdict(row(policy="no_sync"), evidence)
    assert reference.tier is Tier.REFERENCE and "baseline" in reference.reason


def test_tier_order_and_validation(mechanism):
    assert [t.rank for t in Tier] == [0, 1, 2, 3, 4]
    assert [str(t) for t in Tier] == ["reference", "stress harness only", "mechanism transfers", "beats fixed cadence",
                                      "beats matched random"]
    with pytest.raises(pydantic.ValidationError):
        MechanismEvidence(regimes={"bursty": {"sync_ratio_paired": 1.2, "backend": "simulator"}})
    with pytest.raises(pydantic.ValidationError):
        FidelityEvidence(calibration="guessed")
    with pytest.raises(ValueError, match="alpha"):
        assign_verdict(row(), mechanism("bursty"), alpha=0.0)
