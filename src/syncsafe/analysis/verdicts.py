"""Claim tiers: what the evidence licenses per policy x regime, never more.

Tiers, lowest to highest; each requires every gate below it:

1. ``stress harness only``: the default. Without a real-backend (vLLM)
   measurement showing the merge mechanism for the regime, a result licenses
   no serving claim, whatever its numbers.
2. ``mechanism transfers``: :class:`MechanismEvidence` for the regime shows
   the sync effect on the real server (see :mod:`syncsafe.analysis.evidence`).
   Rows that rest on the simulator (any replay behind them not on the real
   backend) go no further unless the simulator is licensed for that
   (policy, regime): fitted to real replays, meeting its held-out fidelity
   targets in the regime, and checked against the real server for that
   policy on every held-out seed (:class:`FidelityEvidence`).
3. ``beats fixed cadence``: the adjusted sign-test p against the evenly
   spaced schedule of the controller's own merge count is below alpha (one
   family with the matched-random tests: :func:`syncsafe.analysis.protocol.with_adjusted_p`).
4. ``beats matched random``: the adjusted rank-test p (declared primary
   first, then Holm) against the matched-random draws from the controller's
   own action space is below alpha, and training is shown non-inferior (eval
   loss, measured on every seed, not worse than fixed_h's beyond
   ``analysis.loss_margin``; not measured blocks this tier).

``no_sync`` is the reference row: tier ``reference``, no claim. Every verdict
carries a reason naming the gate that stopped it and the numbers observed,
and, where a tier test cannot reach alpha whatever the data (its smallest
achievable p, ``p_rank_min`` / ``p_vs_fixed_cadence_min``, above alpha),
that it is underpowered: such a "no" is no evidence against the policy.

Rows of the real-only block (``block`` = ``vllm``: the real replays judged on
their own) rest on the real server alone, so they need no simulator licence,
but the same mechanism gate and the same tests in the same family.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence, RegimeMechanism
from syncsafe.analysis.runs_table import NO_SYNC, REAL_BLOCK, is_controller

DEFAULT_ALPHA = 0.05
__all__ = ["FidelityEvidence", "MechanismEvidence", "RegimeMechanism", "Tier", "Verdict", "assign_tiers", "assign_verdict"]


class Tier(StrEnum):
    """A claim tier; ``rank`` orders the claims (reference = 0, not a claim)."""

    REFERENCE = "reference"
    STRESS_HARNESS_ONLY = "stress harness only"
    MECHANISM_TRANSFERS = "mechanism transfers"
    BEATS_FIXED_CADENCE = "beats fixed cadence"
    BEATS_MATCHED_RANDOM = "beats matched random"

    @property
    def rank(self) -> int:
        return list(Tier).index(self)


REFERENCE_REASONS = {
    NO_SYNC: "no-sync replay of the same load: the baseline of sync-excess; not a claim",
}
#: Training verdicts that keep a policy from the top tier: anything but shown non-inferior on every seed.
BLOCKING_TRAINING = ("hurts training", "not shown non-inferior", "not measured")


@dataclass(frozen=True)
class Verdict:
    regime: str
    policy: str
    tier: Tier
    reason: str


def assign_verdict(
    row: Mapping[str, Any],
    mechanism: MechanismEvidence | None,
    *,
    fidelity: FidelityEvidence | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> Verdict:
    """The highest tier `row` (a policy-table row) licenses, with its reason."""
    _check_alpha(alpha)
    regime, policy = str(row["regime"]), str(row["policy"])
    if not is_controller(policy):
        return Verdict(regime, policy, Tier.REFERENCE, REFERENCE_REASONS.get(policy, "reference; not a claim"))
    tier, gate = _highest_tier(row, mechanism, fidelity, alpha)
    return Verdict(regime, policy, tier, "; ".join([gate, *power_notes(row, alpha), f"observed: {_observed(row)}"]))


def power_notes(row: Mapping[str, Any], alpha: float) -> list[str]:
    """One line per tier test of `row` that cannot reach `alpha` with the seeds and draws it has."""
    notes = []
    rank_min = row.get("p_rank_min")
    if rank_min is not None and rank_min == rank_min and rank_min > alpha:
        notes.append(f"rank test underpowered: smallest achievable p {rank_min:.3g} > alpha {alpha:g} "
                     f"({_count(row.get('n_draws'))} draws over {_count(row.get('n_seeds_rank'))} seeds)")
    cadence_min = row.get("p_vs_fixed_cadence_min")
    if cadence_min is not None and cadence_min == cadence_min and cadence_min > alpha:
        notes.append(f"cadence test underpowered: smallest achievable p {cadence_min:.3g} > alpha {alpha:g} "
                     f"({_count(row.get('n_seeds_vs_fixed_cadence'))} seeds with an even cadence)")
    return notes


def _count(value: Any) -> str:
    return "?" if value is None or value != value else str(int(value))


def assign_tiers(
    policies: pd.DataFrame,
    mechanism: MechanismEvidence | None,
    *,
    fidelity: FidelityEvidence | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> pd.DataFrame:
    """`policies` with ``tier``, ``tier_rank``, ``reason`` and ``calibration`` columns added."""
    rows = policies.to_dict("records")
    verdicts = [assign_verdict(row, mechanism, fidelity=fidelity, alpha=alpha) for row in rows]
    return policies.assign(
        tier=[str(v.tier) for v in verdicts],
        tier_rank=[v.tier.rank for v in verdicts],
        reason=[v.reason for v in verdicts],
        calibration=[calibration_status(row, fidelity) for row in rows],
    )


def calibration_status(row: Mapping[str, Any], fidelity: FidelityEvidence | None) -> str:
    """``fitted`` / ``default`` for simulator rows, ``n/a`` for rows replayed on the real backend only."""
    if not _rests_on_simulator(row):
        return "n/a"
    return fidelity.calibration if fidelity is not None else "unknown"


def _rests_on_simulator(row: Mapping[str, Any]) -> bool:
    """True unless every replay behind the row (its runs, the no-sync runs, its draws and references: the
    ``backend`` the protocol joins) is on the real backend; a blank backend counts as not real."""
    return set(str(row.get("backend", "")).split("+")) != {"vllm"}


def _highest_tier(
    row: Mapping[str, Any], mechanism: MechanismEvidence | None, fidelity: FidelityEvidence | None, alpha: float
) -> tuple[Tier, str]:
    regime = str(row["regime"])
    if mechanism is None:
        return Tier.STRESS_HARNESS_ONLY, "no real-backend mechanism evidence supplied"
    if not mechanism.shows(regime):
        return Tier.STRESS_HARNESS_ONLY, f"mechanism not shown on the real backend: {mechanism.describe(regime)}"
    transfers = f"mechanism transfers ({mechanism.describe(regime)})"
    if _rests_on_simulator(row):
        if fidelity is None:
            return Tier.MECHANISM_TRANSFERS, f"{transfers}; simulator replays without fidelity evidence license nothing more"
        policy = str(row["policy"])
        if not fidelity.licenses(policy, regime):
            return Tier.MECHANISM_TRANSFERS, f"{transfers}; simulator not licensed: {fidelity.describe(policy, regime)}"
    if not row["p_vs_fixed_cadence_adjusted"] < alpha:
        return (
            Tier.MECHANISM_TRANSFERS,
            f"{transfers}; not shown better than its own merge count evenly spaced "
            f"(adjusted p {row['p_vs_fixed_cadence_adjusted']:.3g} >= {alpha})",
        )
    if not row["p_adjusted"] < alpha:
        return (
            Tier.BEATS_FIXED_CADENCE,
            f"beats fixed cadence; not shown better than matched random (adjusted p {row['p_adjusted']:.3g} >= {alpha})",
        )
    if row.get("training", "not measured") in BLOCKING_TRAINING:
        return (
            Tier.BEATS_FIXED_CADENCE,
            f"beats fixed cadence and matched random, but training {row.get('training', 'not measured')} "
            f"(eval loss {row.get('loss_rel_diff_mean', float('nan')):+.2%} vs fixed_h, upper bound "
            f"{row.get('loss_rel_diff_ci_high', float('nan')):+.2%}, seeds with a loss "
            f"{row.get('loss_seeds', '0/0')})",
        )
    return Tier.BEATS_MATCHED_RANDOM, f"beats fixed cadence and matched random at family-wise alpha {alpha}"


def _observed(row: Mapping[str, Any]) -> str:
    parts = [
        f"sync-excess {row['sync_excess_pct_mean']:+.3g} pp vs matched-random {row['mr_sync_excess_pct_mean']:+.3g} pp",
        f"rank p {row['p_rank']:.3g} (adjusted {row['p_adjusted']:.3g})",
        f"{row['seeds_won']}/{row['n_seeds']} seeds won",
        f"cadence p {row['p_vs_fixed_cadence']:.3g} (adjusted {row['p_vs_fixed_cadence_adjusted']:.3g})",
    ]
    gap, oracle = row.get("gap_closed_mean"), row.get("oracle_sync_excess_pct_mean")
    real_only = row.get("block") == REAL_BLOCK
    if gap is not None and gap == gap:
        parts.append(f"gap closed {gap:.0%}")
    elif oracle is not None and oracle != oracle:
        parts.append("gap closed n/a: no SLO oracle replay behind it"
                     + (" (the oracle is a simulator search, never replayed on the real server)" if real_only else ""))
    parts.append(f"runs on {row['backend']}" + (" (real replays judged on their own)" if real_only else ""))
    return ", ".join(parts)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
