"""The evidence protocol's numbers: per seed, then per regime x policy.

Per seed (:func:`seed_scores`), every policy run gets its raw SLO %, its
sync-excess % against the same seed's ``no_sync`` replay, and, for a
controller, the matched-random envelope of that seed and whether it won the
seed (SLO strictly below the envelope mean).

Per regime x policy across seeds (:func:`summarize_policies`): mean SLO %,
mean sync-excess % with a seeded bootstrap interval, latency and merge means
when the table carries them, seeds won, the paired one-sided p-value against
the matched-random mean, the unpaired one against all draws, and the paired
one against ``fixed_h``'s sync-excess on the same seeds. Reference rows
(``no_sync``, ``matched_random``, ``offline_bound``) get the descriptive
numbers and p-values of 1.0 (not tested: no claim is made for them).

Tiers are not assigned here; see :mod:`syncsafe.analysis.verdicts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from syncsafe.analysis import stats
from syncsafe.analysis.envelope import ENVELOPE_KEY, draw_scores, seed_envelopes
from syncsafe.analysis.runs_table import (
    FIXED_H,
    LATENCY_COLUMNS,
    MATCHED_RANDOM,
    NO_SYNC,
    OFFLINE_BOUND,
    RunsTable,
    is_controller,
)
from syncsafe.analysis.sync_excess import no_sync_baseline, with_sync_excess

ROLES = {NO_SYNC: "baseline", MATCHED_RANDOM: "envelope", OFFLINE_BOUND: "oracle", FIXED_H: "fixed cadence"}
CONTROLLER_ROLE = "controller"


def role_of(policy: str) -> str:
    """``baseline``, ``envelope``, ``oracle``, ``fixed cadence`` or ``controller``."""
    return ROLES.get(policy, CONTROLLER_ROLE)


@dataclass(frozen=True)
class ProtocolResult:
    """The protocol's tables.

    * ``seeds``: one row per regime x policy x seed (see :func:`seed_scores`).
    * ``draws``: one row per controller run x matched-random draw.
    * ``policies``: one row per regime x policy (see :func:`summarize_policies`).
    """

    seeds: pd.DataFrame
    draws: pd.DataFrame
    policies: pd.DataFrame


def run_protocol(table: RunsTable, *, confidence: float = 0.95) -> ProtocolResult:
    """Score every run, build the envelopes and summarize each regime x policy."""
    baseline = no_sync_baseline(table)
    draws = draw_scores(table, baseline)
    seeds = seed_scores(table, baseline, draws)
    return ProtocolResult(seeds=seeds, draws=draws, policies=summarize_policies(seeds, draws, confidence=confidence))


def seed_scores(table: RunsTable, baseline: pd.DataFrame, draws: pd.DataFrame) -> pd.DataFrame:
    """Per regime x policy x seed: SLO %, sync-excess %, envelope, win.

    Columns: ``regime, policy, role, seed, backend, slo_pct, no_sync_slo_pct,
    sync_excess_pct``, the table's latency columns (seed means), and for
    controllers ``n_draws, mr_{slo,sync_excess}_pct_{min,mean,max},
    delta_vs_mr_pct, won`` (NaN / False on reference rows). A
    ``matched_random`` row holds the mean over that seed's draws.
    """
    runs = _runs_per_seed(table)
    scored = with_sync_excess(runs, baseline).drop(columns="slo_violation_rate")
    scored = scored.merge(seed_envelopes(draws), on=ENVELOPE_KEY, how="left")
    scored["delta_vs_mr_pct"] = scored["sync_excess_pct"] - scored["mr_sync_excess_pct_mean"]
    below = stats.quantised(scored["sync_excess_pct"]) < stats.quantised(scored["mr_sync_excess_pct_mean"])
    scored["won"] = below & scored["policy"].map(is_controller).to_numpy(dtype=bool)
    scored.insert(2, "role", scored["policy"].map(role_of))
    return scored.sort_values(ENVELOPE_KEY, ignore_index=True)


def _runs_per_seed(table: RunsTable) -> pd.DataFrame:
    """Mean over a seed's rows (one row, except draws and multiply-matched bounds)."""
    frame = table.frame.assign(backend=table.frame["backend"].fillna("unspecified"))
    grouped = frame.groupby(ENVELOPE_KEY)
    runs = grouped[["slo_violation_rate", *table.latency_columns]].mean()
    runs.insert(0, "backend", grouped["backend"].agg(_joined))
    return runs.reset_index().astype({"regime": str, "policy": str})


def _joined(labels: Iterable[str]) -> str:
    """Distinct backend labels as ``a+b`` (inputs may already be joined)."""
    return "+".join(sorted({part for label in labels for part in label.split("+")}))


def summarize_policies(seeds: pd.DataFrame, draws: pd.DataFrame, *, confidence: float = 0.95) -> pd.DataFrame:
    """Per regime x policy across seeds; see the module docstring.

    Columns: ``regime, policy, role, backend, n_seeds, slo_pct_mean,
    sync_excess_pct_mean, ci_low, ci_high`` (bootstrap interval of the mean
    sync-excess; unbounded with one seed), latency means, ``n_draws,
    mr_sync_excess_pct_{min,mean,max}`` (per-seed envelope averaged over
    seeds), ``delta_vs_mr_pct_mean, seeds_won, p_vs_matched_random,
    p_unpaired, n_seeds_vs_fixed_h, delta_vs_fixed_h_pct_mean, p_vs_fixed_h``.
    """
    latency = [c for c in LATENCY_COLUMNS if c in seeds.columns]
    rows = []
    for (regime, policy), runs in seeds.groupby(["regime", "policy"], sort=True):
        fixed_h = seeds[(seeds["regime"] == regime) & (seeds["policy"] == FIXED_H)]
        policy_draws = draws[(draws["regime"] == regime) & (draws["policy"] == policy)]
        rows.append(
            {
                **_describe(regime, policy, runs, latency, confidence),
                **_evidence(policy, runs, policy_draws, fixed_h),
            }
        )
    return pd.DataFrame(rows)


def _describe(regime: str, policy: str, runs: pd.DataFrame, latency: list[str], confidence: float) -> dict[str, Any]:
    ci_low, ci_high = stats.bootstrap_mean_ci(runs["sync_excess_pct"], confidence=confidence)
    return {
        "regime": regime,
        "policy": policy,
        "role": role_of(policy),
        "backend": _joined(runs["backend"]),
        "n_seeds": int(runs["seed"].nunique()),
        "slo_pct_mean": float(runs["slo_pct"].mean()),
        "sync_excess_pct_mean": float(runs["sync_excess_pct"].mean()),
        "ci_low": ci_low,
        "ci_high": ci_high,
        **{f"{column}_mean": float(runs[column].mean()) for column in latency},
    }


def _evidence(policy: str, runs: pd.DataFrame, draws: pd.DataFrame, fixed_h: pd.DataFrame) -> dict[str, Any]:
    """Envelope summary and the three one-sided tests (1.0 where untested)."""
    controller = is_controller(policy)
    vs_mr = stats.paired_test(runs["sync_excess_pct"], runs["mr_sync_excess_pct_mean"]) if controller else _untested()
    unpaired = stats.unpaired_test(runs["sync_excess_pct"], draws["sync_excess_pct"]) if controller else _untested()
    vs_fixed = _vs_fixed_h(runs, fixed_h) if controller and policy != FIXED_H else _untested()
    return {
        "n_draws": int(len(draws)),
        **{f"mr_sync_excess_pct_{s}": float(runs[f"mr_sync_excess_pct_{s}"].mean()) for s in ("min", "mean", "max")},
        "delta_vs_mr_pct_mean": vs_mr.effect,
        "seeds_won": int(runs["won"].sum()),
        "p_vs_matched_random": vs_mr.p_value,
        "p_unpaired": unpaired.p_value,
        "n_seeds_vs_fixed_h": vs_fixed.n,
        "delta_vs_fixed_h_pct_mean": vs_fixed.effect,
        "p_vs_fixed_h": vs_fixed.p_value,
    }


def _vs_fixed_h(runs: pd.DataFrame, fixed_h: pd.DataFrame) -> stats.OneSidedTest:
    """Paired over the seeds both policies ran: policy vs fixed_h sync-excess."""
    paired = runs.merge(fixed_h[["seed", "sync_excess_pct"]], on="seed", suffixes=("", "_fixed_h"))
    return stats.paired_test(paired["sync_excess_pct"], paired["sync_excess_pct_fixed_h"])


def _untested() -> stats.OneSidedTest:
    return stats.OneSidedTest(n=0, effect=np.nan, p_value=stats.NO_EVIDENCE_P)
