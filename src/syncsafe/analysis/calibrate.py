"""The calibrate stage: fit the simulator to real vLLM replays, report effect-size transfer and fidelity.

Inputs are the vLLM replays of the replay-vllm stage
(`runs/replay-sets/vllm/index.csv` and, per replay, `requests.parquet` and
`summary.json`), each replay's schedule and its seed's load timeline. Outputs,
in `runs/calibration/` (swapped in as a whole directory, so a failure leaves
the previous set or none, never a mixture):

- `calibration.json`: the fitted `Calibration` (`fitted: true`), loadable by
  `syncsafe.serving.calibration.load_calibration`;
- `mechanism.json`: `MechanismEvidence` per regime: `sync_ratio` is the real
  *paired* sync ratio (below), `pressure_ratio` the real high/low-pressure
  p95 ratio of the no-sync replays;
- `transfer.csv`: per regime and mechanism metric, real vs simulated;
- `fidelity.csv`: per held-out replay, real vs predicted SLO violation rate and
  p95 E2E, with the error per metric;
- `report.md`: the fitted parameters, both tables and one sentence on whether
  the mechanism shows on the real backend.

Time. vLLM replays compress trace time: a request arriving at trace second
`a` is sent at wall second `a / time_scale`, a merge window lasts
`window_s / time_scale` wall seconds, and only arrivals `< max_trace_s` are
replayed; latencies are real milliseconds. Everything here that meets the
simulator therefore runs on *wall* time: the request table, timeline and
schedule are divided by `time_scale` (`wall_inputs`), so the fitted
calibration describes the real server in real milliseconds and can be used
unchanged by the simulator replay stage (which runs trace time at 1x).

Mechanism measures (per regime, pooled over the regime's replays):

- *unpaired sync ratio*: p95 E2E of the merge-active requests of the replays
  with merges / p95 E2E of their merge-inactive requests (what
  `ReplaySummary.sync_ratio` is per replay). Confounded by load: bursts make
  inactive requests slow too, so it can sit below 1 while merges clearly hurt.
- *paired sync ratio* (the measure written to `mechanism.json`): p95 E2E of
  those merge-active requests / p95 E2E of the *same request ids* in the same
  seed's no_sync replay. Same requests, same load; only the merge differs.
- *paired control ratio*: the same pairing for the merge-*inactive* requests
  (merges reach them only through knock-on queueing, or not at all).
- *pre-merge ratio*: the same pairing for the requests done before their
  replay's first merge window opens. No merge can have touched them: the
  simulator gives exactly 1, and a real value well above 1 means the real
  replays drift from run to run, so the paired sync ratio cannot be read as
  merge interference alone. Both controls are reported beside the others.
- *pressure ratio*: in the no_sync replays, p95 E2E of requests arriving at
  inference pressure >= `replay.high_pressure` / p95 of the rest.

Fit (`fit_calibration`), on wall time, the simulator's model
(`syncsafe.serving.simulator`) term by term:

1. Service time, from the no_sync replays, on the requests that did not
   queue: `k`, the requests in flight at a request's send (itself included,
   observed from send and E2E), at most `max_batch`. With `p0`/`p1` the
   inference pressure at send / at first token,

       ttft = (base_ms + prefill_ms_per_token * prompt) * (1 + ps * p0) * B(k) * r
       e2e  = ttft + decode_ms_per_token * output * (1 + ps * p1) * B(k) * r
       B(k) = 1 + batch_slowdown * (k - 1) / max_batch

   fitted by `scipy.optimize.least_squares(loss="soft_l1")` on the log
   residuals of TTFT and E2E jointly (`batch_slowdown` a free parameter
   here; queueing and scheduling hiccups inflate TTFT, and the robust loss
   keeps them from dragging the fit). E2E rather than E2E - TTFT: the vLLM
   server may coalesce a fast request's streamed tokens into its first chunk,
   leaving a near-zero decode time that says nothing about decode cost.
   `pressure_slowdown` (`ps`) thus comes from high- vs low-pressure no_sync
   requests *at the same batch occupancy*, so it is not mistaken for load.
2. `residual_sigma` = 1.4826 * MAD of the log E2E residuals of those requests
   (the simulator draws one log-normal residual per request for both phases).
3. `merge_slowdown`, from the pairing: for each merge-active request of a
   replay with merges (unqueued there and in no_sync), its send time `t` and
   its work `W` = its no_sync E2E * B(k here) / B(k in no_sync) (knock-on
   batching is not merge slowdown; `batch_slowdown` from step 1's joint
   fit); the prediction `clock_m(t, W) - t` (the simulator's exact merge
   clock: full speed outside windows, 1/m inside) is fitted to its E2E with
   `least_squares(loss="soft_l1")` on log residuals. Unlike the median of
   per-request E2E ratios (reported as a diagnostic), this neither
   underestimates `m` for requests that overlap a window only in part nor
   counts knock-on batching as merge slowdown.
4. `max_batch` = `--max-num-seqs` of the server arguments when given.
5. `batch_slowdown`: a 1-D search (grid, then `scipy.optimize.minimize_scalar`
   bounded around the best grid point) minimising the mean |log(p95 sim /
   p95 real)| over the fit set's replays, with the service parameters of
   step 1 refit at each candidate (`batch_slowdown` fixed) so that the
   parameters stay mutually consistent.
6. `capacity_rps` = max_batch / (median service time of the no_sync requests
   at a full batch and full pressure), in requests per wall second.

Held-out fidelity (`held_out_fidelity`): fit on the no_sync and controller
replays, predict the matched-random draws (or, without draws, every second
replay with merges); per held-out replay the predicted SLO violation rate
(judged by the real replay's own SLO) and p95 E2E against the real ones.
The calibration written to `calibration.json` is fitted on all replays.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, minimize_scalar

from syncsafe import io
from syncsafe.analysis.report import markdown_table
from syncsafe.analysis.verdicts import MechanismEvidence, RegimeMechanism
from syncsafe.config import Params
from syncsafe.schedules.schedule import Schedule, read_schedule
from syncsafe.serving.calibration import Calibration
from syncsafe.serving.metrics import (
    REQUEST_RESULT_COLUMNS,
    SloSpec,
    derive_slo,
    failed_mask,
    require_columns,
    violation_mask,
)
from syncsafe.serving.simulator import PressureLookup, merge_phase_clock, simulate_replay
from syncsafe.traces.stage import load_timeline

CALIBRATION_DIR = Path("runs") / "calibration"
VLLM_INDEX = Path("runs") / "replay-sets" / "vllm" / "index.csv"
CALIBRATION_FILE = "calibration.json"
MECHANISM_FILE = "mechanism.json"
TRANSFER_FILE = "transfer.csv"
FIDELITY_FILE = "fidelity.csv"
REPORT_FILE = "report.md"

TRANSFER_COLUMNS = ("regime", "metric", "real", "simulated", "sim_over_real", "n_real")
TRANSFER_METRICS = (
    "sync_ratio_paired", "sync_ratio_unpaired", "control_ratio_paired", "pre_merge_ratio_paired", "pressure_ratio",
)  # fmt: skip
FIDELITY_COLUMNS = (
    "regime", "seed", "policy", "draw", "source", "label", "n_requests",
    "slo_violation_rate_real", "slo_violation_rate_pred", "slo_violation_rate_abs_err",
    "p95_ms_real", "p95_ms_pred", "p95_ms_rel_err",
)  # fmt: skip

#: Consistency constant of the MAD for a normal distribution.
MAD_TO_SIGMA = 1.4826
#: Bounds of the batch_slowdown search and its grid.
BATCH_SLOWDOWN_BOUNDS = (0.0, 8.0)
BATCH_SLOWDOWN_GRID = 33
#: Fewest unqueued no_sync requests the service-time fit accepts.
MIN_SERVICE_ROWS = 10


class CalibrationInputError(FileNotFoundError):
    """The vLLM replays the calibrate stage needs are missing or incomplete."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ReplayRecord:
    """One real (or simulated) replay: per-request table, schedule, load and time scale.

    `results` has the per-request contract columns; `arrival_s` and `send_s`
    are in *trace* seconds (vLLM writes `send_s` scaled back to trace time),
    latencies in real milliseconds. `schedule` and `timeline` are in trace
    seconds too. A replay of `time_scale` s ran trace time that many times
    faster than wall time; only arrivals `< max_trace_s` were replayed (None:
    no cut). `slo` is the SLO the replay was judged by (its summary.json's
    `slo`); None derives one from the seed's no_sync replay when needed.

    The seed's no_sync replay is the record of the same (regime, seed) whose
    schedule has source `no_sync` (see `no_sync_records`).
    """

    regime: str
    seed: int
    label: str
    results: pd.DataFrame
    schedule: Schedule
    timeline: pd.DataFrame
    time_scale: float = 1.0
    max_trace_s: float | None = None
    slo: SloSpec | None = None

    def __post_init__(self) -> None:
        require_columns(self.results, REQUEST_RESULT_COLUMNS, f"replay {self.name}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"replay {self.name}: time_scale must be a positive number (got {self.time_scale})")
        ids = self.results["request_id"]
        if ids.duplicated().any():
            raise ValueError(f"replay {self.name}: request_id repeats")

    @property
    def name(self) -> str:
        return f"{self.regime}/seed-{self.seed}/{self.label}"

    @property
    def key(self) -> tuple[str, int]:
        return self.regime, self.seed

    @property
    def is_no_sync(self) -> bool:
        return self.schedule.source == "no_sync"

    @property
    def merge_starts_s(self) -> list[float]:
        """The schedule's merge starts inside the replayed span (trace seconds)."""
        cut = self.max_trace_s
        return [s for s in self.schedule.merge_starts_s if cut is None or s < cut]

    @property
    def has_merges(self) -> bool:
        return bool(self.merge_starts_s)

    def by_id(self) -> pd.DataFrame:
        """`results` indexed by request_id, sorted."""
        return self.results.set_index("request_id").sort_index()


def no_sync_records(records: Iterable[ReplayRecord]) -> dict[tuple[str, int], ReplayRecord]:
    """The no_sync record of each (regime, seed); every seed with any record must have exactly one."""
    records = list(records)
    found: dict[tuple[str, int], ReplayRecord] = {}
    for rec in records:
        if rec.is_no_sync:
            if rec.key in found:
                raise ValueError(f"{rec.regime} seed {rec.seed}: more than one no_sync replay")
            found[rec.key] = rec
    missing = sorted({rec.key for rec in records} - set(found))
    if missing:
        raise ValueError(
            "no no_sync replay for " + ", ".join(f"{r} seed {s}" for r, s in missing)
            + ": the paired ratios and the service-time fit need each seed's no_sync replay"
        )
    return found


def wall_inputs(record: ReplayRecord) -> tuple[pd.DataFrame, pd.DataFrame, Schedule]:
    """The simulator's inputs for `record` on wall time: requests, timeline, schedule.

    Requests are the record's (sorted by request_id, cut at `max_trace_s`)
    with `arrival_s / time_scale`; the timeline's `t_s / time_scale`; merge
    windows starting before `max_trace_s`, every time field divided by
    `time_scale`. (A window that the vLLM replay cut at `max_trace_s` runs
    whole here; no request arrives after the cut, so only requests still in
    flight past it could notice.)
    """
    scale = record.time_scale
    req = record.by_id()
    if record.max_trace_s is not None:
        req = req[req["arrival_s"] < record.max_trace_s]
    requests = pd.DataFrame({
        "arrival_s": req["arrival_s"].to_numpy(dtype=float) / scale,
        "prompt_tokens": req["prompt_tokens"].to_numpy(dtype=np.int64),
        "output_tokens": req["output_tokens"].to_numpy(dtype=np.int64),
    })  # fmt: skip
    timeline = record.timeline.copy()
    timeline["t_s"] = timeline["t_s"].to_numpy(dtype=float) / scale
    s = record.schedule
    starts = record.merge_starts_s
    schedule = Schedule(
        regime=s.regime, policy=s.policy, seed=s.seed, draw=s.draw, matched_to=s.matched_to, source=s.source,
        duration_s=s.duration_s / scale, window_s=s.window_s / scale, min_gap_s=s.min_gap_s / scale,
        merge_starts_s=[x / scale for x in starts],
    )  # fmt: skip
    return requests, timeline, schedule


def simulate_record(record: ReplayRecord, calibration: Calibration) -> ReplayRecord:
    """`record` replayed by the simulator on its wall-time inputs; the result in the record's units.

    The simulated table keeps the real request ids and trace-second
    `arrival_s`/`send_s` (the simulator sends on time), latencies in ms.
    """
    requests, timeline, schedule = wall_inputs(record)
    sim = simulate_replay(requests, timeline, schedule, calibration, record.seed)
    ids = record.by_id()
    if record.max_trace_s is not None:
        ids = ids[ids["arrival_s"] < record.max_trace_s]
    sim["request_id"] = ids.index.to_numpy()
    sim["arrival_s"] = ids["arrival_s"].to_numpy(dtype=float)
    sim["send_s"] = sim["arrival_s"]
    return replace(record, results=sim)


# --------------------------------------------------------------------------- mechanism ratios


def _ok(results: pd.DataFrame) -> np.ndarray:
    return ~failed_mask(results) & np.isfinite(results["e2e_ms"].to_numpy(dtype=float))


def _p95(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 95)) if values.size else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom <= 0:
        return None
    return top / bottom


Group = Literal["active", "inactive", "pre_merge"]


def _group_mask(rec: ReplayRecord, r: pd.DataFrame, group: Group) -> np.ndarray:
    """Requests of `r` (a replay's table by id) in `group`: merge-active, merge-inactive, or done
    before the replay's first merge window opens (trace time)."""
    if group == "pre_merge":
        done = r["send_s"].to_numpy(dtype=float) + r["e2e_ms"].to_numpy(dtype=float) / 1000.0 * rec.time_scale
        return done < rec.merge_starts_s[0]
    return r["merge_active"].to_numpy(dtype=bool) == (group == "active")


def _paired_groups(records: Sequence[ReplayRecord], group: Group) -> tuple[np.ndarray, np.ndarray]:
    """E2E (ms) of one group of requests of the replays with merges, and of the same request ids
    in their seed's no_sync replay (pooled, in the same order)."""
    twins = no_sync_records(records)
    mine, theirs = [], []
    for rec in records:
        if not rec.has_merges:
            continue
        base = twins[rec.key].by_id()
        r = rec.by_id()
        mask = _ok(r.reset_index()) & _group_mask(rec, r, group)
        ids = r.index[mask]
        ids = ids[ids.isin(base.index)]
        base_ok = pd.Series(_ok(base.reset_index()), index=base.index)
        ids = ids[base_ok.loc[ids].to_numpy()]
        mine.append(r.loc[ids, "e2e_ms"].to_numpy(dtype=float))
        theirs.append(base.loc[ids, "e2e_ms"].to_numpy(dtype=float))
    if not mine:
        return np.empty(0), np.empty(0)
    return np.concatenate(mine), np.concatenate(theirs)


def paired_sync_ratio(records: Sequence[ReplayRecord]) -> float | None:
    """p95 E2E of merge-active requests / p95 E2E of the same request ids in their seed's no_sync replay.

    Pooled over the replays with merges in `records` (which must hold each
    seed's no_sync replay). None without merge-active requests.
    """
    mine, theirs = _paired_groups(records, "active")
    return _ratio(_p95(mine), _p95(theirs))


def paired_control_ratio(records: Sequence[ReplayRecord]) -> float | None:
    """As `paired_sync_ratio`, for the merge-*inactive* requests of the replays with merges."""
    mine, theirs = _paired_groups(records, "inactive")
    return _ratio(_p95(mine), _p95(theirs))


def pre_merge_ratio(records: Sequence[ReplayRecord]) -> float | None:
    """As `paired_sync_ratio`, for the requests done before their replay's first merge window opens.

    No merge can have touched these requests, so anything but ~1 is
    replay-to-replay drift of the real backend (the simulator gives exactly 1).
    """
    mine, theirs = _paired_groups(records, "pre_merge")
    return _ratio(_p95(mine), _p95(theirs))


def unpaired_sync_ratio(records: Sequence[ReplayRecord]) -> float | None:
    """p95 E2E of merge-active / merge-inactive requests, pooled over the replays with merges."""
    active, inactive = [], []
    for rec in records:
        if not rec.has_merges:
            continue
        r = rec.results
        ok = _ok(r)
        flag = r["merge_active"].to_numpy(dtype=bool)
        e2e = r["e2e_ms"].to_numpy(dtype=float)
        active.append(e2e[ok & flag])
        inactive.append(e2e[ok & ~flag])
    if not active:
        return None
    return _ratio(_p95(np.concatenate(active)), _p95(np.concatenate(inactive)))


def pressure_ratio(records: Sequence[ReplayRecord], high_pressure: float) -> float | None:
    """p95 E2E at inference pressure >= `high_pressure` / below it, pooled over the no_sync replays."""
    high, low = [], []
    for rec in records:
        if not rec.is_no_sync:
            continue
        r = rec.results
        ok = _ok(r)
        hp = r["inference_pressure"].to_numpy(dtype=float) >= high_pressure
        e2e = r["e2e_ms"].to_numpy(dtype=float)
        high.append(e2e[ok & hp])
        low.append(e2e[ok & ~hp])
    if not high:
        return None
    return _ratio(_p95(np.concatenate(high)), _p95(np.concatenate(low)))


def mechanism_ratios(records: Sequence[ReplayRecord], high_pressure: float) -> dict[str, float | None]:
    """The four mechanism measures of `records` (one regime), keyed as in `TRANSFER_METRICS`."""
    return {
        "sync_ratio_paired": paired_sync_ratio(records),
        "sync_ratio_unpaired": unpaired_sync_ratio(records),
        "control_ratio_paired": paired_control_ratio(records),
        "pre_merge_ratio_paired": pre_merge_ratio(records),
        "pressure_ratio": pressure_ratio(records, high_pressure),
    }


# --------------------------------------------------------------------------- fit


@dataclass(frozen=True)
class CalibrationFit:
    """A fitted calibration and how the fit went."""

    calibration: Calibration
    #: Numbers behind the fit (rows used, raw ratios, search objective...).
    diagnostics: dict[str, float | int | str | None] = field(default_factory=dict)


def max_num_seqs(server_args: Sequence[str]) -> int | None:
    """The value of `--max-num-seqs` in vLLM server arguments, or None."""
    args = list(server_args)
    for i, arg in enumerate(args):
        m = re.fullmatch(r"--max[-_]num[-_]seqs(?:=(\d+))?", arg)
        if m:
            value = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args) else None)
            if value is None or not str(value).isdigit() or int(value) < 1:
                raise ValueError(f"server_args: --max-num-seqs needs a positive whole number (got {value!r})")
            return int(value)
    return None


def in_flight_at_send(send_s: np.ndarray, e2e_s: np.ndarray) -> np.ndarray:
    """Requests in flight at each request's send, itself included: sends <= t minus completions <= t."""
    end = send_s + np.where(np.isfinite(e2e_s), e2e_s, 0.0)
    sends, ends = np.sort(send_s), np.sort(end)
    return np.searchsorted(sends, send_s, side="right") - np.searchsorted(ends, send_s, side="right")


@dataclass(frozen=True)
class _ServiceRows:
    """No_sync requests that did not queue, on wall time, for the service-time fit."""

    prompt: np.ndarray
    output: np.ndarray
    ttft_ms: np.ndarray
    decode_ms: np.ndarray
    e2e_ms: np.ndarray
    k: np.ndarray
    p_send: np.ndarray
    p_first: np.ndarray
    n_no_sync: int

    @property
    def has_decode(self) -> np.ndarray:
        return (self.output >= 1) & (self.decode_ms > 0)


def _service_rows(no_sync: Sequence[ReplayRecord], max_batch: int) -> _ServiceRows:
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("prompt", "output", "ttft", "e2e", "k", "p0", "p1")}
    total = 0
    for rec in no_sync:
        r = rec.results
        total += len(r)
        send = r["send_s"].to_numpy(dtype=float) / rec.time_scale
        ttft = r["ttft_ms"].to_numpy(dtype=float)
        e2e = r["e2e_ms"].to_numpy(dtype=float)
        k = in_flight_at_send(send, e2e / 1000.0)
        _, timeline, _ = wall_inputs(rec)
        pressure = PressureLookup(timeline)
        keep = _ok(r) & np.isfinite(ttft) & (ttft > 0) & (e2e >= ttft) & (k <= max_batch)
        cols["prompt"].append(r["prompt_tokens"].to_numpy(dtype=float)[keep])
        cols["output"].append(r["output_tokens"].to_numpy(dtype=float)[keep])
        cols["ttft"].append(ttft[keep])
        cols["e2e"].append(e2e[keep])
        cols["k"].append(k[keep].astype(float))
        cols["p0"].append(pressure.at(send[keep]))
        cols["p1"].append(pressure.at(send[keep] + ttft[keep] / 1000.0))
    c = {name: np.concatenate(v) if v else np.empty(0) for name, v in cols.items()}
    return _ServiceRows(c["prompt"], c["output"], c["ttft"], c["e2e"] - c["ttft"], c["e2e"], c["k"], c["p0"],
                        c["p1"], total)


def _service_predict(x: np.ndarray, rows: _ServiceRows, batch_slowdown: float, max_batch: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Idle-server TTFT and decode (ms, residual 1) of the rows for x = (base, prefill/token, decode/token, ps)."""
    base, per_prompt, per_output, ps = x
    batch = 1.0 + batch_slowdown * (rows.k - 1.0) / max_batch
    ttft = (base + per_prompt * rows.prompt) * (1.0 + ps * rows.p_send) * batch
    decode = per_output * rows.output * (1.0 + ps * rows.p_first) * batch
    return ttft, decode


def _fit_service(rows: _ServiceRows, max_batch: int, batch_slowdown: float | None
                 ) -> tuple[np.ndarray, float, float]:
    """Robust log-residual fit: ((base, prefill/token, decode/token, ps), batch_slowdown, residual_sigma).

    `batch_slowdown` None fits it jointly; a number holds it fixed.
    """
    dec = rows.has_decode
    eps = 1e-9

    def split(theta: np.ndarray) -> tuple[np.ndarray, float]:
        return (theta[:4], float(theta[4])) if batch_slowdown is None else (theta, float(batch_slowdown))

    def residuals(theta: np.ndarray) -> np.ndarray:
        x, bs = split(theta)
        ttft, decode = _service_predict(x, rows, bs, max_batch)
        return np.concatenate([
            np.log(rows.ttft_ms) - np.log(np.maximum(ttft, eps)),
            np.log(rows.e2e_ms) - np.log(np.maximum(ttft + decode, eps)),
        ])  # fmt: skip

    per_output0 = float(np.median(rows.decode_ms[dec] / rows.output[dec])) if dec.any() else 1.0
    per_prompt0 = float(np.median(rows.ttft_ms / np.maximum(rows.prompt, 1.0))) / 2.0
    x0 = [max(float(np.median(rows.ttft_ms)) / 4.0, 1e-3), max(per_prompt0, 1e-4), max(per_output0, 1e-4), 0.1]
    lower, upper = [1e-6, 0.0, 1e-6, 0.0], [np.inf, np.inf, np.inf, 50.0]
    if batch_slowdown is None:
        x0, lower, upper = x0 + [0.5], lower + [BATCH_SLOWDOWN_BOUNDS[0]], upper + [BATCH_SLOWDOWN_BOUNDS[1]]
    theta = np.asarray(x0, dtype=float)
    f_scale = 0.3
    for _ in range(2):  # second pass: the robust loss's scale from the first pass's residual spread
        fit = least_squares(residuals, theta, bounds=(lower, upper), loss="soft_l1", f_scale=f_scale,
                            x_scale="jac", max_nfev=2000)
        theta = fit.x
        f_scale = max(_mad_sigma(residuals(theta)), 0.02)
    x, bs = split(theta)
    ttft, decode = _service_predict(x, rows, bs, max_batch)
    sigma = _mad_sigma(np.log(rows.e2e_ms) - np.log(np.maximum(ttft + decode, eps)))
    return np.asarray(x, dtype=float), bs, sigma


def _mad_sigma(residuals: np.ndarray) -> float:
    residuals = residuals[np.isfinite(residuals)]
    if residuals.size == 0:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(residuals - np.median(residuals))))


def _merge_rows(records: Sequence[ReplayRecord], max_batch: int, batch_slowdown: float
                ) -> list[tuple[Schedule, np.ndarray, np.ndarray, np.ndarray]]:
    """Per replay with merges: (wall schedule, send wall s, no_sync work s, E2E s) of its merge-active requests.

    The work is the request's no_sync E2E rescaled by the batch factor it met
    in this replay over the one it met in no_sync (`B(k)`, `k` observed at
    send): knock-on batching is not merge slowdown. Only requests that did not
    queue in either replay (`k <= max_batch`) are kept.
    """
    twins = no_sync_records(records)
    out = []
    for rec in records:
        if not rec.has_merges:
            continue
        base = twins[rec.key].by_id()
        r = rec.by_id()
        k_r = pd.Series(in_flight_at_send(r["send_s"].to_numpy(dtype=float) / rec.time_scale,
                                          r["e2e_ms"].to_numpy(dtype=float) / 1000.0), index=r.index)
        k_b = pd.Series(in_flight_at_send(base["send_s"].to_numpy(dtype=float) / twins[rec.key].time_scale,
                                          base["e2e_ms"].to_numpy(dtype=float) / 1000.0), index=base.index)
        mask = _ok(r.reset_index()) & r["merge_active"].to_numpy(dtype=bool) & (k_r.to_numpy() <= max_batch)
        ids = r.index[mask]
        ids = ids[ids.isin(base.index)]
        base_ok = pd.Series(_ok(base.reset_index()), index=base.index) & (k_b <= max_batch)
        ids = ids[base_ok.loc[ids].to_numpy()]
        batch = (1.0 + batch_slowdown * (k_r.loc[ids].to_numpy() - 1.0) / max_batch) / (
            1.0 + batch_slowdown * (k_b.loc[ids].to_numpy() - 1.0) / max_batch)
        work = base.loc[ids, "e2e_ms"].to_numpy(dtype=float) / 1000.0 * batch
        e2e = r.loc[ids, "e2e_ms"].to_numpy(dtype=float) / 1000.0
        good = (work > 0) & (e2e > 0)
        if not good.any():
            continue
        send = r.loc[ids, "send_s"].to_numpy(dtype=float) / rec.time_scale
        _, _, schedule = wall_inputs(rec)
        out.append((schedule, send[good], work[good], e2e[good]))
    return out


def _median_paired_ratio(records: Sequence[ReplayRecord]) -> float | None:
    """Median over merge-active requests of E2E / the same request's no_sync E2E (a diagnostic)."""
    mine, theirs = _paired_groups(records, "active")
    good = theirs > 0
    return float(np.median(mine[good] / theirs[good])) if good.any() else None


def _fit_merge_slowdown(rows: list[tuple[Schedule, np.ndarray, np.ndarray, np.ndarray]]) -> float:
    """merge_slowdown fitted to the merge-active requests' E2E through the simulator's merge clock."""
    y = np.log(np.concatenate([e2e for *_, e2e in rows]))
    naive = float(np.median(np.concatenate([e2e / work for _, _, work, e2e in rows])))

    def residuals(theta: np.ndarray) -> np.ndarray:
        m = float(theta[0])
        preds = []
        for schedule, send, base, _ in rows:
            finish = merge_phase_clock(schedule, m)
            preds.append(np.array([finish(t, w) - t for t, w in zip(send.tolist(), base.tolist())]))
        return y - np.log(np.maximum(np.concatenate(preds), 1e-12))

    theta = np.array([min(max(naive, 1.05), 20.0)])
    f_scale = 0.3
    for _ in range(2):
        fit = least_squares(residuals, theta, bounds=([1.0], [100.0]), loss="soft_l1", f_scale=f_scale, diff_step=1e-3)
        theta = fit.x
        f_scale = max(_mad_sigma(residuals(theta)), 0.02)
    return float(theta[0])


def _p95_error(records: Sequence[ReplayRecord], calibration: Calibration) -> float:
    """Mean |log(p95 simulated / p95 real)| of E2E over `records`."""
    errors = []
    for rec in records:
        real = _p95(rec.results["e2e_ms"].to_numpy(dtype=float)[_ok(rec.results)])
        sim = _p95(simulate_record(rec, calibration).results["e2e_ms"].to_numpy(dtype=float))
        if real and sim:
            errors.append(abs(math.log(sim / real)))
    return float(np.mean(errors)) if errors else math.inf


def _capacity_rps(cal: Calibration, rows: _ServiceRows) -> float:
    """max_batch / median service time (s) of the no_sync requests at a full batch and full pressure."""
    service_ms = (cal.prefill_ms(rows.prompt) + cal.decode_ms(rows.output)) * cal.batch_multiplier(
        float(cal.max_batch)) * cal.pressure_multiplier(1.0)
    median_s = float(np.median(service_ms)) / 1000.0
    return cal.max_batch / median_s if median_s > 0 else Calibration().capacity_rps


def fit_calibration_details(
    real: Sequence[ReplayRecord],
    base: Calibration | None = None,
    *,
    max_batch: int | None = None,
    batch_slowdown: float | None = None,
) -> CalibrationFit:
    """`fit_calibration` with its diagnostics (see the module docstring for the method).

    `max_batch`: the server's `--max-num-seqs` (None keeps `base.max_batch`).
    `batch_slowdown`: a number skips the search and holds it fixed.
    """
    base = base or Calibration()
    real = list(real)
    if not real:
        raise ValueError("no replays to fit the calibration to")
    twins = no_sync_records(real)
    mb = int(max_batch or base.max_batch)
    rows = _service_rows(list(twins.values()), mb)
    if rows.ttft_ms.size < MIN_SERVICE_ROWS:
        raise ValueError(
            f"only {rows.ttft_ms.size} no_sync requests with at most {mb} in flight: too few to fit the "
            f"service time (need {MIN_SERVICE_ROWS})"
        )
    x_joint, bs_joint, _ = _fit_service(rows, mb, None)
    merge_rows = _merge_rows(real, mb, bs_joint)
    if not merge_rows:
        raise ValueError(
            "no merge-active requests (unqueued in their replay and in no_sync) in the replays with merges: "
            "merge_slowdown cannot be fitted"
        )
    merge_slowdown = _fit_merge_slowdown(merge_rows)

    def calibration_for(bs: float) -> Calibration:
        x, _, sigma = _fit_service(rows, mb, bs)
        x = np.where(np.abs(x) < 1e-9, 0.0, x)  # a parameter pinned at its bound of 0 reads as 0, not 1e-18
        return base.model_copy(update=dict(
            base_ms=float(x[0]), prefill_ms_per_token=float(x[1]), decode_ms_per_token=float(x[2]),
            pressure_slowdown=float(x[3]), batch_slowdown=float(bs), residual_sigma=float(sigma),
            merge_slowdown=merge_slowdown, max_batch=mb, fitted=True,
        ))  # fmt: skip

    if batch_slowdown is None:
        lo, hi = BATCH_SLOWDOWN_BOUNDS
        grid = np.linspace(lo, hi, BATCH_SLOWDOWN_GRID)
        objective = [_p95_error(real, calibration_for(float(g))) for g in grid]
        i = int(np.argmin(objective))
        left, right = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        best = minimize_scalar(lambda b: _p95_error(real, calibration_for(float(b))), bounds=(left, right),
                               method="bounded", options={"xatol": 1e-3})
        bs, err = (float(best.x), float(best.fun)) if best.fun <= objective[i] else (float(grid[i]), objective[i])
    else:
        bs = float(batch_slowdown)
        err = _p95_error(real, calibration_for(bs))
    cal = calibration_for(bs)
    cal = cal.model_copy(update={"capacity_rps": _capacity_rps(cal, rows)})
    cal = Calibration.model_validate(cal.model_dump())  # re-validated: every field within its bounds
    diagnostics = {
        "n_replays": len(real),
        "n_no_sync_requests": rows.n_no_sync,
        "n_service_rows": int(rows.ttft_ms.size),
        "n_merge_active_rows": int(sum(len(r[1]) for r in merge_rows)),
        "merge_slowdown_median_ratio": _median_paired_ratio(real),
        "batch_slowdown_joint_fit": bs_joint,
        "pressure_slowdown_joint_fit": float(x_joint[3]),
        "p95_log_error_fit_set": err,
    }
    for rec in real:
        sim = _p95(simulate_record(rec, cal).results["e2e_ms"].to_numpy(dtype=float))
        real_p95 = _p95(rec.results["e2e_ms"].to_numpy(dtype=float)[_ok(rec.results)])
        diagnostics[f"p95_sim_over_real[{rec.name}]"] = _ratio(sim, real_p95)
    return CalibrationFit(cal, diagnostics)


def fit_calibration(
    real: Sequence[ReplayRecord],
    base: Calibration | None = None,
    *,
    max_batch: int | None = None,
    batch_slowdown: float | None = None,
) -> Calibration:
    """The simulator calibration fitted to real replays (`fitted=True`).

    `real` must hold each seed's no_sync replay and at least one replay with
    merge-active requests. `base` supplies what the data cannot (the shipped
    defaults when None); `max_batch` is the server's `--max-num-seqs`. See
    the module docstring for the equations and estimators.
    """
    return fit_calibration_details(real, base, max_batch=max_batch, batch_slowdown=batch_slowdown).calibration


# --------------------------------------------------------------------------- transfer and fidelity


def effect_size_transfer(
    real: Sequence[ReplayRecord], calibration: Calibration, high_pressure: float
) -> pd.DataFrame:
    """Per regime and mechanism metric: the real value, the simulated one (same inputs, wall time), their ratio.

    Columns `TRANSFER_COLUMNS`; metrics `TRANSFER_METRICS` (see the module
    docstring). `n_real` counts the real requests behind the real value.
    """
    rows = []
    for regime in sorted({r.regime for r in real}):
        recs = [r for r in real if r.regime == regime]
        sims = [simulate_record(r, calibration) for r in recs]
        real_m, sim_m = mechanism_ratios(recs, high_pressure), mechanism_ratios(sims, high_pressure)
        counts = {
            "sync_ratio_paired": _paired_groups(recs, "active")[0].size,
            "sync_ratio_unpaired": sum(len(r.results) for r in recs if r.has_merges),
            "control_ratio_paired": _paired_groups(recs, "inactive")[0].size,
            "pre_merge_ratio_paired": _paired_groups(recs, "pre_merge")[0].size,
            "pressure_ratio": sum(len(r.results) for r in recs if r.is_no_sync),
        }
        for metric in TRANSFER_METRICS:
            a, b = real_m[metric], sim_m[metric]
            rows.append({"regime": regime, "metric": metric, "real": a, "simulated": b,
                         "sim_over_real": _ratio(b, a), "n_real": counts[metric]})
    return pd.DataFrame(rows, columns=list(TRANSFER_COLUMNS))


def split_fit_held_out(records: Sequence[ReplayRecord]) -> tuple[list[ReplayRecord], list[ReplayRecord], str]:
    """(fit set, held-out set, rule): no_sync + controllers vs matched-random draws.

    Without both kinds of replays with merges, every second replay with merges
    (sorted by regime, seed, label) is held out. No_sync replays always stay
    in the fit set.
    """
    records = list(records)
    merges = sorted((r for r in records if not r.is_no_sync), key=lambda r: (r.regime, r.seed, r.label))
    drawn = [r for r in merges if r.schedule.source == "matched_random"]
    if drawn and len(drawn) < len(merges):
        held, rule = drawn, "fit on no_sync + controller replays, held out: matched-random draws"
    else:
        if len(merges) < 2:
            raise ValueError(
                f"held-out fidelity needs at least two replays with merges (have {len(merges)}): "
                "one to fit, one to predict"
            )
        held, rule = merges[1::2], "no controller/draw split available: every second replay with merges held out"
    held_ids = {id(r) for r in held}
    return [r for r in records if id(r) not in held_ids], held, rule


def _slo_for(record: ReplayRecord, twins: Mapping[tuple[str, int], ReplayRecord], multiplier: float) -> SloSpec:
    if record.slo is not None:
        return record.slo
    return derive_slo(twins[record.key].results, multiplier)


def predict_fidelity(
    held_out: Sequence[ReplayRecord],
    calibration: Calibration,
    *,
    no_sync: Mapping[tuple[str, int], ReplayRecord] | None = None,
    slo_multiplier: float = 1.5,
) -> pd.DataFrame:
    """Per replay: real vs simulated SLO violation rate (the replay's own SLO) and p95 E2E, and the errors.

    `slo_violation_rate_abs_err` is absolute (rate points); `p95_ms_rel_err` is relative to
    the real p95. Records without an `slo` use their seed's no_sync p95 times
    `slo_multiplier` (`no_sync` must then hold it).
    """
    rows = []
    for rec in held_out:
        slo = _slo_for(rec, no_sync or {}, slo_multiplier)
        sim = simulate_record(rec, calibration).results
        real_rate = float(violation_mask(rec.results, slo).mean())
        pred_rate = float(violation_mask(sim, slo).mean())
        real_p95 = _p95(rec.results["e2e_ms"].to_numpy(dtype=float)[_ok(rec.results)])
        pred_p95 = _p95(sim["e2e_ms"].to_numpy(dtype=float))
        rows.append({
            "regime": rec.regime, "seed": rec.seed, "policy": rec.schedule.policy, "draw": rec.schedule.draw,
            "source": rec.schedule.source, "label": rec.label, "n_requests": len(rec.results),
            "slo_violation_rate_real": real_rate, "slo_violation_rate_pred": pred_rate,
            "slo_violation_rate_abs_err": abs(pred_rate - real_rate),
            "p95_ms_real": real_p95, "p95_ms_pred": pred_p95,
            "p95_ms_rel_err": abs(pred_p95 - real_p95) / real_p95 if real_p95 and pred_p95 is not None else None,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=list(FIDELITY_COLUMNS)).astype({"draw": "Int64"})


@dataclass(frozen=True)
class Fidelity:
    """Held-out fidelity: the per-replay table, the error summary and the split used."""

    table: pd.DataFrame
    errors: dict[str, float]
    rule: str
    calibration: Calibration


def fidelity_errors(table: pd.DataFrame) -> dict[str, float]:
    """Mean and max of the per-replay errors: SLO rate (absolute), p95 (relative)."""
    out = {}
    for column, name in (("slo_violation_rate_abs_err", "slo_violation_rate_abs"), ("p95_ms_rel_err", "p95_rel")):
        values = table[column].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        out[f"{name}_mean"] = float(values.mean()) if values.size else math.nan
        out[f"{name}_max"] = float(values.max()) if values.size else math.nan
    return out


def held_out_fidelity(
    real: Sequence[ReplayRecord],
    base: Calibration | None = None,
    *,
    max_batch: int | None = None,
    slo_multiplier: float = 1.5,
) -> Fidelity:
    """Fit on the no_sync + controller replays, predict the held-out ones (see `split_fit_held_out`).

    Raises ValueError when the replays allow no split or the fit set no fit.
    """
    fit_set, held, rule = split_fit_held_out(real)
    calibration = fit_calibration(fit_set, base, max_batch=max_batch)
    table = predict_fidelity(held, calibration, no_sync=no_sync_records(real), slo_multiplier=slo_multiplier)
    return Fidelity(table, fidelity_errors(table), rule, calibration)


# --------------------------------------------------------------------------- stage


@dataclass(frozen=True)
class CalibrationResult:
    """What `calibrate_stage` computed and the files it wrote."""

    calibration: Calibration
    mechanism: MechanismEvidence
    transfer: pd.DataFrame
    fidelity: Fidelity
    diagnostics: dict[str, float | int | str | None]
    files: dict[str, Path]


def read_vllm_records(params: Params, root: Path) -> list[ReplayRecord]:
    """Every complete vLLM replay of `runs/replay-sets/vllm/index.csv` as a `ReplayRecord`."""
    root = Path(root)
    index_path = root / VLLM_INDEX
    if not index_path.is_file():
        why = (
            "replay.vllm.enabled is false in params.yaml, so the replay-vllm stage writes none; enable it and run it"
            if not params.replay.vllm.enabled
            else "run the replay-vllm stage first (`syncsafe replay run --backend vllm`)"
        )
        raise CalibrationInputError(f"{index_path}: no vLLM replays to calibrate against; {why}")
    index = pd.read_csv(index_path, dtype={"draw": "Int64"})
    if index.empty:
        raise CalibrationInputError(f"{index_path}: the vLLM replay index lists no replays; run the replay-vllm stage")
    require_columns(index, ("regime", "seed", "path", "schedule", "source"), str(index_path))
    cfg = params.replay.vllm
    records = []
    timelines: dict[tuple[str, int], pd.DataFrame] = {}
    for row in index.to_dict("records"):
        out = root / row["path"]
        summary_path, requests_path = out / "summary.json", out / "requests.parquet"
        for path in (requests_path, summary_path):
            if not path.is_file():
                raise CalibrationInputError(
                    f"{path}: missing (an incomplete vLLM replay); rerun the replay-vllm stage"
                )
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        regime, seed = str(row["regime"]), int(row["seed"])
        if (regime, seed) not in timelines:
            timelines[regime, seed] = load_timeline(root, regime, seed)
        schedule = read_schedule(root / row["schedule"])
        slo = SloSpec(**summary["slo"]) if summary.get("slo") else None
        records.append(ReplayRecord(
            regime=regime, seed=seed, label=_record_label(str(row["path"])), results=pd.read_parquet(requests_path),
            schedule=schedule, timeline=timelines[regime, seed],
            time_scale=float(summary.get("time_scale", cfg.time_scale)),
            max_trace_s=float(summary.get("max_trace_s", cfg.max_trace_s)), slo=slo,
        ))  # fmt: skip
    return records


def _record_label(path: str) -> str:
    """`fixed_h` or `matched_random/fixed_h-000` from runs/replay-sets/vllm/<regime>/seed-S/<label>."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part.startswith("seed-"):
            return "/".join(parts[i + 1:])
    return Path(path).name


def mechanism_evidence(transfer: pd.DataFrame, n_requests: Mapping[str, int]) -> tuple[MechanismEvidence, list[str]]:
    """MechanismEvidence from the real columns of a transfer table, and the regimes it had to leave out."""
    regimes, skipped = {}, []
    for regime, group in transfer.groupby("regime", sort=True):
        real = dict(zip(group["metric"], group["real"]))
        sync, pressure = real.get("sync_ratio_paired"), real.get("pressure_ratio")
        if not all(v is not None and np.isfinite(v) and v > 0 for v in (sync, pressure)):
            skipped.append(str(regime))
            continue
        drift = real.get("pre_merge_ratio_paired")
        drift = float(drift) if drift is not None and np.isfinite(drift) and drift > 0 else None
        regimes[str(regime)] = RegimeMechanism(sync_ratio=float(sync), pressure_ratio=float(pressure), backend="vllm",
                                               n_requests=int(n_requests[regime]), drift_ratio=drift)
    return MechanismEvidence(regimes=regimes), skipped


def _fmt(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_calibration_report(
    calibration: Calibration,
    diagnostics: Mapping[str, object],
    transfer: pd.DataFrame,
    fidelity: Fidelity,
    mechanism: MechanismEvidence,
    skipped: Sequence[str],
    replays: Sequence[str] = (),
) -> str:
    """The calibrate stage's report.md (`replays`: the names of the replays fitted on)."""
    fitted = [
        ("base_ms", calibration.base_ms), ("prefill_ms_per_token", calibration.prefill_ms_per_token),
        ("decode_ms_per_token", calibration.decode_ms_per_token), ("pressure_slowdown", calibration.pressure_slowdown),
        ("merge_slowdown", calibration.merge_slowdown), ("max_batch", calibration.max_batch),
        ("batch_slowdown", calibration.batch_slowdown), ("residual_sigma", calibration.residual_sigma),
        ("capacity_rps", calibration.capacity_rps),
    ]  # fmt: skip
    parts = [
        "# Calibration: simulator fitted to real vLLM replays",
        "",
        "Wall time throughout (trace time / `time_scale`); latencies in real ms. Fitted on all vLLM replays: "
        + ", ".join(f"`{name}`" for name in replays) + ".",
        "",
        "## Fitted parameters" if calibration.fitted else "## Not fitted: the shipped defaults stand",
        "",
        *([] if calibration.fitted else [f"The fit failed: {diagnostics.get('fit_error')}. More real data (a longer "
                                         "`replay.vllm.max_trace_s`, more seeds or draws) is needed.", ""]),
        markdown_table(["parameter", "value"], [(k, _fmt(float(v), 4)) for k, v in fitted]),
        "",
        "Fit diagnostics: " + ", ".join(f"{k} {_fmt(v)}" for k, v in diagnostics.items()) + ".",
        "",
        "## Effect-size transfer (real vLLM vs simulator on the same inputs)",
        "",
        "`sync_ratio_paired`: p95 E2E of merge-active requests / p95 of the same request ids in the seed's no_sync "
        "replay (the measure in mechanism.json). `sync_ratio_unpaired`: merge-active / inactive p95 within the "
        "replays (confounded by load). `control_ratio_paired`: merge-inactive requests / the same ids in no_sync "
        "(knock-on queueing or drift). `pre_merge_ratio_paired`: requests done before the replay's first merge "
        "window / the same ids in no_sync (no merge can reach them: ~1 unless the real replays drift). "
        "`pressure_ratio`: high / low inference pressure p95 in no_sync.",
        "",
        markdown_table(
            list(TRANSFER_COLUMNS),
            [(r.regime, r.metric, _fmt(r.real), _fmt(r.simulated), _fmt(r.sim_over_real), r.n_real)
             for r in transfer.itertuples(index=False)],
        ),
        "",
        "## Held-out fidelity",
        "",
        f"{fidelity.rule}. SLO of each replay: its own (summary.json). Errors: absolute for the violation rate, "
        "relative for p95.",
        "",
        markdown_table(
            ["regime", "seed", "replay", "SLO rate real", "SLO rate pred", "abs err", "p95 real ms", "p95 pred ms",
             "rel err"],
            [(r.regime, r.seed, r.label, _fmt(r.slo_violation_rate_real), _fmt(r.slo_violation_rate_pred),
              _fmt(r.slo_violation_rate_abs_err), _fmt(r.p95_ms_real, 4), _fmt(r.p95_ms_pred, 4),
              _fmt(r.p95_ms_rel_err))
             for r in fidelity.table.itertuples(index=False)],
        ) if len(fidelity.table) else "_No held-out replays._",
        "",
        "Mean errors: SLO violation rate {:s} (abs, max {:s}), p95 {:s} (rel, max {:s}).".format(
            _fmt(fidelity.errors["slo_violation_rate_abs_mean"]), _fmt(fidelity.errors["slo_violation_rate_abs_max"]),
            _fmt(fidelity.errors["p95_rel_mean"]), _fmt(fidelity.errors["p95_rel_max"])),
        "",
        "## Does the mechanism show on the real backend?",
        "",
    ]
    for regime in sorted(transfer["regime"].unique()):
        parts.append("- " + _verdict_sentence(regime, transfer, mechanism))
    for regime in skipped:
        parts.append(f"- {regime}: left out of mechanism.json (no merge-active or no high/low-pressure requests).")
    return "\n".join(parts) + "\n"


#: A paired control ratio above this flags replay-to-replay drift of the real backend.
DRIFT_THRESHOLD = 1.2


def _verdict_sentence(regime: str, transfer: pd.DataFrame, mechanism: MechanismEvidence) -> str:
    real = {m: (None if v is None or not np.isfinite(v) else float(v))
            for m, v in zip(*[transfer.loc[transfer["regime"] == regime, c] for c in ("metric", "real")])}
    paired, unpaired = real.get("sync_ratio_paired"), real.get("sync_ratio_unpaired")
    control, pre = real.get("control_ratio_paired"), real.get("pre_merge_ratio_paired")
    if regime not in mechanism.regimes:
        return f"{regime}: not measured."
    shows = mechanism.shows(regime)
    if mechanism.drifted(regime):
        outcome = "but the pre-merge control drifted, so the measurement licenses nothing"
    else:
        outcome = f"so by the protocol's measure the mechanism {'shows' if shows else 'does not show'} on vLLM"
    text = (
        f"{regime}: the paired sync ratio is {_fmt(paired)} (threshold {mechanism.sync_ratio_threshold:g}), "
        f"{outcome} (unpaired ratio {_fmt(unpaired)}, confounded by load)."
    )
    if pre is not None and mechanism.drifted(regime):
        text += (
            f" Requests that finished before any merge window opened are {_fmt(pre)}x slower (p95) than the same "
            "requests in no_sync (allowed: within "
            f"x{mechanism.max_drift:g}), so the real replays drift from run to run and the paired ratio does not "
            "isolate merge interference; rerun on a quiet machine or add seeds."
        )
    elif control is not None and control > DRIFT_THRESHOLD:
        text += (
            f" Merge-inactive requests are {_fmt(control)}x slower than in no_sync too (knock-on queueing or drift; "
            f"pre-merge control {_fmt(pre)})."
        )
    return text


def calibrate_stage(params: Params, root: Path = Path(".")) -> CalibrationResult:
    """Fit the simulator to the vLLM replays under `root` and write `runs/calibration/` (see the module docstring)."""
    root = Path(root)
    if not params.replay.vllm.enabled:
        return _write_unmeasured(root)
    records = read_vllm_records(params, root)
    mb = max_num_seqs(params.replay.vllm.server_args)
    base = Calibration()
    try:
        details = fit_calibration_details(records, base, max_batch=mb)
    except ValueError as err:  # too little real data to fit: keep the defaults and say so, licensing nothing new
        details = CalibrationFit(base, {"fit_error": str(err)})
    calibration = details.calibration
    high = params.replay.high_pressure
    transfer = effect_size_transfer(records, calibration, high)
    try:
        if not calibration.fitted:
            raise ValueError(f"no fit ({details.diagnostics['fit_error']})")
        fidelity = held_out_fidelity(records, base, max_batch=mb, slo_multiplier=params.replay.slo.multiplier)
    except ValueError as err:  # too few replays to hold any out: say so rather than fail the whole stage
        empty = pd.DataFrame(columns=list(FIDELITY_COLUMNS))
        fidelity = Fidelity(empty, fidelity_errors(empty), f"held-out fidelity not computed: {err}", calibration)
    n_requests = {regime: sum(len(r.results) for r in records if r.regime == regime) for regime in transfer["regime"]}
    mechanism, skipped = mechanism_evidence(transfer, n_requests)
    report = render_calibration_report(calibration, details.diagnostics, transfer, fidelity, mechanism, skipped,
                                       [r.name for r in records])
    return _write_set(root, calibration, mechanism, transfer, fidelity, report, details.diagnostics)


def _write_set(root: Path, calibration: Calibration, mechanism: MechanismEvidence, transfer: pd.DataFrame,
               fidelity: Fidelity, report: str, diagnostics: dict) -> CalibrationResult:
    """Swap the whole `runs/calibration/` set in at once."""
    texts = {
        CALIBRATION_FILE: calibration.model_dump_json(indent=2) + "\n",
        MECHANISM_FILE: mechanism.model_dump_json(indent=2) + "\n",
        REPORT_FILE: report,
    }

    def build(tmp: Path) -> None:
        for name, text in texts.items():
            io.write_text(tmp / name, text)
        io.write_csv(tmp / TRANSFER_FILE, transfer)
        io.write_csv(tmp / FIDELITY_FILE, fidelity.table)

    out = io.replace_directory(root / CALIBRATION_DIR, build)
    files = {name: out / name for name in (CALIBRATION_FILE, MECHANISM_FILE, TRANSFER_FILE, FIDELITY_FILE, REPORT_FILE)}
    return CalibrationResult(calibration, mechanism, transfer, fidelity, diagnostics, files)


def _write_unmeasured(root: Path) -> CalibrationResult:
    """replay.vllm.enabled is false: the shipped defaults, no mechanism evidence, and a report that says so."""
    calibration = Calibration()
    empty = pd.DataFrame(columns=list(FIDELITY_COLUMNS))
    fidelity = Fidelity(empty, fidelity_errors(empty), "no real replays", calibration)
    report = ("# Calibration\n\nreplay.vllm.enabled is false: nothing was replayed on a real server, so nothing "
              "was fitted (calibration.json holds the shipped defaults, `fitted: false`) and there is no mechanism "
              "evidence. Every verdict stays at *stress harness only*.\n")
    return _write_set(root, calibration, MechanismEvidence(regimes={}), pd.DataFrame(columns=list(TRANSFER_COLUMNS)),
                      fidelity, report, {})


__all__ = [
    "CalibrationFit",
    "CalibrationInputError",
    "CalibrationResult",
    "Fidelity",
    "ReplayRecord",
    "calibrate_stage",
    "effect_size_transfer",
    "fit_calibration",
    "fit_calibration_details",
    "held_out_fidelity",
    "max_num_seqs",
    "mechanism_ratios",
    "paired_control_ratio",
    "paired_sync_ratio",
    "predict_fidelity",
    "pressure_ratio",
    "read_vllm_records",
    "simulate_record",
    "split_fit_held_out",
    "unpaired_sync_ratio",
    "wall_inputs",
]
