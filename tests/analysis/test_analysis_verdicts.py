"""Claim tiers: never more than the evidence licenses."""

from __future__ import annotations

import itertools

import pydantic
import pytest

from syncsafe.analysis.protocol import run_protocol
from syncsafe.analysis.runs_table import load_runs_table
from syncsafe.analysis.verdicts import MechanismEvidence, Tier, assign_tiers, assign_verdict


def tiers_of(frame, mechanism, alpha=0.05) -> dict[str, Tier]:
    policies = assign_tiers(run_protocol(load_runs_table(frame)).policies, mechanism, alpha=alpha)
    return {row.policy: Tier(row.tier) for row in policies.itertuples()}


def row(**overrides) -> dict:
    """A policy-table row of a clear winner, with fields overridden."""
    base = dict(
        regime="bursty", policy="wa_diloco", n_seeds=10, seeds_won=10, backend="simulator",
        sync_excess_pct_mean=1.0, mr_sync_excess_pct_mean=5.0,
        p_vs_matched_random=0.001, n_seeds_vs_fixed_h=10, p_vs_fixed_h=0.001,
    )
    return {**base, **overrides}


def test_clear_winner_with_mechanism_beats_matched_random(clear_winner, mechanism):
    tiers = tiers_of(clear_winner, mechanism("bursty"))
    assert tiers["wa_diloco"] is Tier.BEATS_MATCHED_RANDOM
    assert tiers["fixed_h"] is Tier.MECHANISM_TRANSFERS  # the fixed-cadence baseline cannot beat itself
    assert tiers["no_sync"] is tiers["matched_random"] is Tier.REFERENCE


def test_without_mechanism_evidence_only_stress_harness(clear_winner, mechanism):
    assert tiers_of(clear_winner, None)["wa_diloco"] is Tier.STRESS_HARNESS_ONLY
    assert tiers_of(clear_winner, mechanism("steady"))["wa_diloco"] is Tier.STRESS_HARNESS_ONLY  # other regime
    assert tiers_of(clear_winner, mechanism("bursty", sync_ratio=1.04))["wa_diloco"] is Tier.STRESS_HARNESS_ONLY
    assert tiers_of(clear_winner, mechanism("bursty", sync_ratio=1.05))["wa_diloco"] is Tier.STRESS_HARNESS_ONLY


def test_policy_equal_to_matched_random_never_beats_it(build_runs, mechanism):
    """Same SLO as its matched-random mean on every seed (with float noise),
    far better than fixed_h, real mechanism shown: still not 'beats matched random'."""
    no_sync = [0.0, 0.1, 0.2, 0.3, 0.05, 0.15, 0.25, 0.35]
    frame = build_runs(
        no_sync=no_sync,
        policies={"wa_diloco": [b + 0.3 for b in no_sync], "fixed_h": [b + 0.5 for b in no_sync]},
        draws={
            "wa_diloco": [[b + 0.1, b + 0.5, b + 0.3] for b in no_sync],
            "fixed_h": [[b + 0.5, b + 0.6] for b in no_sync],
        },
    )
    assert tiers_of(frame, mechanism("bursty"), alpha=0.5)["wa_diloco"] is Tier.BEATS_FIXED_CADENCE


@pytest.mark.parametrize(
    "p_vs_mr, seeds_won",
    [(p, w) for p, w in itertools.product([0.05, 0.2, 1.0], [0, 5, 10])] + [(0.001, 5), (0.001, 0)],
)
def test_not_better_than_matched_random_never_gets_the_top_tier(p_vs_mr, seeds_won, mechanism):
    verdict = assign_verdict(row(p_vs_matched_random=p_vs_mr, seeds_won=seeds_won), mechanism("bursty"))
    assert verdict.tier is not Tier.BEATS_MATCHED_RANDOM
    assert verdict.tier is Tier.BEATS_FIXED_CADENCE


def test_gates_in_order_with_reasons(mechanism):
    evidence = mechanism("bursty")
    top = assign_verdict(row(), evidence)
    assert top.tier is Tier.BEATS_MATCHED_RANDOM and "10/10 seeds won" in top.reason
    no_fixed = assign_verdict(row(n_seeds_vs_fixed_h=0, p_vs_fixed_h=1.0), evidence)
    assert no_fixed.tier is Tier.MECHANISM_TRANSFERS and "no fixed_h runs" in no_fixed.reason
    loses_fixed = assign_verdict(row(p_vs_fixed_h=0.3), evidence)
    assert loses_fixed.tier is Tier.MECHANISM_TRANSFERS and "fixed_h" in loses_fixed.reason
    weak = assign_verdict(row(), mechanism("bursty", sync_ratio=1.01))
    assert weak.tier is Tier.STRESS_HARNESS_ONLY and "1.01" in weak.reason
    assert assign_verdict(row(), None).reason.startswith("no real-backend mechanism evidence")
    reference = assign_verdict(row(policy="offline_bound"), evidence)
    assert reference.tier is Tier.REFERENCE and "not deployable" in reference.reason


def test_tier_order_and_mechanism_validation():
    assert [t.rank for t in Tier] == [0, 1, 2, 3, 4]
    assert Tier.STRESS_HARNESS_ONLY.rank < Tier.BEATS_MATCHED_RANDOM.rank
    custom = MechanismEvidence(regimes={"bursty": {"sync_ratio": 1.2, "pressure_ratio": 1.5}}, sync_ratio_threshold=1.3)
    assert not custom.shows("bursty")
    with pytest.raises(pydantic.ValidationError):
        MechanismEvidence(regimes={"bursty": {"sync_ratio": 1.2, "pressure_ratio": 1.5, "backend": "simulator"}})
    with pytest.raises(ValueError, match="alpha"):
        assign_verdict(row(), custom, alpha=0.0)


def test_a_drifted_mechanism_measurement_licenses_nothing():
    from syncsafe.analysis.verdicts import MechanismEvidence, RegimeMechanism

    steady = MechanismEvidence(regimes={"bursty": RegimeMechanism(sync_ratio=1.8, pressure_ratio=1.2, drift_ratio=1.1)})
    drifted = MechanismEvidence(regimes={"bursty": RegimeMechanism(sync_ratio=1.8, pressure_ratio=1.2, drift_ratio=4.3)})
    assert steady.shows("bursty") and not steady.drifted("bursty")
    assert drifted.drifted("bursty") and not drifted.shows("bursty")
    assert "drifted: measurement not trusted" in drifted.describe("bursty")
