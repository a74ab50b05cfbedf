"""The simulator serving backend: a fast discrete-event model of an LLM server.

`simulate_replay` replays one seed's request table (open loop: a request
arrives at `arrival_s` whatever the server is doing) against a server doing
continuous batching, while a `Schedule`'s merge windows run beside it, and
returns the per-request table of `syncsafe.serving.metrics`.

Model (parameters from `Calibration`):

- The server holds at most `max_batch` requests in flight. An arriving
  request takes a free slot at once, otherwise it waits in a FIFO queue and
  takes the first slot that frees up (never before the request ahead of it).
- A request in a slot runs two phases back to back. Their idle-server work:

      prefill_ms = (base_ms + prefill_ms_per_token * prompt_tokens) * residual
      decode_ms  = decode_ms_per_token * output_tokens * residual

  where `residual ~ LogNormal(0, residual_sigma)` (median 1) is drawn once
  per request from the seed (stream keyed by regime and seed; the k-th
  arrival gets the k-th draw), so every schedule of the same seed sees the
  same residuals.
- Each phase's work is slowed by

      m(t) = (1 + pressure_slowdown * inference_pressure(t))
             * (1 + batch_slowdown * (in_flight - 1) / max_batch)
             * (merge_slowdown if a merge window is active at t else 1)

  `inference_pressure(t)` is the timeline's step value at t (held before
  the first and after the last row); `in_flight` counts the requests in slots,
  this one included.
- Approximation: the pressure factor is read at the start of each phase and
  the batching factor when the request takes its slot; both then hold for
  the phase. The merge factor is integrated exactly: inside a merge window
  the phase progresses at 1 / merge_slowdown of its speed, outside at full
  speed. Hence a phase that does not overlap a merge window takes exactly
  the time it takes in the no-sync replay of the same seed; merges reach
  other requests only through real knock-on effects (a slowed request holds
  its slot and raises the batching factor longer, and the queue grows).
- TTFT = queue wait + prefill; E2E = TTFT + decode. Nothing fails, so
  `error` is empty and `output_tokens_received = output_tokens`.

`merge_active` rule: the request's life [arrival_s, arrival_s + E2E)
overlaps a merge window [start, start + window_s) (a zero-length life counts
when a window is active at its arrival). Requests that only wait in the queue
during a merge count as merge-active too: the merge is what they wait on.

The event loop is plain Python over precomputed per-request work (one heap
push and pop per request); it simulates several hundred thousand requests
per second on one core (benchmarks/bench_simulator.py).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable

import numpy as np
import pandas as pd

from syncsafe.schedules.schedule import Schedule
from syncsafe.serving.calibration import Calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, require_columns
from syncsafe.traces.requests import REQUEST_COLUMNS
from syncsafe.traces.timeline import regime_rng

#: Random stream of the per-request latency residuals (see `regime_rng`).
RESIDUAL_STREAM = "simulator-residual"

#: `finish(start_s, work_s) -> end_s`: when a phase needing `work_s` of
#: full-speed service, started at `start_s`, completes.
PhaseClock = Callable[[float, float], float]


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
        #: Timeline rows per second: row = floor((t - t0) * steps_per_s), clipped to the table.
        self.steps_per_s = 1.0 / step_s

    def rows(self, t_s: np.ndarray) -> np.ndarray:
        """Timeline row holding at each time (the same rule as the event loop's)."""
        rows = np.floor((np.asarray(t_s, dtype=float) - self.t0) * self.steps_per_s).astype(np.int64)
        return np.clip(rows, 0, self.values.size - 1)

    def at(self, t_s: np.ndarray) -> np.ndarray:
        return self.values[self.rows(t_s)]


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
    # The k-th arrival's residual: the same however the request table's rows are ordered.
    rng = regime_rng(schedule.regime, seed, RESIDUAL_STREAM)
    residual = rng.lognormal(0.0, calibration.residual_sigma, arrival.size)
    first_token, done = np.empty(arrival.size), np.empty(arrival.size)
    first_token[order], done[order] = _serve(
        arrival[order],
        calibration.prefill_ms(prompt[order]) * residual / 1000.0,
        calibration.decode_ms(output[order]) * residual / 1000.0,
        pressure,
        calibration,
        merge_phase_clock(schedule, calibration.merge_slowdown),
    )
    ttft_ms = (first_token - arrival) * 1000.0
    e2e_ms = (done - arrival) * 1000.0
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
            "merge_active": overlaps_merge_window(schedule, arrival, done),
            "inference_pressure": pressure.at(arrival),
            "error": np.full(arrival.size, "", dtype=object),
        },
        columns=list(REQUEST_RESULT_COLUMNS),
    )


def merge_phase_clock(schedule: Schedule, merge_slowdown: float) -> PhaseClock:
    """Phase completion times with the merge factor integrated exactly.

    A phase progresses at full speed outside merge windows and at
    1 / merge_slowdown inside them. A phase that meets no window ends at
    exactly `start_s + work_s`, bit for bit the no-sync result.
    """
    starts = [float(s) for s in schedule.merge_starts_s]
    ends = [s + schedule.window_s for s in starts]
    n = len(starts)

    def finish(t: float, work: float) -> float:
        i = bisect_right(ends, t)  # first window still open after t
        while i < n:
            if t < starts[i]:
                gap = starts[i] - t
                if work <= gap:
                    return t + work
                work -= gap
                t = starts[i]
            room = (ends[i] - t) / merge_slowdown  # full-speed work the rest of this window holds
            if work <= room:
                return t + work * merge_slowdown
            work -= room
            t = ends[i]
            i += 1
        return t + work

    return finish


def overlaps_merge_window(schedule: Schedule, start_s: np.ndarray, end_s: np.ndarray) -> np.ndarray:
    """True where [start_s, end_s) overlaps a merge window, or a window is active at start_s."""
    starts = np.asarray(schedule.merge_starts_s, dtype=float)
    if starts.size == 0:
        return np.zeros(np.shape(start_s), dtype=bool)
    last = np.searchsorted(starts, end_s, side="left") - 1  # last window opening before end_s
    overlap = (last >= 0) & (starts[np.maximum(last, 0)] + schedule.window_s > start_s)
    return overlap | schedule.windows_mask(start_s)


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


def _serve(
    arrival_s: np.ndarray,
    prefill_work_s: np.ndarray,
    decode_work_s: np.ndarray,
    pressure: PressureLookup,
    calibration: Calibration,
    finish: PhaseClock,
) -> tuple[np.ndarray, np.ndarray]:
    """The event loop over requests sorted by arrival: first-token and done times.

    `slots` is a heap of the completion times of the requests in flight; a
    request admitted at t first retires every completion <= t.
    """
    max_batch = calibration.max_batch
    batch_factor = [calibration.batch_multiplier(float(k + 1)) for k in range(max_batch)]  # by others in flight
    pressure_factor = calibration.pressure_multiplier(pressure.values).tolist()
    t0, per_step, last_row = pressure.t0, pressure.steps_per_s, len(pressure_factor) - 1
    slots: list[float] = []
    first_token: list[float] = []
    done: list[float] = []
    admitted = float("-inf")
    pop, push = heapq.heappop, heapq.heappush
    for arrival, prefill_work, decode_work in zip(arrival_s.tolist(), prefill_work_s.tolist(), decode_work_s.tolist()):
        t = arrival if arrival > admitted else admitted  # FIFO: never ahead of an earlier request
        while slots and slots[0] <= t:
            pop(slots)
        if len(slots) >= max_batch:  # queue until the first slot frees up
            t = pop(slots)
            while slots and slots[0] <= t:
                pop(slots)
        admitted = t
        batch = batch_factor[len(slots)]
        row = int((t - t0) * per_step)
        ft = finish(t, prefill_work * batch * pressure_factor[0 if row < 0 else last_row if row > last_row else row])
        row = int((ft - t0) * per_step)
        end = finish(ft, decode_work * batch * pressure_factor[0 if row < 0 else last_row if row > last_row else row])
        push(slots, end)
        first_token.append(ft)
        done.append(end)
    return np.asarray(first_token), np.asarray(done)
