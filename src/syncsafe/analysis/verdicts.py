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
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from syncsafe.analysis.runs_table import FIXED_H, MATCHED_RANDOM, NO_SYNC, OFFLINE_BOUND, is_controller

DEFAULT_ALPHA = 0.05
DEFAULT_SYNC_RATIO_THRESHOLD = 1.05


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


class RegimeMechanism(BaseModel):
    """Real-backend measurement of the merge mechanism in one regime."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sync_ratio: float = Field(gt=0, description="real p95 latency while a merge is active / inactive")
    pressure_ratio: float = Field(gt=0, description="real p95 latency under high / low fleet pressure")
    backend: Literal["vllm"] = "vllm"
    n_requests: int | None = Field(default=None, ge=0, description="real requests behind the ratios")
    drift_ratio: float | None = Field(
        default=None, gt=0,
        description="control: p95 of requests done before any merge / the same requests in the no-sync replay "
                    "(about 1 when the server behaved alike across replays)",
    )


class MechanismEvidence(BaseModel):
    """Per-regime effect-size transfer, measured on the real serving backend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    regimes: dict[str, RegimeMechanism]
    sync_ratio_threshold: float = Field(default=DEFAULT_SYNC_RATIO_THRESHOLD, ge=1.0)
    #: A measurement whose pre-merge control drifts beyond this factor (either way) licenses nothing.
    max_drift: float = Field(default=1.25, ge=1.0)

    @classmethod
    def read(cls, path: str | Path) -> MechanismEvidence:
        """Load from a JSON file with this model's fields."""
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def drifted(self, regime: str) -> bool:
        """True when the regime's pre-merge control shows the server itself changed between replays."""
        measured = self.regimes.get(regime)
        drift = measured.drift_ratio if measured is not None else None
        return drift is not None and not 1.0 / self.max_drift <= drift <= self.max_drift

    def shows(self, regime: str) -> bool:
        """True when the regime's real sync ratio exceeds the threshold and its control did not drift."""
        measured = self.regimes.get(regime)
        return measured is not None and measured.sync_ratio > self.sync_ratio_threshold and not self.drifted(regime)

    def describe(self, regime: str) -> str:
        measured = self.regimes.get(regime)
        if measured is None:
            return f"no real-backend (vllm) mechanism measurement for regime {regime!r}"
        relation = ">" if measured.sync_ratio > self.sync_ratio_threshold else "<="
        text = (
            f"vllm sync ratio {measured.sync_ratio:.3g} {relation} {self.sync_ratio_threshold:.3g}, "
            f"pressure ratio {measured.pressure_ratio:.3g}"
        )
        if measured.drift_ratio is not None:
            verdict = "drifted: measurement not trusted" if self.drifted(regime) else "within"
            text += f", pre-merge control {measured.drift_ratio:.3g} ({verdict} ×{self.max_drift:.3g})"
        return text


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
