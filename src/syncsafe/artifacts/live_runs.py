"""The live runs' index: one row per live run (`syncsafe.live.sidecar`), per seed and joined.

Each seed's runs are listed in `runs/live/<regime>/seed-<S>/index.csv`; `build_live_index` joins them into
`runs/live/index.csv` (empty, with its columns, when live runs are switched off or none exist yet). Kept
apart from the live runner so that the stage switched off reads and writes this alone.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe import io
from syncsafe.artifacts import layout

INDEX_COLUMNS = ("regime", "policy", "seed", "draw", "matched_to", "condition", "order", "backend",
                 "slo_violation_rate", "p95_ms", "p99_ms", "n_requests", "n_failed", "n_merges", "requests_during_merges",
                 "degraded", "degraded_cycles", "scrape_failures", "feasible", "max_lag_s", "path")


def build_live_index(root: Path = Path(".")) -> pd.DataFrame:
    """Join every seed's index into runs/live/index.csv."""
    seed_indexes = sorted(layout.at(root, layout.LIVE).glob(f"*/{layout.SEED_PREFIX}*/{layout.INDEX_FILE}"))
    frames = [pd.read_csv(p, dtype={"draw": "Int64"}) for p in seed_indexes]
    index = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(INDEX_COLUMNS))
    io.write_csv(layout.at(root, layout.LIVE_INDEX), index)
    return index


__all__ = ["INDEX_COLUMNS", "build_live_index"]
