"""The traces stage: timeline and request list per regime and seed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe import io
from syncsafe.config import Params
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng


def trace_dir(root: Path, regime: str, seed: int) -> Path:
    return Path(root) / "data" / "traces" / regime / f"seed-{seed}"


def load_timeline(root: Path, regime: str, seed: int) -> pd.DataFrame:
    path = trace_dir(root, regime, seed) / "timeline.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no timeline; run the traces stage for regime {regime!r} first")
    return pd.read_parquet(path)


def build_traces(params: Params, regime: str, root: Path = Path(".")) -> list[Path]:
    """Write timeline.parquet and requests.parquet for every seed of `regime`."""
    cfg = params.regimes[regime]
    step = params.traces.step_s
    written = []
    for seed in params.seeds:
        timeline = generate_timeline(regime, cfg, step, seed)
        requests = generate_requests(timeline, params.traces.requests, step, regime_rng(regime, seed, "requests"))
        out = trace_dir(root, regime, seed)
        written += [io.write_parquet(out / "timeline.parquet", timeline), io.write_parquet(out / "requests.parquet", requests)]
    return written
