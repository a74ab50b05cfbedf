"""A study's own family of tests: one question per (point, regime), Holm across all of them.

Every point is judged by the protocol itself (its `policy_table.csv`: tiers, the primary test, the matched
random envelope). A study then asks one more question per point and regime, and a study tries many points,
so those answers form one family whose family-wise error stays at alpha (Holm, `holm_adjusted`): trying
more points cannot manufacture a finding.

- ablation, "does removing term X make the policy worse?": per seed, the full policy's and the ablated
  variant's normalised rank among their own matched-random draws (`envelope.csv` `rank`, 0 best, 1 worst;
  each against draws with its own merge count, so a variant that merges less is not credited for merging
  less). The test is the exact sign test (`analysis.stats.sign_test`) that the full policy ranks lower on
  more seeds than not, ties dropped: it holds its level for any shape of the differences, which
  zero-inflated SLO rates make skewed.
- sensitivity, "does the policy still beat its matched random here?": the point's own rank-test p of the
  policy (`p_rank`), before the point's own multiplicity adjustment, taken into the study's family.

`seed_table` and `judge` are pure: tested on hand-made tables and by simulation under a null.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncsafe.analysis.multiplicity import holm_adjusted
from syncsafe.analysis.stats import bootstrap_mean_ci, sign_test
from syncsafe.config import split_policy
from syncsafe.studies.spec import Point, Study

#: Per-seed columns a study keeps from a point's envelope.csv.
SEED_COLUMNS = ("slo_pct", "sync_excess_pct", "delta_vs_mr_pct", "rank", "gap_closed")


@dataclass(frozen=True)
class PointResult:
    """What one point's DVC experiment left in reports/: the envelope (per seed) and the policy table."""

    point: Point
    envelope: pd.DataFrame
    policy_table: pd.DataFrame


def compared(study: Study, point: Point) -> tuple[str, str | None]:
    """(the point's subject policy, what it is compared with): ablation: (variant, full); else (policy, None)."""
    if study.spec.question == "ablation":
        return str(point.value), split_policy(str(point.value))[0]
    assert study.policy is not None
    return study.policy, None


def seed_table(study: Study, results: list[PointResult]) -> pd.DataFrame:
    """One row per (point, regime, policy, seed) of the policies each point's question is about."""
    frames = []
    for order, result in enumerate(results):
        subject, reference = compared(study, result.point)
        env = result.envelope
        for role, policy in (("subject", subject), ("reference", reference)):
            if policy is None:
                continue
            rows = env[env["policy"] == policy]
            if rows.empty:
                raise ValueError(f"point {result.point.name}: no envelope rows of policy {policy!r}")
            frames.append(rows[["regime", "policy", "seed", *SEED_COLUMNS]].assign(
                point=result.point.name, order=order, axis=result.point.axis, value=str(result.point.value), role=role))
    cols = ["point", "order", "axis", "value", "role", "regime", "policy", "seed", *SEED_COLUMNS]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def judge(study: Study, results: list[PointResult], alpha: float) -> pd.DataFrame:
    """One row per (point, regime): the subject's mean and interval over seeds, its tier at that point, the
    question's test and its Holm-adjusted p across the whole study."""
    seeds = seed_table(study, results)
    rows = []
    for result in results:
        subject, reference = compared(study, result.point)
        table = result.policy_table
        for regime in sorted(seeds.loc[seeds["point"] == result.point.name, "regime"].unique()):
            here = seeds[(seeds["point"] == result.point.name) & (seeds["regime"] == regime)]
            mine = here[here["role"] == "subject"].set_index("seed").sort_index()
            row = {"point": result.point.name, "axis": result.point.axis, "value": str(result.point.value),
                   "regime": regime, "policy": subject, "n_seeds": len(mine),
                   **mean_ci(mine["gap_closed"], "gap_closed"), **mean_ci(mine["slo_pct"], "slo_pct"),
                   "tier": _tier(table, regime, subject)}
            if reference is None:
                p = _p_rank(table, regime, subject)
                row.update(compared_to="matched random", test="rank test vs matched random (the point's own)",
                           effect=float(mine["delta_vs_mr_pct"].mean()), p=p)
            else:
                full = here[here["role"] == "reference"].set_index("seed").sort_index()
                both = mine.index.intersection(full.index)
                test = sign_test(full.loc[both, "rank"].to_numpy(), mine.loc[both, "rank"].to_numpy())
                diff = mine.loc[both, "delta_vs_mr_pct"] - full.loc[both, "delta_vs_mr_pct"]
                row.update(compared_to=reference, test="sign test: full ranks below the ablation among own draws",
                           effect=float(diff.mean()) if len(diff) else float("nan"), p=test.p_value,
                           seeds_full_better=int((full.loc[both, "rank"] < mine.loc[both, "rank"]).sum()),
                           seeds_ablation_better=int((full.loc[both, "rank"] > mine.loc[both, "rank"]).sum()),
                           reference_tier=_tier(table, regime, reference),
                           **mean_ci(diff, "delta_diff_pct"))
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    adjusted = holm_adjusted({i: p for i, p in enumerate(out["p"])})
    out["p_holm"] = [adjusted[i] for i in range(len(out))]
    out["finding"] = out["p_holm"] < alpha
    out.insert(0, "study", study.name)
    return out


def mean_ci(values: pd.Series, name: str) -> dict[str, float]:
    data = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
    if data.size == 0:
        return {f"{name}_mean": float("nan"), f"{name}_ci_low": float("nan"), f"{name}_ci_high": float("nan"),
                f"{name}_seeds": 0}
    low, high = bootstrap_mean_ci(data)
    return {f"{name}_mean": float(np.mean(data)), f"{name}_ci_low": low, f"{name}_ci_high": high,
            f"{name}_seeds": int(data.size)}


def _policy_row(table: pd.DataFrame, regime: str, policy: str) -> pd.Series | None:
    rows = table[(table["regime"] == regime) & (table["policy"] == policy)]
    return None if rows.empty else rows.iloc[0]


def _tier(table: pd.DataFrame, regime: str, policy: str) -> str:
    row = _policy_row(table, regime, policy)
    return "" if row is None else str(row["tier"])


def _p_rank(table: pd.DataFrame, regime: str, policy: str) -> float:
    row = _policy_row(table, regime, policy)
    p = float("nan") if row is None else float(row["p_rank"])
    return p if np.isfinite(p) else 1.0  # no test is no evidence
