"""The policy table flattened into DVC metrics.

A flat JSON object: ``"<regime>/<policy>/<column>": number`` for the
numeric policy-table columns, plus ``alpha``. Only finite numbers are
written (JSON has no NaN/inf; an unbounded one-seed interval is omitted).
The tier appears as ``tier_rank`` (0 reference, 1 stress harness only,
2 mechanism transfers, 3 beats fixed cadence, 4 beats matched random); the
tier names are in ``policy_table.csv``.
"""

from __future__ import annotations

import math

import pandas as pd

from syncsafe.analysis.runs_table import LATENCY_COLUMNS

METRIC_COLUMNS = (
    "n_seeds",
    "slo_pct_mean",
    "sync_excess_pct_mean",
    "ci_low",
    "ci_high",
    "mr_sync_excess_pct_mean",
    "delta_vs_mr_pct_mean",
    "seeds_won",
    "p_vs_matched_random",
    "p_unpaired",
    "p_vs_fixed_h",
    "tier_rank",
    *(f"{column}_mean" for column in LATENCY_COLUMNS),
)


def flat_metrics(policies: pd.DataFrame, *, alpha: float) -> dict[str, float | int]:
    """``{"alpha": ..., "<regime>/<policy>/<column>": value, ...}``, finite only."""
    metrics: dict[str, float | int] = {"alpha": alpha}
    columns = [c for c in METRIC_COLUMNS if c in policies.columns]
    for row in policies.to_dict("records"):
        for column in columns:
            value = row[column]
            if isinstance(value, (int, float)) and math.isfinite(value):
                metrics[f"{row['regime']}/{row['policy']}/{column}"] = value
    return metrics
