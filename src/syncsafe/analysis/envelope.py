"""What each controller run is compared with, per seed: its envelopes and references.

For each controller run (regime, policy, seed) the schedules stage derived,
with the same merge count and on the same load:

- K ``matched_random`` draws from the controller's own action space: the
  *envelope* (min, mean and max over draws, on raw SLO % and sync-excess %).
  A controller *wins* a seed when its SLO is strictly below the envelope mean.
- K ``matched_random_free`` draws (free placement): a secondary envelope.
- one ``even_cadence``, one ``slo_oracle`` and one ``offline_bound``
  schedule: single references, joined as ``<prefix>_sync_excess_pct``.
"""

from __future__ import annotations

import pandas as pd

from syncsafe.analysis.runs_table import (
    EVEN_CADENCE,
    MATCHED_RANDOM,
    OFFLINE_BOUND,
    SLO_ORACLE,
    RunsTable,
)
from syncsafe.analysis.sync_excess import with_sync_excess

ENVELOPE_KEY = ["regime", "policy", "seed"]
ENVELOPE_STATS = ("min", "mean", "max")
#: Single-schedule references and their column prefix.
REFERENCES = {EVEN_CADENCE: "even", SLO_ORACLE: "oracle", OFFLINE_BOUND: "bound"}


def draw_scores(table: RunsTable, baseline: pd.DataFrame, policy: str = MATCHED_RANDOM) -> pd.DataFrame:
    """One row per (controller run, draw of `policy`): ``slo_pct`` and ``sync_excess_pct``.

    ``policy`` in the result names the controller the draw is matched to, so
    draws join their controller run on :data:`ENVELOPE_KEY`.
    """
    draws = table.matched_rows(policy).drop(columns="policy").rename(columns={"matched_to": "policy"})
    scored = with_sync_excess(draws, baseline)
    return scored[[*ENVELOPE_KEY, "draw", "slo_pct", "sync_excess_pct"]].astype({"policy": str})


def seed_envelopes(draws: pd.DataFrame, prefix: str = "mr") -> pd.DataFrame:
    """Per controller run: ``n_draws`` (``mr`` only) and ``<prefix>_{slo,sync_excess}_pct_{min,mean,max}``."""
    columns = [f"{prefix}_{metric}_{stat}" for metric in ("slo_pct", "sync_excess_pct") for stat in ENVELOPE_STATS]
    if draws.empty:
        empty = pd.DataFrame(columns=[*ENVELOPE_KEY, *(["n_draws"] if prefix == "mr" else []), *columns])
        return empty.astype({"regime": str, "policy": str, "seed": "int64", **{c: float for c in columns}})
    grouped = draws.groupby(ENVELOPE_KEY)
    envelope = grouped[["slo_pct", "sync_excess_pct"]].agg(list(ENVELOPE_STATS))
    envelope.columns = [f"{prefix}_{metric}_{stat}" for metric, stat in envelope.columns]
    if prefix == "mr":
        envelope.insert(0, "n_draws", grouped.size())
    return envelope.reset_index()


def seed_references(table: RunsTable, baseline: pd.DataFrame) -> pd.DataFrame:
    """Per controller run: ``<prefix>_sync_excess_pct`` of each single reference it has (NaN where absent)."""
    joined = pd.DataFrame(columns=ENVELOPE_KEY)
    for policy, prefix in REFERENCES.items():
        rows = table.matched_rows(policy)
        if rows.empty:
            continue
        scored = with_sync_excess(rows.drop(columns="policy").rename(columns={"matched_to": "policy"}), baseline)
        column = scored.groupby(ENVELOPE_KEY)["sync_excess_pct"].mean().rename(f"{prefix}_sync_excess_pct")
        joined = joined.merge(column.reset_index(), on=ENVELOPE_KEY, how="outer")
    for prefix in REFERENCES.values():
        if f"{prefix}_sync_excess_pct" not in joined.columns:
            joined[f"{prefix}_sync_excess_pct"] = float("nan")
    return joined.astype({"regime": str, "policy": str, "seed": "int64"})
