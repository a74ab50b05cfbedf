"""`kind: trace` regimes: each seed replays its own segment of a recorded request trace.

From the whole trace (imported by `syncsafe.traces.importers`) to one seed's
timeline and request list, in this order:

0. **Output scale**: every request's output length times `output_scale`
   (rounded, at least one token), the arrivals untouched. A declared key
   of the regime, recorded per seed: on the CPU profile a trace whose answers
   are longer than the tiny model can serve at the trace's own arrival rate
   keeps its arrival pattern (what the policies react to) and shortens its
   answers, instead of thinning its arrivals.
1. **Clip** token counts to what the served model can take, `token_limit`:
   the `--max-model-len` in `replay.vllm.server_args`, or, where none is
   given, the exported model's `train.model.max_position_embeddings`. A
   request with prompt + output > limit keeps its prompt/output proportion:
   output' = max(1, floor(output * limit / (prompt + output))),
   prompt' = limit - output'. The simulator and the real server both read
   the clipped table, and the number clipped is recorded per seed.
2. **Rate scale**: `rate_scale` r keeps each request floor(r) times plus once
   more with probability r - floor(r) (one seeded uniform per request of the
   whole trace, so every seed sees the same thinning); copies keep the
   arrival time. r < 1 thins, r > 1 replicates.
3. **Levels** of the whole (clipped, scaled) trace: its token load, the
   trailing mean of prompt + output tokens arriving per second over
   `smooth_s`, on the `traces.step_s` grid; `busy_level` = its
   `busy_quantile`, `pressure_ref` = its `pressure_quantile`. They are
   constants of the regime, like the peak rate of a synthetic one.
4. **Segment**: seed s covers trace seconds [offset_s + s * stride_s, + duration_s),
   arrivals re-based to 0. A segment that passes the trace's end (its last
   arrival) or holds no request is refused, naming the seed.
5. **Timeline** of the segment on the `traces.step_s` grid, from its own
   arrivals with trailing windows only (the value at t depends on arrivals
   up to t, never later; the first `smooth_s` average what has arrived so far):
   - `arrival_rate`: trailing mean of arrivals per second over `smooth_s`;
   - token load as in 3; `busy` = load > busy_level;
     `inference_pressure` = min(load / pressure_ref, 1);
   - `network_pressure` = min(network_base + 0.25 * busy, 1) (serving
     traffic shares the network, as in the synthetic regimes);
   - `checkpoint_pressure`: other jobs' checkpoint writes, the synthetic
     regimes' seeded Poisson plateaus (`checkpoints_per_hour`, `checkpoint_s`).
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from syncsafe.config import Params, TraceRegime
from syncsafe.traces.importers import TraceImportError, import_trace
from syncsafe.traces.requests import REQUEST_COLUMNS
from syncsafe.traces.timeline import checkpoint_pressure, regime_rng


class TraceSegmentError(TraceImportError):
    """A seed's segment does not fit the trace or holds no request."""


@dataclass(frozen=True)
class TraceLevels:
    """Whole-trace reference levels of the smoothed token load (tokens/s)."""

    busy_level: float
    pressure_ref: float


@dataclass(frozen=True)
class TraceSet:
    """One seed's cut of a trace regime: what the traces stage writes."""

    timeline: pd.DataFrame
    requests: pd.DataFrame
    info: dict


def token_limit(params: Params) -> int:
    """Prompt + output tokens one request may hold (see the module docstring)."""
    args = params.replay.vllm.server_args
    for i, arg in enumerate(args):
        value = None
        if arg == "--max-model-len" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-model-len="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise TraceImportError(f"replay.vllm.server_args: --max-model-len {value!r} is not a whole number") from None
    return params.train.model.max_position_embeddings


def clip_tokens(requests: pd.DataFrame, limit: int) -> tuple[pd.DataFrame, np.ndarray]:
    """Requests with prompt + output <= limit (proportional cut) and the mask of those clipped."""
    if limit < 2:
        raise ValueError(f"token limit {limit} leaves no room for a prompt and an output token")
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)
    output = requests["output_tokens"].to_numpy(dtype=np.int64)
    total = prompt + output
    over = total > limit
    out = requests.copy()
    if over.any():
        new_out = np.maximum(1, (output[over] * limit) // total[over])
        new_out = np.minimum(new_out, limit - 1)
        out.loc[over, "output_tokens"] = new_out
        out.loc[over, "prompt_tokens"] = limit - new_out
    return out.astype({"prompt_tokens": "int64", "output_tokens": "int64"}), over


def scale_output(requests: pd.DataFrame, output_scale: float) -> pd.DataFrame:
    """Output lengths times `output_scale`, rounded, at least one token (1: the table as given)."""
    if output_scale == 1.0:
        return requests
    output = requests["output_tokens"].to_numpy(dtype=float) * output_scale
    return requests.assign(output_tokens=np.maximum(1, np.rint(output)).astype(np.int64))


def scale_rate(requests: pd.DataFrame, rate_scale: float, regime: str) -> pd.DataFrame:
    """Thin (< 1) or replicate (> 1) requests, seeded by the regime alone."""
    if rate_scale == 1.0:
        return requests.reset_index(drop=True)
    rng = np.random.default_rng([zlib.crc32(f"{regime}/trace-rate-scale".encode())])
    whole = int(np.floor(rate_scale))
    copies = whole + (rng.random(len(requests)) < rate_scale - whole)
    return requests.loc[requests.index.repeat(copies)].reset_index(drop=True)


def _trailing_mean(per_step: np.ndarray, window: int, step_s: float) -> np.ndarray:
    """Mean per second of `per_step` over the last `window` steps (fewer at the start)."""
    csum = np.concatenate([[0.0], np.cumsum(per_step, dtype=float)])
    idx = np.arange(per_step.size)
    lo = np.maximum(idx + 1 - window, 0)
    return (csum[idx + 1] - csum[lo]) / ((idx + 1 - lo) * step_s)


def _binned(requests: pd.DataFrame, n_steps: int, step_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals and prompt + output tokens per grid step over [0, n_steps * step_s)."""
    rows = np.floor(requests["arrival_s"].to_numpy(dtype=float) / step_s).astype(np.int64)
    keep = (rows >= 0) & (rows < n_steps)
    tokens = (requests["prompt_tokens"].to_numpy() + requests["output_tokens"].to_numpy()).astype(float)
    return np.bincount(rows[keep], minlength=n_steps).astype(float), np.bincount(rows[keep], tokens[keep], n_steps)


def _window_steps(cfg: TraceRegime, step_s: float) -> int:
    return max(1, int(round(cfg.smooth_s / step_s)))


def trace_levels(trace: pd.DataFrame, cfg: TraceRegime, step_s: float) -> TraceLevels:
    """busy_level and pressure_ref of the whole trace's smoothed token load."""
    n_steps = max(1, int(np.ceil((float(trace["arrival_s"].iloc[-1]) + 1e-9) / step_s)))
    _, tokens = _binned(trace, n_steps, step_s)
    load = _trailing_mean(tokens, _window_steps(cfg, step_s), step_s)
    ref = float(np.quantile(load, cfg.pressure_quantile))
    return TraceLevels(busy_level=float(np.quantile(load, cfg.busy_quantile)), pressure_ref=ref if ref > 0 else 1.0)


def segment_bounds(cfg: TraceRegime, seed: int) -> tuple[float, float]:
    start = cfg.offset_s + seed * cfg.segment_stride_s
    return start, start + cfg.duration_s


def cut_segment(
    trace: pd.DataFrame, cfg: TraceRegime, seed: int, name: str, length_s: float | None = None
) -> pd.DataFrame:
    """Seed `seed`'s rows of `trace` (every column kept), re-based so the segment starts at 0 s.

    `length_s`: the trace's length (its last arrival before rate scaling); default: `trace`'s last arrival.
    """
    start, end = segment_bounds(cfg, seed)
    length = float(trace["arrival_s"].iloc[-1]) if length_s is None else length_s
    where = f"{cfg.path}: regimes.{name}: seed {seed}"
    if end > length + 1e-9:
        raise TraceSegmentError(
            f"{where}: segment [{start:g}, {end:g}) s passes the trace end ({length:.1f} s); "
            "use fewer seeds or a smaller offset_s/stride_s/duration_s"
        )
    t = trace["arrival_s"].to_numpy(dtype=float)
    seg = trace.iloc[int(np.searchsorted(t, start, "left")) : int(np.searchsorted(t, end, "left"))].copy()
    if seg.empty:
        raise TraceSegmentError(f"{where}: segment [{start:g}, {end:g}) s holds no request")
    seg["arrival_s"] = seg["arrival_s"] - start
    return seg.reset_index(drop=True)


def derive_timeline(
    segment: pd.DataFrame, cfg: TraceRegime, step_s: float, levels: TraceLevels, name: str, seed: int
) -> pd.DataFrame:
    """The load timeline of one segment (rule: module docstring, step 5)."""
    n_steps = int(round(cfg.duration_s / step_s))
    t = np.arange(n_steps) * step_s
    arrivals, tokens = _binned(segment, n_steps, step_s)
    window = _window_steps(cfg, step_s)
    rate = _trailing_mean(arrivals, window, step_s)
    load = _trailing_mean(tokens, window, step_s)
    busy = load > levels.busy_level
    return pd.DataFrame(
        {
            "t_s": t,
            "busy": busy,
            "arrival_rate": rate,
            "inference_pressure": np.minimum(load / levels.pressure_ref, 1.0),
            "network_pressure": np.minimum(cfg.network_base + 0.25 * busy, 1.0),
            "checkpoint_pressure": checkpoint_pressure(cfg, t, step_s, regime_rng(name, seed, "timeline")),
        }
    )


def load_trace(params: Params, name: str) -> tuple[pd.DataFrame, int, float]:
    """The regime's whole trace, output-scaled, clipped then rate-scaled, with a `clipped` flag column;
    the token limit and the trace's length (last arrival, before scaling)."""
    cfg = params.regimes[name]
    if not isinstance(cfg, TraceRegime):
        raise TypeError(f"regime {name!r} is not a trace regime")
    limit = token_limit(params)
    requests, clipped = clip_tokens(scale_output(import_trace(cfg.format, cfg.path), cfg.output_scale), limit)
    length = float(requests["arrival_s"].iloc[-1])
    scaled = scale_rate(requests.assign(clipped=clipped), cfg.rate_scale * cfg.load_scale, name)
    if scaled.empty:
        raise TraceImportError(f"{cfg.path}: regimes.{name}.rate_scale {cfg.rate_scale:g} leaves no request")
    return scaled, limit, length


def build_trace_sets(params: Params, name: str) -> dict[int, TraceSet]:
    """Every seed's timeline, requests and info; raises before anything is written."""
    cfg = params.regimes[name]
    step_s = params.traces.step_s
    trace, limit, length = load_trace(params, name)
    levels = trace_levels(trace, cfg, step_s)
    sets = {}
    for seed in params.seeds:
        seg = cut_segment(trace, cfg, seed, name, length)
        requests = seg[list(REQUEST_COLUMNS)]
        start, end = segment_bounds(cfg, seed)
        info = {
            "regime": name,
            "seed": seed,
            "source": str(cfg.path),
            "format": cfg.format,
            "segment_start_s": start,
            "segment_end_s": end,
            "trace_length_s": length,
            "rate_scale": cfg.rate_scale,
            "output_scale": cfg.output_scale,
            "token_limit": limit,
            "n_requests": len(requests),
            "n_clipped": int(seg["clipped"].sum()),
            **asdict(levels),
        }
        sets[seed] = TraceSet(derive_timeline(requests, cfg, step_s, levels, name, seed), requests, info)
    return sets
