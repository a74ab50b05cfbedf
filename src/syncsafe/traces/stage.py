"""The traces stage: timeline and request list per regime and seed.

Synthetic regimes are generated; `kind: trace` regimes are cut from a recorded
trace (`syncsafe.traces.trace_regime`) and also get `trace.json` per seed
(segment bounds, token limit, number of requests clipped). Every seed is
computed before the first file is written, so a bad trace writes nothing.
Where the files live and how they are read: `syncsafe.artifacts.traces`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.artifacts.layout import trace_dir
from syncsafe.artifacts.traces import read_timeline, write_trace_set
from syncsafe.config import Params, TraceRegime
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng
from syncsafe.traces.trace_regime import build_trace_sets

#: Per-seed description of a trace regime's segment (beside timeline.parquet).
TRACE_INFO = layout.TRACE_INFO_FILE

__all__ = ["TRACE_INFO", "build_traces", "load_timeline", "seed_loads", "trace_dir"]


def load_timeline(root: Path, regime: str, seed: int) -> pd.DataFrame:
    """The load timeline of one regime and seed (`syncsafe.artifacts.traces.read_timeline`)."""
    return read_timeline(root, regime, seed)


def build_traces(params: Params, regime: str, root: Path = Path(".")) -> list[Path]:
    """Write timeline.parquet and requests.parquet for every seed of `regime`."""
    cfg = params.regimes[regime]
    written = []
    if isinstance(cfg, TraceRegime):
        for seed, cut in build_trace_sets(params, regime).items():
            written += write_trace_set(root, regime, seed, cut.timeline, cut.requests, cut.info)
        return written
    for seed, load in seed_loads(params, regime, params.seeds).items():
        written += write_trace_set(root, regime, seed, *load)
    return written


def seed_loads(params: Params, regime: str, seeds: Sequence[int]) -> dict[int, tuple[pd.DataFrame, pd.DataFrame]]:
    """Each seed's (timeline, requests), as `build_traces` writes them (any seeds, nothing written; a trace
    regime's trace is read once)."""
    cfg = params.regimes[regime]
    if isinstance(cfg, TraceRegime):
        cuts = build_trace_sets(params.model_copy(update={"seeds": list(seeds)}), regime)
        return {seed: (cut.timeline, cut.requests) for seed, cut in cuts.items()}
    loads = {}
    for seed in seeds:
        timeline = generate_timeline(regime, cfg, params.traces.step_s, seed)
        loads[seed] = timeline, generate_requests(timeline, params.traces.requests, params.traces.step_s,
                                                  regime_rng(regime, seed, "requests"))
    return loads
