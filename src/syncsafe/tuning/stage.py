"""Stage headroom: per regime, where the matched-random -> oracle gap of each policy of
`analysis.headroom_policies` comes from (`tuning.search.headroom`, on every seed of params): what its knob
family (`tuning.knobs.DEFAULT_GRIDS`, one per controller policy) reaches on the past alone, the online bound,
and what only foresight buys. One table per policy, reports/headroom/<regime>/<policy>.csv, which the analyze
stage summarises in the report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.config import Params
from syncsafe.io import write_csv
from syncsafe.tuning.search import BenchSettings, headroom


def write_headroom(params: Params, regime: str, root: Path = Path(".")) -> dict[str, pd.DataFrame]:
    """Each headroom policy's per-seed table for `regime`, written to reports/headroom/<regime>/<policy>.csv
    (its load, calibration and time scale those of the pipeline's simulator replays; the params' draws)."""
    tables = {}
    for policy in params.analysis.headroom_policies:
        tables[policy] = headroom(params, policy, regime, params.seeds, (), BenchSettings(Path(root), from_traces=True))
        write_csv(layout.headroom_path(root, regime, policy), tables[policy])
    return tables
