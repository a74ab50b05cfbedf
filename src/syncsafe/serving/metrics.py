"""Per-request replay results and their summary, shared by every serving backend.

A replay (simulator or vLLM) writes one row per request with the columns in
`REQUEST_RESULT_COLUMNS`:

- `request_id`: position of the request in the seed's request table;
- `arrival_s`, `send_s`: trace second the request arrives / was actually sent;
- `prompt_tokens`, `output_tokens`: the request as asked;
- `ttft_ms`, `e2e_ms`: time to first token and end-to-end latency from the
  request's scheduled arrival (`arrival_s`): a late send is charged to the
  request, never hidden;
- `output_tokens_received`: tokens actually streamed back;
- `merge_active`: the request's life overlaps a merge window (see the backend);
- `inference_pressure`: the timeline's inference pressure at arrival;
- `error`: empty string when the request succeeded, else what went wrong.

`summarize` turns that table into a `ReplaySummary` against an `SloSpec`.
Rules: a request *fails* when `error` is non-empty; a request *violates* the
SLO when it failed, or when a set threshold is exceeded (`ttft_ms >
slo.ttft_ms`, `e2e_ms > slo.e2e_ms`; a missing latency counts as exceeded).
Failed requests stay in the denominator of every rate: they are never
dropped. Latency percentiles and the p95 ratios use the succeeded requests
only (a failed request has no latency to rank). The replay span runs from the
first send to the last completion (a failed request ends at its send, or at
`send_s + e2e_ms` when it reports a latency).

`replay_validity` judges whether a real-backend replay measured what it
claims: too many failed requests, or a load generator that could not send on
time (send-lag p99), make it invalid (`valid: false` in its summary and in the
replay index); an invalid replay licenses nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

REQUEST_RESULT_COLUMNS = (
    "request_id",
    "arrival_s",
    "send_s",
    "prompt_tokens",
    "output_tokens",
    "ttft_ms",
    "e2e_ms",
    "output_tokens_received",
    "merge_active",
    "inference_pressure",
    "error",
)
SUMMARY_PERCENTILES = (50, 95, 99)


class SloSpec(BaseModel):
    """Serving SLO: a request meets it when every set latency bound holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _at_least_one_bound(self) -> SloSpec:
        if self.ttft_ms is None and self.e2e_ms is None:
            raise ValueError("an SLO needs ttft_ms or e2e_ms (or both)")
        return self


class ReplaySummary(BaseModel):
    """Latency, SLO and throughput figures of one replay.

    Percentiles and ratios are None when no succeeded request backs them
    (e.g. `sync_ratio_unpaired` of a no-sync replay, which has no merge-active group).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_requests: int = Field(ge=0)
    n_failed: int = Field(ge=0)
    slo_violation_rate: float = Field(ge=0, le=1)
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p95_ms: float | None
    e2e_p99_ms: float | None
    #: p95 E2E of merge-active requests / p95 E2E of the others in the same replay (unpaired: the groups
    #: are different requests under different load; the paired ratio is `analysis.calibration.mechanism`'s).
    sync_ratio_unpaired: float | None
    #: p95 E2E at inference pressure >= the threshold / below it.
    pressure_ratio: float | None
    high_pressure_threshold: float
    #: Output tokens received per second of replay span.
    tokens_per_s: float | None
    #: Requests meeting the SLO per second of replay span.
    goodput_rps: float | None
    requests_during_merges: int = Field(ge=0)
    span_s: float = Field(ge=0)

    def index_fields(self) -> dict[str, float | int | None]:
        """The replay-index columns this summary fills (p95/p99 are E2E)."""
        return {
            "slo_violation_rate": self.slo_violation_rate,
            "p95_ms": self.e2e_p95_ms,
            "p99_ms": self.e2e_p99_ms,
            "n_requests": self.n_requests,
            "n_failed": self.n_failed,
            "tokens_per_s": self.tokens_per_s,
            "requests_during_merges": self.requests_during_merges,
        }


def require_columns(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise ValueError naming every column of `columns` that `df` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what}: missing column(s) {', '.join(repr(c) for c in missing)}; found {list(df.columns)}"
        )


def failed_mask(results: pd.DataFrame) -> np.ndarray:
    """True for each request whose `error` is non-empty (NA counts as no error)."""
    return results["error"].fillna("").astype(str).to_numpy() != ""


def violation_mask(results: pd.DataFrame, slo: SloSpec) -> np.ndarray:
    """True for each request that failed or exceeded a set SLO bound."""
    violates = failed_mask(results)
    for column, bound in (("ttft_ms", slo.ttft_ms), ("e2e_ms", slo.e2e_ms)):
        if bound is not None:
            latency = results[column].to_numpy(dtype=float)
            violates |= ~(latency <= bound)  # NaN latency: not shown to meet the bound
    return violates


def summarize(results: pd.DataFrame, slo: SloSpec, high_pressure_threshold: float) -> ReplaySummary:
    """Summarize a per-request replay table (see the module docstring for the rules)."""
    require_columns(results, REQUEST_RESULT_COLUMNS, "per-request replay table")
    if results.empty:
        raise ValueError("per-request replay table has no rows: nothing to summarize")
    if not math.isfinite(high_pressure_threshold):
        raise ValueError(f"high_pressure_threshold must be finite (got {high_pressure_threshold})")
    failed = failed_mask(results)
    violates = violation_mask(results, slo)
    ok = ~failed
    ttft = results["ttft_ms"].to_numpy(dtype=float)
    e2e = results["e2e_ms"].to_numpy(dtype=float)
    merge_active = results["merge_active"].to_numpy(dtype=bool)
    high_pressure = results["inference_pressure"].to_numpy(dtype=float) >= high_pressure_threshold
    span = replay_span_s(results)
    tokens = float(results["output_tokens_received"].to_numpy(dtype=float).sum())
    return ReplaySummary(
        n_requests=len(results),
        n_failed=int(failed.sum()),
        slo_violation_rate=float(violates.mean()),
        **_percentiles("ttft", ttft[ok]),
        **_percentiles("e2e", e2e[ok]),
        sync_ratio_unpaired=p95_ratio(e2e[ok & merge_active], e2e[ok & ~merge_active]),
        pressure_ratio=p95_ratio(e2e[ok & high_pressure], e2e[ok & ~high_pressure]),
        high_pressure_threshold=high_pressure_threshold,
        tokens_per_s=_per_second(tokens, span),
        goodput_rps=_per_second(float((~violates).sum()), span),
        requests_during_merges=int(merge_active.sum()),
        span_s=span,
    )


def replay_validity(results: pd.DataFrame, max_failure_rate: float, max_send_lag_p99_ms: float,
                    other_reasons: Iterable[str] = ()) -> dict:
    """`valid`, `invalid_reason`, `failure_rate` and `send_lag_p99_ms` of a replay (see the module docstring).

    A table without `send_lag_ms` (the simulator sends on time by construction) is judged on failures only;
    `other_reasons` (a busy machine, a failing scraper) make it invalid too.
    """
    require_columns(results, ("error",), "per-request replay table")
    if results.empty:
        return {"valid": False, "invalid_reason": "no requests", "failure_rate": None, "send_lag_p99_ms": None}
    failure_rate = float(failed_mask(results).mean())
    lag = results["send_lag_ms"].to_numpy(dtype=float) if "send_lag_ms" in results.columns else np.array([])
    lag_p99 = _quantiles_ms(lag, (99,))[0]
    reasons = list(other_reasons)
    if failure_rate > max_failure_rate:
        reasons.append(f"failure rate {failure_rate:.3f} > max_failure_rate {max_failure_rate}")
    if lag_p99 is not None and lag_p99 > max_send_lag_p99_ms:
        reasons.append(f"send lag p99 {lag_p99:.0f} ms > max_send_lag_p99_ms {max_send_lag_p99_ms:.0f}")
    return {"valid": not reasons, "invalid_reason": "; ".join(reasons), "failure_rate": failure_rate,
            "send_lag_p99_ms": lag_p99}


def derive_slo(no_sync_results: pd.DataFrame, multiplier: float) -> SloSpec:
    """The SLO a seed is judged by: its no-sync replay's p95 TTFT and E2E × `multiplier`."""
    require_columns(no_sync_results, ("ttft_ms", "e2e_ms", "error"), "no-sync replay table")
    if not (math.isfinite(multiplier) and multiplier > 0):
        raise ValueError(f"SLO multiplier must be a positive number (got {multiplier})")
    ok = no_sync_results[~failed_mask(no_sync_results)]
    bounds = {column: _p95(ok[column].to_numpy(dtype=float)) for column in ("ttft_ms", "e2e_ms")}
    for column, p95 in bounds.items():
        if p95 is None:
            raise ValueError(f"no-sync replay table has no succeeded request with a {column} to derive an SLO from")
    return SloSpec(**{column: p95 * multiplier for column, p95 in bounds.items()})


def replay_span_s(results: pd.DataFrame) -> float:
    """Seconds from the first send to the last completion."""
    send = results["send_s"].to_numpy(dtype=float)
    e2e_s = results["e2e_ms"].to_numpy(dtype=float) / 1000.0
    end = np.where(np.isfinite(e2e_s), send + e2e_s, send)
    return float(end.max() - send.min())


def p95_ratio(numerator_ms: np.ndarray, denominator_ms: np.ndarray) -> float | None:
    """p95 of one latency group over another's; None when either group is empty."""
    top, bottom = _p95(numerator_ms), _p95(denominator_ms)
    if top is None or bottom is None or bottom <= 0:
        return None
    return top / bottom


def _p95(values_ms: np.ndarray) -> float | None:
    return _quantiles_ms(values_ms, (95,))[0]


def p95_of_resamples(values_ms: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """p95 of each resample of the finite `values_ms`, where resample r holds value i `taken[r, i]` times:
    equal to `np.percentile(np.repeat(values_ms, taken[r]), 95)` (its linear method, same arithmetic), NaN
    for a resample that holds nothing. Every resample at once: the two order statistics the linear method
    reads are where the resample's cumulative counts over the sorted values pass their ranks (the gate's
    block bootstrap evaluates thousands of resamples per plan). `values_ms` is 1-D (one sort serves every
    resample) or one row of values per resample (2-D, as `taken`: the gate's resamples with replay-level
    shocks)."""
    n = taken.sum(axis=1)
    index = (n - 1) * 0.95
    lo = np.floor(index).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    gamma = index - lo
    if values_ms.ndim == 1:
        order = np.argsort(values_ms, kind="stable")
        cum = np.cumsum(taken[:, order], axis=1)
        ranked = np.broadcast_to(values_ms[order], taken.shape)
    else:
        order = np.argsort(values_ms, axis=1, kind="stable")
        cum = np.cumsum(np.take_along_axis(taken, order, axis=1), axis=1)
        ranked = np.take_along_axis(values_ms, order, axis=1)
    last = taken.shape[1] - 1
    a = np.take_along_axis(ranked, np.minimum((cum <= lo[:, None]).sum(axis=1), last)[:, None], axis=1)[:, 0]
    b = np.take_along_axis(ranked, np.minimum((cum <= hi[:, None]).sum(axis=1), last)[:, None], axis=1)[:, 0]
    diff = b - a
    p95 = np.where(gamma >= 0.5, b - diff * (1.0 - gamma), a + diff * gamma)
    return np.where(n > 0, p95, np.nan)


def _percentiles(prefix: str, values_ms: np.ndarray) -> dict[str, float | None]:
    """`{prefix}_p50_ms`, `_p95_ms`, `_p99_ms` of the finite values."""
    return {f"{prefix}_p{q}_ms": v for q, v in zip(SUMMARY_PERCENTILES, _quantiles_ms(values_ms, SUMMARY_PERCENTILES))}


def _quantiles_ms(values_ms: np.ndarray, percentiles: tuple[int, ...]) -> tuple[float | None, ...]:
    """The percentiles of the finite values; all None when there are none."""
    finite = values_ms[np.isfinite(values_ms)]
    if finite.size == 0:
        return (None,) * len(percentiles)
    return tuple(float(v) for v in np.percentile(finite, percentiles))


def _per_second(amount: float, span_s: float) -> float | None:
    return amount / span_s if span_s > 0 else None
