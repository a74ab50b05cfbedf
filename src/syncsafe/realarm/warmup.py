"""Warm the real server until its decode pace stops falling, before anything is measured.

A vLLM CPU server speeds up over its first minutes (first requests hit cold
code paths, allocator and cache warm-up): on the 2-core machine the
per-token decode pace of identical no-merge loads fell from 3.9 to 2.3 ms
over one run, and one warm-up saw 8.3, 6.2, 5.4, 3.8, 4.0, 4.0 ms over its
first six probes, so whatever was replayed first met a slower server. The
warm-up sends the same slice of real load again and again (`probe`) and
measures each probe's **decode pace**: the median over its succeeded
requests of (E2E - TTFT) / (tokens received - 1), the server's time per
generated token after the first.

It stops once the pace has **stopped falling beyond its own scatter**: the
least-squares slope of log pace over the last `stable_probes` probes is not
negative at one-sided level `alpha` (`scipy.stats.linregress`), or when
`max_s` wall seconds are spent. A fixed band (the last probes within 5 % of
each other) judged the wrong thing: a settled server's probes wander 10-20 %
from one to the next on 2 cores, so that band was almost never met and every
warm-up ran out its 90 s. The trend test stops a settled server in a few
probes and keeps warming one still speeding up by more than its scatter; a
slow residual drift below that is what the controls' drift test
(`realarm.evidence.controls_drift`) catches in the replays. What the warm-up
saw (`WarmupRecord`) goes to the plan, so a run that never settled says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy import stats

from syncsafe.serving.metrics import failed_mask


class WarmupRecord(BaseModel):
    """What the warm-up measured: every probe's decode pace (ms/token) and whether it had stopped falling."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paces_ms: list[float | None] = Field(default_factory=list)
    stable: bool = False
    alpha: float = Field(default=0.1, gt=0, lt=1)
    stable_probes: int = Field(default=5, ge=2)
    #: One-sided p of a falling pace over the last `stable_probes` probes (None: too few measured).
    trend_p: float | None = None
    wall_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """Records written by the band rule (a `tolerance`, its `stable` that band's verdict) still read."""
        if isinstance(data, dict) and "tolerance" in data:
            data = {k: v for k, v in data.items() if k != "tolerance"}
        return data

    def describe(self) -> str:
        shown = ", ".join("-" if p is None else f"{p:.2f}" for p in self.paces_ms)
        trend = "" if self.trend_p is None else f" (falling-pace p {self.trend_p:.2f})"
        verdict = (f"stopped falling over the last {self.stable_probes}{trend}" if self.stable
                   else f"still falling{trend} when the warm-up ran out")
        return f"warm-up: {len(self.paces_ms)} probes in {self.wall_s:.0f} s, decode pace [{shown}] ms/token, {verdict}"


def decode_pace_ms(rows: pd.DataFrame) -> float | None:
    """Median (E2E - TTFT) / (tokens received - 1) of the succeeded requests with two tokens or more."""
    if rows.empty:
        return None
    ok = rows[~failed_mask(rows)]
    tokens = ok["output_tokens_received"].to_numpy(dtype=float)
    decode = ok["e2e_ms"].to_numpy(dtype=float) - ok["ttft_ms"].to_numpy(dtype=float)
    keep = (tokens > 1) & np.isfinite(decode)
    return float(np.median(decode[keep] / (tokens[keep] - 1))) if keep.any() else None


def falling_pace_p(paces: Sequence[float | None], stable_probes: int) -> float | None:
    """One-sided p that the pace falls over the last `stable_probes` probes (slope of log pace on the probe's
    index, `scipy.stats.linregress`); None when fewer are measured. Identical paces give 1 (nothing falls)."""
    last = list(paces[-stable_probes:])
    if len(last) < stable_probes or any(p is None or p <= 0 for p in last):
        return None
    logs = np.log(np.asarray(last, dtype=float))
    if np.ptp(logs) == 0:
        return 1.0
    return float(stats.linregress(np.arange(logs.size), logs, alternative="less").pvalue)


def pace_is_stable(paces: Sequence[float | None], alpha: float, stable_probes: int) -> bool:
    """True when the last `stable_probes` paces are all measured and show no falling trend at level `alpha`."""
    p = falling_pace_p(paces, stable_probes)
    return p is not None and p >= alpha


def warm_until_stable(probe: Callable[[], pd.DataFrame], alpha: float, stable_probes: int, max_s: float,
                      clock: Callable[[], float] = time.monotonic) -> WarmupRecord:
    """Run `probe` until its decode pace stops falling or `max_s` wall seconds are spent (see the module
    docstring). At least `stable_probes` probes run, so a stable verdict always rests on that many."""
    began = clock()
    paces: list[float | None] = []
    while True:
        paces.append(decode_pace_ms(probe()))
        trend_p = falling_pace_p(paces, stable_probes)
        stable = trend_p is not None and trend_p >= alpha
        if stable or (clock() - began >= max_s and len(paces) >= stable_probes):
            return WarmupRecord(paces_ms=paces, stable=stable, alpha=alpha, stable_probes=stable_probes,
                                trend_p=trend_p, wall_s=clock() - began)
