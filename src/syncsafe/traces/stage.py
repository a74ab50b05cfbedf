"""The traces stage: timeline and request list per regime and seed.

Synthetic regimes are generated; `kind: trace` regimes are cut from a recorded
trace (`syncsafe.traces.trace_regime`) and also get `trace.json` per seed
(segment bounds, token limit, number of requests clipped). Every seed is
computed before the first file is written, so a bad trace writes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe import io
from syncsafe.config import Params, TraceRegime
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng
from syncsafe.traces.trace_regime import build_trace_sets

#: Per-seed description of a trace regime's segment (beside timeline.parquet).
TRACE_INFO = "trace.json"


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
    if isinstance(cfg, TraceRegime):
        for seed, cut in build_trace_sets(params, regime).items():
            out = trace_dir(root, regime, seed)
            written += [io.write_parquet(out / "timeline.parquet", cut.timeline),
                        io.write_parquet(out / "requests.parquet", cut.requests),
                        io.write_json(out / TRACE_INFO, cut.info)]
        return written
    for seed in params.seeds:
        timeline = generate_timeline(regime, cfg, step, seed)
        requests = generate_requests(timeline, params.traces.requests, step, regime_rng(regime, seed, "requests"))
        out = trace_dir(root, regime, seed)
        written += [io.write_parquet(out / "timeline.parquet", timeline), io.write_parquet(out / "requests.parquet", requests)]
    return written
