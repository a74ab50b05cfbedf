"""Warm the real server until its decode pace is stable, before anything is measured.

A vLLM CPU server speeds up over its first minutes (first requests hit cold
code paths, allocator and cache warm-up): on the 2-core machine the
per-token decode pace of identical no-merge loads fell from 3.9 to 2.3 ms
over one run, so whatever was replayed first met a slower server. The
warm-up sends the same slice of real load again and again (`probe`) and
measures each probe's **decode pace**: the median over its succeeded
requests of (E2E - TTFT) / (tokens received - 1), the server's time per
generated token after the first. It stops once the last `stable_probes`
paces lie within `tolerance` of each other ((max - min) / median), or when
`max_s` wall seconds are spent; what it saw (`WarmupRecord`) goes to the
plan, so a run that never settled says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from syncsafe.serving.metrics import failed_mask


class WarmupRecord(BaseModel):
    """What the warm-up measured: every probe's decode pace (ms/token) and whether the last ones agreed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paces_ms: list[float | None] = Field(default_factory=list)
    stable: bool = False
    tolerance: float = Field(default=0.05, ge=0)
    stable_probes: int = Field(default=3, ge=2)
    wall_s: float = Field(default=0.0, ge=0)

    def describe(self) -> str:
        shown = ", ".join("-" if p is None else f"{p:.2f}" for p in self.paces_ms)
        verdict = (f"stable within {self.tolerance:.0%} over the last {self.stable_probes}" if self.stable
                   else f"NOT stable within {self.tolerance:.0%} when the warm-up ran out")
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


def pace_is_stable(paces: Sequence[float | None], tolerance: float, stable_probes: int) -> bool:
    """True when the last `stable_probes` paces are all measured and within `tolerance` of each other."""
    last = list(paces[-stable_probes:])
    if len(last) < stable_probes or any(p is None for p in last):
        return False
    values = np.asarray(last, dtype=float)
    return bool((values.max() - values.min()) / np.median(values) <= tolerance)


def warm_until_stable(probe: Callable[[], pd.DataFrame], tolerance: float, stable_probes: int, max_s: float,
                      clock: Callable[[], float] = time.monotonic) -> WarmupRecord:
    """Run `probe` until its decode pace is stable or `max_s` wall seconds are spent (see the module docstring).
    At least `stable_probes` probes run, so a stable verdict always rests on that many."""
    began = clock()
    paces: list[float | None] = []
    while True:
        paces.append(decode_pace_ms(probe()))
        stable = pace_is_stable(paces, tolerance, stable_probes)
        if stable or (clock() - began >= max_s and len(paces) >= stable_probes):
            return WarmupRecord(paces_ms=paces, stable=stable, tolerance=tolerance, stable_probes=stable_probes,
                                wall_s=clock() - began)
