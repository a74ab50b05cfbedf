"""The simulator serving backend: an iteration-level model of a continuous-batching LLM server.

`simulate_replay` replays one seed's request table (open loop: a request
arrives at `arrival_s` whatever the server is doing) against a server that
advances in engine iterations, while a `Schedule`'s merge windows take a
share of its compute, and returns the per-request table of
`syncsafe.serving.metrics`.

Model (parameters and cost formula in `syncsafe.control.serving_model`):

- **Work time.** The machine runs at `speed(t)` (merge share, fleet
  pressure, seeded jitter; piecewise constant between the timeline's steps,
  the jitter buckets and the merge windows' edges and midpoints). The loop
  runs on *work time* `W(t) = integral of speed`, where every iteration costs
  its idle-machine time; arrivals are mapped to work time and results back to
  wall time (`WorkClock`, exact inverse of a piecewise-linear map; a merge
  share of 1 is a full stall: the speed is 0 in the window, the work clock
  stands still, and a work time maps back to the earliest wall time that
  reaches it, so an iteration cut by the stall ends after the window). Where no
  merge ever ran, `W` is the no-sync replay's, so a schedule without merges
  reproduces no-sync bit for bit, and a merge's lost work shows up as the
  queue that builds during its window and drains after it.
- **Iterations.** At most `max_batch` sequences are in the batch. An
  arriving request joins at the next iteration boundary if a slot is free,
  else it waits in a FIFO queue. An iteration that admits requests prefills
  their prompts (at most `max_prefill_tokens` per iteration, at least one
  request) while every running sequence decodes one token; it yields each
  admitted request's first token (TTFT). A request with `o` output tokens
  then needs `o - 1` further iterations and leaves the batch at the end of
  its last one. Between admissions and completions the batch composition is
  constant, so the loop jumps over runs of identical decode iterations in
  closed form (a heap of completion steps; a few Python steps per request).
- TTFT = first token - arrival + `request_overhead_ms`, E2E = done - arrival
  + `request_overhead_ms` + `token_overhead_ms` * output tokens, in ms (the
  API server's work outside the engine). Nothing fails:
  `error` is empty and `output_tokens_received = output_tokens`.

`merge_active` rule: the request's life [arrival_s, arrival_s + E2E)
overlaps a merge window [start, start + window_s) (a zero-length life counts
when a window is active at its arrival).

Deterministic in (requests, timeline, schedule, calibration, seed); well over
10^5 simulated requests per second on one core (benchmarks/bench_simulator.py).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd

from syncsafe.schedules.schedule import Schedule
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, require_columns
from syncsafe.traces.requests import REQUEST_COLUMNS
from syncsafe.traces.timeline import regime_rng

#: Random stream of the speed jitter (see `regime_rng`).
RESIDUAL_STREAM = "simulator-residual"
#: Wall seconds the work clock reaches past the last arrival before it holds its last speed.
HORIZON_PAD_S = 600.0
#: Index bits of a heap key (completion step << bits | request index).
_IDX_BITS = 32


class PressureLookup:
    """The timeline's inference pressure at any trace second (fixed-step timeline)."""

    def __init__(self, timeline: pd.DataFrame) -> None:
        require_columns(timeline, ("t_s", "inference_pressure"), "load timeline")
        if timeline.empty:
            raise ValueError("load timeline has no rows")
        t = timeline["t_s"].to_numpy(dtype=float)
        self.values = timeline["inference_pressure"].to_numpy(dtype=float)
        if not (np.isfinite(self.values).all() and (self.values >= 0).all()):
            raise ValueError("load timeline: inference_pressure must be finite and >= 0")
        self.t0 = float(t[0])
        step_s = float(t[1] - t[0]) if t.size > 1 else 1.0
        if not step_s > 0 or not np.allclose(np.diff(t), step_s, rtol=1e-6, atol=0.0):
            raise ValueError("load timeline: t_s must increase in a fixed step")
        self.step_s = step_s
        #: Timeline rows per second: row = floor((t - t0) * steps_per_s), clipped to the table.
        self.steps_per_s = 1.0 / step_s

    def rows(self, t_s: np.ndarray) -> np.ndarray:
        """Timeline row holding at each time."""
        rows = np.floor((np.asarray(t_s, dtype=float) - self.t0) * self.steps_per_s).astype(np.int64)
        return np.clip(rows, 0, self.values.size - 1)

    def at(self, t_s: np.ndarray) -> np.ndarray:
        return self.values[self.rows(t_s)]

    def edges(self) -> np.ndarray:
        """The times where the held value may change (row starts after the first)."""
        return self.t0 + np.arange(1, self.values.size) * self.step_s


class WorkClock:
    """Wall time <-> work time of a machine running at piecewise-constant speed.

    `edges` (sorted wall times) split time into segments; `speed[j]` holds on
    [edges[j], edges[j+1]), `first_speed` (default `speed[0]`) before the
    first edge and the last speed after the last edge. A segment may stand
    still (speed 0: a merge that stalls the server); the speeds outside the
    edges must be > 0. `to_wall` gives the earliest wall time at which the
    work is reached (the start of a stall for a work time at its level).
    """

    def __init__(self, edges: np.ndarray, speed: np.ndarray, first_speed: float | None = None) -> None:
        first = float(speed[0]) if first_speed is None else float(first_speed)
        if not (np.isfinite(speed).all() and (speed >= 0).all() and speed[-1] > 0 and first > 0):
            raise ValueError("work clock: speed must be finite and >= 0, and > 0 before the first and after the "
                             "last edge")
        self.edges = edges
        self.work = np.concatenate([[0.0], np.cumsum(np.diff(edges) * speed[:-1])])
        self.first_speed, self.last_speed = first, float(speed[-1])
        self._stalls = bool((np.diff(self.work) <= 0).any())

    def to_work(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        w = np.interp(t, self.edges, self.work)
        w = np.where(t < self.edges[0], (t - self.edges[0]) * self.first_speed, w)
        return np.where(t > self.edges[-1], self.work[-1] + (t - self.edges[-1]) * self.last_speed, w)

    def to_wall(self, w: np.ndarray) -> np.ndarray:
        w = np.asarray(w, dtype=float)
        if self._stalls:  # work stands still somewhere: the earliest wall time reaching each work time
            j = np.clip(np.searchsorted(self.work, w, side="left"), 1, self.work.size - 1)
            w0, dw = self.work[j - 1], self.work[j] - self.work[j - 1]
            frac = np.divide(w - w0, dw, out=np.ones_like(w), where=dw > 0)
            t = self.edges[j - 1] + np.clip(frac, 0.0, 1.0) * (self.edges[j] - self.edges[j - 1])
            t = np.where(w <= self.work[0], self.edges[0], t)
        else:
            t = np.interp(w, self.work, self.edges)
        t = np.where(w < 0.0, self.edges[0] + w / self.first_speed, t)
        return np.where(w > self.work[-1], self.edges[-1] + (w - self.work[-1]) / self.last_speed, t)


def work_clock(
    schedule: Schedule, calibration: Calibration, pressure: PressureLookup, jitter: np.ndarray,
    jitter_t0: float, t_end: float,
) -> WorkClock:
    """The machine's work clock under `schedule`'s merges, the timeline's pressure and the seeded jitter."""
    step = calibration.jitter_step_s
    starts = np.asarray(schedule.merge_starts_s, dtype=float)
    w = schedule.window_s
    merge_edges = np.concatenate([starts, starts + w / 2.0, starts + w]) if starts.size else np.empty(0)
    jitter_edges = jitter_t0 + np.arange(1, jitter.size) * step
    lo = min(pressure.t0, jitter_t0)
    if starts.size:  # past every window's end, so the clock runs (speed > 0) after its last edge
        t_end = max(t_end, float((starts + w).max()))
    edges = np.unique(np.concatenate([[lo, t_end], pressure.edges(), jitter_edges, merge_edges]))
    edges = edges[(edges >= lo) & (edges <= t_end)]
    speed = 1.0 / (calibration.pressure_multiplier(pressure.at(edges)))
    jrow = np.clip(np.floor((edges - jitter_t0) / step).astype(np.int64), 0, jitter.size - 1)
    speed = speed / jitter[jrow]
    first_speed = float(speed[0])  # before the first edge: no merge (the clock is never read there)
    if starts.size:
        first, second = calibration.merge_shares()
        i = np.searchsorted(starts, edges, side="right") - 1
        into = edges - starts[np.maximum(i, 0)]
        inside = (i >= 0) & (into < w)
        share = np.where(into < w / 2.0, first, second)
        speed = np.where(inside, speed * np.maximum(1.0 - share, 0.0), speed)
    return WorkClock(edges, speed, first_speed)


def simulate_replay(
    requests: pd.DataFrame,
    timeline: pd.DataFrame,
    schedule: Schedule,
    calibration: Calibration,
    seed: int,
) -> pd.DataFrame:
    """Replay `requests` against the simulated server under `schedule`'s merges.

    Returns one row per request, in the order of `requests`, with the columns
    of `syncsafe.serving.metrics.REQUEST_RESULT_COLUMNS`. Deterministic in
    (requests, timeline, schedule, calibration, seed).
    """
    arrival, prompt, output = _request_arrays(requests)
    pressure = PressureLookup(timeline)
    order = np.argsort(arrival, kind="stable")
    t_lo = min(float(arrival.min()) if arrival.size else pressure.t0, pressure.t0)
    t_hi = max(float(arrival.max()) if arrival.size else pressure.t0, pressure.t0 + pressure.values.size * pressure.step_s)
    n_jitter = int(math.ceil((t_hi - t_lo) / calibration.jitter_step_s)) + 1
    rng = regime_rng(schedule.regime, seed, RESIDUAL_STREAM)
    jitter = rng.lognormal(0.0, calibration.residual_sigma, n_jitter)
    clock = work_clock(schedule, calibration, pressure, jitter, t_lo, t_hi + HORIZON_PAD_S)
    first_w, done_w = serve_iterations(
        clock.to_work(arrival[order]), prompt[order], output[order], calibration,
    )
    first_token, done = np.empty(arrival.size), np.empty(arrival.size)
    first_token[order] = np.maximum(clock.to_wall(first_w), arrival[order])
    done[order] = np.maximum(clock.to_wall(done_w), first_token[order])
    ttft_ms = (first_token - arrival) * 1000.0 + calibration.request_overhead_ms
    e2e_ms = (done - arrival) * 1000.0 + calibration.request_overhead_ms + calibration.token_overhead_ms * output
    return pd.DataFrame(
        {
            "request_id": np.arange(arrival.size, dtype=np.int64),
            "arrival_s": arrival,
            "send_s": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "ttft_ms": ttft_ms,
            "e2e_ms": e2e_ms,
            "output_tokens_received": output,
            "merge_active": schedule.overlaps(arrival, arrival + e2e_ms / 1000.0),
            "inference_pressure": pressure.at(arrival),
            "error": np.full(arrival.size, "", dtype=object),
        },
        columns=list(REQUEST_RESULT_COLUMNS),
    )


def simulate_at_time_scale(
    requests: pd.DataFrame,
    timeline: pd.DataFrame,
    schedule: Schedule,
    calibration: Calibration,
    seed: int,
    time_scale: float = 1.0,
) -> pd.DataFrame:
    """`simulate_replay` of trace-time inputs replayed `time_scale` times faster than wall time.

    The server is `calibration` in wall time (`Calibration.at_time_scale`);
    arrivals, windows and `merge_active` stay on trace time, latencies are
    wall milliseconds, as in a real replay at that time scale.
    """
    results = simulate_replay(requests, timeline, schedule, calibration.at_time_scale(time_scale), seed)
    if time_scale != 1.0:
        results["ttft_ms"] = results["ttft_ms"] / time_scale
        results["e2e_ms"] = results["e2e_ms"] / time_scale
    return results


def serve_iterations(
    arrival_w: np.ndarray, prompt: np.ndarray, output: np.ndarray, calibration: Calibration,
) -> tuple[np.ndarray, np.ndarray]:
    """The iteration loop on work time over requests sorted by arrival: (first-token, done) work times.

    See the module docstring. `G` counts iterations; a running request's heap
    key is the iteration count at which it has produced its last token.
    """
    base = calibration.iter_base_ms / 1000.0
    per_token = calibration.prefill_ms_per_token / 1000.0
    per_seq = calibration.decode_ms_per_seq / 1000.0
    max_batch, budget = calibration.max_batch, calibration.max_prefill_tokens
    arr, prm, out = arrival_w.tolist(), prompt.tolist(), output.tolist()
    n = len(arr)
    first = [0.0] * n
    done = [0.0] * n
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    mask = (1 << _IDX_BITS) - 1
    t = -math.inf
    g = 0  # iterations run so far
    i = 0  # next request not yet admitted
    while i < n or heap:
        running = len(heap)
        if running == 0 and t < arr[i]:
            t = arr[i]  # idle: the next arrival starts an iteration at once
        if i < n and arr[i] <= t and running < max_batch:
            j, tokens = i, 0
            while j < n and arr[j] <= t and running + (j - i) < max_batch:
                if j > i and tokens + prm[j] > budget:
                    break
                tokens += prm[j]
                j += 1
            t += base + per_token * tokens + per_seq * running
            g += 1
            while heap and heap[0] >> _IDX_BITS <= g:
                done[pop(heap) & mask] = t
            for k in range(i, j):
                first[k] = t
                if out[k] > 1:
                    push(heap, (g + out[k] - 1) << _IDX_BITS | k)
                else:
                    done[k] = t
            i = j
            continue
        # decode-only iterations until the next completion or the boundary at/after the next admissible arrival
        step = base + per_seq * running
        k = (heap[0] >> _IDX_BITS) - g
        if i < n and running < max_batch:
            k2 = math.ceil((arr[i] - t) / step)
            if k2 < k:
                k = k2 if k2 > 1 else 1
        t += k * step
        g += k
        while heap and heap[0] >> _IDX_BITS <= g:
            done[pop(heap) & mask] = t
    return np.asarray(first), np.asarray(done)


def _request_arrays(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated `arrival_s` (float) and token counts (int64) of the request table."""
    require_columns(requests, REQUEST_COLUMNS, "request table")
    arrival = _numeric(requests, "arrival_s")
    if not np.isfinite(arrival).all():
        raise ValueError("request table: arrival_s must be finite")
    tokens = []
    for column in ("prompt_tokens", "output_tokens"):
        values = _numeric(requests, column)
        if not (np.isfinite(values).all() and (values >= 0).all() and (values == np.rint(values)).all()):
            raise ValueError(f"request table: {column} must be whole numbers >= 0")
        tokens.append(values.astype(np.int64))
    return arrival, tokens[0], tokens[1]


def _numeric(requests: pd.DataFrame, column: str) -> np.ndarray:
    try:
        return requests[column].to_numpy(dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"request table: column {column!r} is not numeric or has missing values") from None
