"""The headline figures a person compares across commits (``reports/metrics.json``).

``dvc metrics show`` and ``dvc metrics diff`` (which the repro DAG logs) print
every key, so this file holds only what a reader compares between runs; the
full table stays in ``policy_table.csv``:

- ``alpha``;
- ``primary``: the declared primary test's ``p_rank``, ``p_adjusted``,
  ``gap_closed`` and ``tier_rank``;
- per regime: the best controller's ``p_adjusted`` and ``gap_closed`` (best:
  lowest adjusted p, then most gap closed), the highest ``tier_rank`` reached
  and how many controllers beat matched random;
- ``fidelity``: the simulator's held-out errors, sign agreement and whether
  it licenses verdicts (1) or not (0);
- ``real_only``: per regime and controller of the real-only block (the real
  replays judged on their own), its ``p_rank``, ``p_adjusted``, the smallest
  rank p its seeds and draws allow (``p_rank_min``), ``n_seeds`` and
  ``tier_rank``. The keys above are of the runs table's rows only.

Only finite numbers are written (JSON has no NaN/inf). Tier ranks: 1 stress
harness only, 2 mechanism transfers, 3 beats fixed cadence, 4 beats matched
random.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from syncsafe.analysis.evidence import FidelityEvidence
from syncsafe.analysis.runs_table import REAL_BLOCK, is_controller
from syncsafe.analysis.verdicts import Tier


def headline_metrics(policies: pd.DataFrame, *, alpha: float, fidelity: FidelityEvidence | None) -> dict[str, Any]:
    """The nested, finite-only metrics object (see the module docstring)."""
    metrics: dict[str, Any] = {"alpha": alpha}
    controllers = policies[policies["policy"].map(is_controller)]
    real = controllers["block"] == REAL_BLOCK if "block" in controllers.columns else controllers["policy"].isna()
    if real.any():
        metrics["real_only"] = {
            str(regime): {str(r["policy"]): _finite({
                "p_rank": r["p_rank"], "p_adjusted": r["p_adjusted"], "p_rank_min": r.get("p_rank_min"),
                "n_seeds": r["n_seeds"], "tier_rank": r["tier_rank"]}) for r in rows.to_dict("records")}
            for regime, rows in controllers[real].groupby("regime", sort=True)}
    # the declared primary's row (its real-only row when the runs table lacks it)
    primary = controllers[controllers["primary"]] if "primary" in controllers else controllers.iloc[0:0]
    controllers = controllers[~real]
    if not primary.empty:
        row = primary.iloc[0]
        metrics["primary"] = _finite(
            {"p_rank": row["p_rank"], "p_adjusted": row["p_adjusted"], "gap_closed": row["gap_closed_mean"],
             "tier_rank": row["tier_rank"]}
        )
    for regime, rows in controllers.groupby("regime", sort=True):
        best = rows.assign(_gap=rows["gap_closed_mean"].fillna(-math.inf)).sort_values(
            ["p_adjusted", "_gap"], ascending=[True, False]
        ).iloc[0]
        metrics[str(regime)] = _finite(
            {
                "best_p_adjusted": best["p_adjusted"],
                "best_gap_closed": best["gap_closed_mean"],
                "top_tier_rank": rows["tier_rank"].max(),
                "n_beats_matched_random": int((rows["tier"] == Tier.BEATS_MATCHED_RANDOM).sum()),
            }
        )
    if fidelity is not None:
        agreements = fidelity.sign_agreement
        metrics["fidelity"] = _finite(
            {
                "licensed": int(fidelity.licenses()),
                "fitted": int(fidelity.calibration == "fitted"),
                "p95_rel_error_max": fidelity.p95_rel_error_max,
                "slo_abs_error_pp_max": fidelity.slo_abs_error_pp_max,
                "sync_ratio_paired_sim_over_real": fidelity.sync_ratio_paired_sim_over_real,
                "sign_agreement": sum(a.agree for a in agreements) / len(agreements) if agreements else None,
            }
        )
    return metrics


#: Keys that count things (written as integers).
COUNT_KEYS = frozenset({"tier_rank", "top_tier_rank", "n_beats_matched_random", "licensed", "fitted", "n_seeds"})


def _finite(values: dict[str, Any]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for key, value in values.items():
        if value is not None and math.isfinite(float(value)):
            out[key] = int(value) if key in COUNT_KEYS else float(value)
    return out
