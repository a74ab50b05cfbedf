"""params.yaml shrunk for fast pipeline runs (the `raw_params` fixture and the shared real-server run)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def small_raw_params() -> dict:
    """params.yaml shrunk: 2 seeds, 240 s regimes, 3 draws, harness schedules."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["seeds"] = [0, 1]
    for regime in raw["regimes"].values():
        regime["duration_s"] = 240
        if regime["kind"] == "trace":  # shipped trace files, wherever pytest runs from
            regime["path"] = str(REPO / regime["path"])
    raw["schedules"]["random_draws"] = 3
    raw["schedules"]["source"] = "harness"  # training has its own tests
    return raw
