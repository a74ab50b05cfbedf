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
fit replay's latencies by its own log-normal shock (`shocked`) and the
engine profile's by one more (`shocked_profile`: the profile is a server
session of its own, and its iteration costs are the fit's prior), and fits
again with the same procedure. The calibrate-fit stage writes them
(`CalibrationRefits`, refits.json); the fidelity stage simulates every
held-out replay with each, and draw d of its bounds takes refit d mod n for
the simulated side while it shocks the real side (`fidelity_bounds`).

What it does not carry: a shift shared by every replay of one server
session beyond the controls' within-seed wander (the controls measure the
wander inside a session only), so a rerun whose whole session ran slower
can still fall outside; the shocks are per replay, so the fit's level moves
by about sd / sqrt(fit replays), not by sd.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from syncsafe.analysis.calibration.records import ReplayRecord
from syncsafe.control.serving_model import Calibration
from syncsafe.realarm.engine_profile import ServerProfile
from syncsafe.realarm.gate import ReplayNoise

#: The per-request latency columns a replay-level shock multiplies (decode pace is (E2E - TTFT) / tokens).
LATENCY_COLUMNS = ("ttft_ms", "e2e_ms")
#: The latencies of an engine-profile probe row a profile-level shock multiplies.
PROFILE_LATENCIES = ("itl_ms", "prefill_ms", "ttft_ms")


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


def shocked(record: ReplayRecord, log_shock: float) -> ReplayRecord:
    """`record` with every request's latencies multiplied by exp(`log_shock`): the same replay on a server that
    ran uniformly faster or slower."""
    factor = float(np.exp(log_shock))
    results = record.results.assign(**{c: record.results[c] * factor for c in LATENCY_COLUMNS})
    return dataclasses.replace(record, results=results)


def shocked_profile(profile: ServerProfile | None, log_shock: float) -> ServerProfile | None:
    """`profile` with every probe's latencies (inter-token, prefill, TTFT) multiplied by exp(`log_shock`)."""
    if profile is None:
        return None
    factor = float(np.exp(log_shock))

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * factor

    rows = [row.model_copy(update={c: scaled(getattr(row, c)) for c in PROFILE_LATENCIES}) for row in profile.rows]
    return profile.model_copy(update={"rows": rows})


Fit = Callable[[list[ReplayRecord], ServerProfile | None], Calibration]


def refit_calibrations(records: Sequence[ReplayRecord], profile: ServerProfile | None, fit: Fit,
                       noise: ReplayNoise, n: int, seed: int) -> CalibrationRefits:
    """`n` refits (`fit` on the shocked `records` and `profile`), each with its own replay-level sd, a shock per
    replay and one for the profile."""
    rng = np.random.default_rng([seed, 0x4EF17])
    sds = noise.draw_sd(rng, n)
    calibrations, failed = [], 0
    for k in tqdm(range(n), desc="calibrate fit: refits", unit="fit", leave=False, disable=n == 0):
        shocks = sds[k] * rng.standard_normal(len(records) + 1)
        try:
            calibrations.append(fit([shocked(r, s) for r, s in zip(records, shocks)],
                                    shocked_profile(profile, float(shocks[-1]))))
        except ValueError:
            failed += 1
    return CalibrationRefits(replay_sd=noise.sd, replay_sd_df=noise.df, seed=seed, calibrations=calibrations,
                             failed=failed)


__all__ = ["LATENCY_COLUMNS", "PROFILE_LATENCIES", "CalibrationRefits", "Fit", "refit_calibrations", "shocked",
           "shocked_profile"]
