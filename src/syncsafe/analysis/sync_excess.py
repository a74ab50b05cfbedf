"""Sync-excess: SLO violations a schedule adds over the no-sync replay.

The protocol's load match: a run's *sync-excess* is its SLO violation rate
minus the ``no_sync`` replay of the **same regime and seed** (same arrivals).
It is never computed against another seed's baseline: the join below is on
``(regime, seed)`` and fails if a baseline is missing. Values are reported in
percentage points (``slo_pct``, ``sync_excess_pct``).
"""

from __future__ import annotations

import pandas as pd

from syncsafe.analysis.runs_table import NO_SYNC, RunsTable

BASELINE_KEY = ["regime", "seed"]


def no_sync_baseline(table: RunsTable) -> pd.DataFrame:
    """Per (regime, seed): the no-sync SLO violation rate, in percent."""
    baseline = table.frame[table.frame["policy"] == NO_SYNC]
    return (
        baseline.groupby(BASELINE_KEY, as_index=False)["slo_violation_rate"]
        .mean()
        .rename(columns={"slo_violation_rate": "no_sync_slo_pct"})
        .assign(no_sync_slo_pct=lambda d: 100.0 * d["no_sync_slo_pct"])
    )


def with_sync_excess(runs: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """Add ``slo_pct``, ``no_sync_slo_pct`` and ``sync_excess_pct`` to `runs`.

    `runs` needs ``regime``, ``seed`` and ``slo_violation_rate``. Each row is
    joined to the baseline of its own regime and seed.
    """
    scored = runs.merge(baseline, on=BASELINE_KEY, how="left", validate="many_to_one")
    if scored["no_sync_slo_pct"].isna().any():
        missing = scored.loc[scored["no_sync_slo_pct"].isna(), BASELINE_KEY].drop_duplicates()
        raise ValueError(f"no no_sync baseline for (regime, seed): {missing.to_records(index=False).tolist()}")
    scored["slo_pct"] = 100.0 * scored["slo_violation_rate"]
    scored["sync_excess_pct"] = scored["slo_pct"] - scored["no_sync_slo_pct"]
    return scored
