"""Claim tiers: what the evidence licenses per policy x regime, never more.

Tiers, lowest to highest; each requires every gate below it:

1. ``stress harness only``: the default. Without a real-backend (vLLM)
   measurement showing the merge mechanism for the regime, a result licenses
   no serving claim, whatever its numbers.
2. ``mechanism transfers``: :class:`MechanismEvidence` for the regime shows
   the sync effect (real p95 while a merge is active / inactive above
   ``sync_ratio_threshold``, default 1.05).
3. ``beats fixed cadence``: paired one-sided p vs ``fixed_h`` (same seeds) is
   below alpha. Not reachable by ``fixed_h`` itself, nor in a regime without
   ``fixed_h`` runs.
4. ``beats matched random``: paired one-sided p vs the matched-random mean is
   below alpha AND the policy won more than half of its seeds. A policy no
   better than matched random never reaches it.

``no_sync``, ``matched_random`` and ``offline_bound`` are references: tier
``reference``, no claim. Every verdict carries a reason naming the gate that
stopped it and the numbers observed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pandas as pd

from syncsafe.analysis.evidence import MechanismEvidence, RegimeMechanism
from syncsafe.analysis.runs_table import FIXED_H, MATCHED_RANDOM, NO_SYNC, OFFLINE_BOUND, is_controller

DEFAULT_ALPHA = 0.05


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
    MATCHED_RANDOM: "matched-random draws: the envelope controllers are tested against; not a claim",
    OFFLINE_BOUND: "offline oracle placement with full knowledge of the load: headroom, not deployable; not a claim",
}


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
    alpha: float = DEFAULT_ALPHA,
) -> Verdict:
    """The highest tier `row` (a policy-table row) licenses, with its reason."""
    _check_alpha(alpha)
    regime, policy = str(row["regime"]), str(row["policy"])
    if not is_controller(policy):
        return Verdict(regime, policy, Tier.REFERENCE, REFERENCE_REASONS[policy])
    tier, gate = _highest_tier(row, mechanism, alpha)
    return Verdict(regime, policy, tier, f"{gate}; observed: {_observed(row)}")


def assign_tiers(
    policies: pd.DataFrame,
    mechanism: MechanismEvidence | None,
    *,
    alpha: float = DEFAULT_ALPHA,
) -> pd.DataFrame:
    """`policies` with ``tier``, ``tier_rank`` and ``reason`` columns added."""
    verdicts = [assign_verdict(row, mechanism, alpha=alpha) for row in policies.to_dict("records")]
    return policies.assign(
        tier=[str(v.tier) for v in verdicts],
        tier_rank=[v.tier.rank for v in verdicts],
        reason=[v.reason for v in verdicts],
    )


def _highest_tier(row: Mapping[str, Any], mechanism: MechanismEvidence | None, alpha: float) -> tuple[Tier, str]:
    regime = str(row["regime"])
    if mechanism is None:
        return Tier.STRESS_HARNESS_ONLY, "no real-backend mechanism evidence supplied"
    if not mechanism.shows(regime):
        return Tier.STRESS_HARNESS_ONLY, f"mechanism not shown on the real backend: {mechanism.describe(regime)}"
    transfers = f"mechanism transfers ({mechanism.describe(regime)})"
    if row["policy"] == FIXED_H:
        return Tier.MECHANISM_TRANSFERS, f"{transfers}; fixed_h is the fixed-cadence baseline and cannot beat itself"
    if row["n_seeds_vs_fixed_h"] == 0:
        return Tier.MECHANISM_TRANSFERS, f"{transfers}; no fixed_h runs in this regime to test against"
    if not row["p_vs_fixed_h"] < alpha:
        return Tier.MECHANISM_TRANSFERS, f"{transfers}; not shown better than fixed_h (p {row['p_vs_fixed_h']:.3g} >= {alpha})"
    if not row["p_vs_matched_random"] < alpha:
        return (
            Tier.BEATS_FIXED_CADENCE,
            f"beats fixed_h; not shown better than matched random (p {row['p_vs_matched_random']:.3g} >= {alpha})",
        )
    if not row["seeds_won"] > row["n_seeds"] / 2:
        return (
            Tier.BEATS_FIXED_CADENCE,
            f"beats fixed_h; won only {row['seeds_won']}/{row['n_seeds']} seeds against the matched-random mean",
        )
    return Tier.BEATS_MATCHED_RANDOM, f"beats fixed_h and matched random at alpha {alpha}"


def _observed(row: Mapping[str, Any]) -> str:
    parts = [
        f"sync-excess {row['sync_excess_pct_mean']:+.3g} pp vs matched-random {row['mr_sync_excess_pct_mean']:+.3g} pp",
        f"p vs matched random {row['p_vs_matched_random']:.3g}",
        f"{row['seeds_won']}/{row['n_seeds']} seeds won",
    ]
    if row["n_seeds_vs_fixed_h"] > 0:
        parts.append(f"p vs fixed_h {row['p_vs_fixed_h']:.3g}")
    parts.append(f"runs on {row['backend']}")
    return ", ".join(parts)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
