"""The analysis's outputs: reports/.

`policy_table.csv` (one row per regime x policy: `CONTRACT_COLUMNS` first,
then the reason and supporting numbers), `envelope.csv` (one row per
controller run), `metrics.json` (the headline DVC metrics, a nested object of
finite numbers), `report.md`, the envelope figure, `figures/` and
`loss_curves.csv`. The analyze stage writes them all or none
(`syncsafe.analysis.analyze.write_all_or_nothing`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_csv, read_json
from syncsafe.artifacts.layout import PathLike

CONTRACT_COLUMNS = (
    "regime",
    "policy",
    "n_seeds",
    "slo_pct_mean",
    "sync_excess_pct_mean",
    "p_vs_matched_random",
    "seeds_won",
    "tier",
    "p_rank",
    "p_adjusted",
    "gap_closed_mean",
    "gap_closed_ci_low",
    "gap_closed_ci_high",
    "calibration",
)

_HINT = "run the analyze stage first"


def policy_table_path(root: PathLike) -> Path:
    return layout.at(root, layout.report_rel(layout.POLICY_TABLE_FILE))


def read_policy_table(root: PathLike) -> pd.DataFrame:
    """reports/policy_table.csv, its contract columns checked."""
    return read_csv(policy_table_path(root), "policy table", CONTRACT_COLUMNS, hint=_HINT)


def read_report_metrics(root: PathLike) -> dict[str, Any]:
    """reports/metrics.json (the headline metrics object; always has `alpha`)."""
    return read_json(layout.at(root, layout.report_rel(layout.REPORT_METRICS_FILE)), "report metrics file",
                     hint=_HINT, keys=("alpha",))
