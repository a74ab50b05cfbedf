"""The matched-random envelope of a controller run.

For each controller run (regime, policy, seed), K random schedules with the
same merge budget are replayed on the same load. Their spread is the
*envelope*: min, mean and max over draws, on raw SLO % and on sync-excess %.
A controller *wins* a seed when its SLO is strictly below the envelope mean
(the same comparison on raw SLO and on sync-excess, since both subtract the
same seed's no-sync baseline).
"""

from __future__ import annotations

import pandas as pd

from syncsafe.analysis.runs_table import RunsTable
from syncsafe.analysis.sync_excess import with_sync_excess

ENVELOPE_KEY = ["regime", "policy", "seed"]
ENVELOPE_STATS = ("min", "mean", "max")


def draw_scores(table: RunsTable, baseline: pd.DataFrame) -> pd.DataFrame:
    """One row per (controller run, draw): ``slo_pct`` and ``sync_excess_pct``.

    ``policy`` names the controller the draw is matched to (not
    ``matched_random``), so draws join their controller run on
    :data:`ENVELOPE_KEY`.
    """
    draws = table.matched_draws().drop(columns="policy").rename(columns={"matched_to": "policy"})
    scored = with_sync_excess(draws, baseline)
    return scored[[*ENVELOPE_KEY, "draw", "slo_pct", "sync_excess_pct"]].astype({"policy": str})


def seed_envelopes(draws: pd.DataFrame) -> pd.DataFrame:
    """Per controller run: ``n_draws`` and ``mr_{slo,sync_excess}_pct_{min,mean,max}``."""
    grouped = draws.groupby(ENVELOPE_KEY)
    envelope = grouped[["slo_pct", "sync_excess_pct"]].agg(list(ENVELOPE_STATS))
    envelope.columns = [f"mr_{metric}_{stat}" for metric, stat in envelope.columns]
    envelope.insert(0, "n_draws", grouped.size())
    return envelope.reset_index()
