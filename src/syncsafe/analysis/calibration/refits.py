"""The calibration's own run-to-run variation: refits on the fit seeds' replays shocked at the server's wander.

A calibration is fitted to the fit seeds' real replays, and those are draws
of a server whose pace wanders from replay to replay as much as the held-out
ones do. Two cold runs of one plan therefore fit different calibrations
(fitted `iter_base_ms` 2.30, 3.48 and 3.43 ms in three runs of the cpu
default) and predict different held-out p95s for the same schedule (569,
539 and 427 ms): the simulated side of every fidelity figure moves between
runs by the fit's own noise, which bounds that shock the held-out replays
alone (`fidelity_bounds`) do not carry, so a figure of one run can fall
outside another run's bounds although nothing but the server's wander
differs.

`refit_calibrations` measures that variation the way the held-out bounds
measure theirs: each of `n` refits takes a replay-level sd from the
controls' pooled variance's spread (`ReplayNoise.draw_sd`), multiplies every
fit replay's latencies by its own log-normal shock (`shocked`) and fits
again with the same procedure. The calibrate-fit stage writes them
(`CalibrationRefits`, refits.json); the fidelity stage simulates every
held-out replay with each, and draw d of its bounds takes refit d mod n for
the simulated side while it shocks the real side (`fidelity_bounds`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from syncsafe.analysis.calibration.records import ReplayRecord
from syncsafe.control.serving_model import Calibration
from syncsafe.realarm.gate import ReplayNoise

#: The per-request latency columns a replay-level shock multiplies (decode pace is (E2E - TTFT) / tokens).
LATENCY_COLUMNS = ("ttft_ms", "e2e_ms")


class CalibrationRefits(BaseModel):
    """refits.json: the calibrations refitted on shocked fit replays, and the wander that shocked them; none
    (and `reason` why) when there was no fit or no wander estimate to refit with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replay_sd: float | None = Field(default=None, ge=0)
    replay_sd_df: int | None = Field(default=None, ge=1)
    seed: int = 0
    calibrations: list[Calibration] = Field(default_factory=list)
    reason: str | None = None
    #: Refits whose fit raised (too little data after the shock); they are left out of `calibrations`.
    failed: int = Field(default=0, ge=0)
    wall_s: float = Field(default=0.0, ge=0)


def shocked(record: ReplayRecord, log_shock: float) -> ReplayRecord:
    """`record` with every request's latencies multiplied by exp(`log_shock`): the same replay on a server that
    ran uniformly faster or slower."""
    factor = float(np.exp(log_shock))
    results = record.results.assign(**{c: record.results[c] * factor for c in LATENCY_COLUMNS})
    return dataclasses.replace(record, results=results)


def refit_calibrations(records: Sequence[ReplayRecord], fit: Callable[[list[ReplayRecord]], Calibration],
                       noise: ReplayNoise, n: int, seed: int) -> CalibrationRefits:
    """`n` refits (`fit` on the shocked `records`), each with its own replay-level sd and per-replay shocks."""
    rng = np.random.default_rng([seed, 0x4EF17])
    sds = noise.draw_sd(rng, n)
    calibrations, failed = [], 0
    bar = tqdm(range(n), desc="calibrate fit: refits", unit="fit", leave=False, disable=n == 0)
    with bar:
        for k in bar:
            shocks = sds[k] * rng.standard_normal(len(records))
            try:
                calibrations.append(fit([shocked(r, s) for r, s in zip(records, shocks)]))
            except ValueError:
                failed += 1
        wall_s = bar.format_dict["elapsed"]
    return CalibrationRefits(replay_sd=noise.sd, replay_sd_df=noise.df, seed=seed, calibrations=calibrations,
                             failed=failed, wall_s=wall_s)


__all__ = ["LATENCY_COLUMNS", "CalibrationRefits", "refit_calibrations", "shocked"]
