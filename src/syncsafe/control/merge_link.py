"""How long a merge occupies the fleet on a given link: the all-reduce cost model, fitted to measurements.

A DiLoCo merge all-reduces the pseudo-gradient payload of `n` bytes across
`W` islands. A ring all-reduce sends (and receives) `2·n·(W−1)/W` bytes per
island over its link, in `2·(W−1)` steps, so on a link of `rate` bit/s with
a one-way delay `d`

    merge_s = fixed_s + 8 · 2·n·(W−1)/W / (efficiency · rate · (1 − network_pressure)) + 2·(W−1)·d

where `fixed_s` (the outer step, the copy, the collective's start-up) and
`efficiency` (the share of the link rate the collective achieves) are fitted
to merges measured on the fleet at several link rates
(`syncsafe.fleet.merge_probe`, `benchmarks/bench_merge_link.py`), and
`network_pressure` in [0, 1) is the share of the link other traffic takes at
the time (a regime's `network_pressure` signal). The calibrated policies price
a merge in proportion to how long it keeps the fleet busy
(`Calibration.expected_merge_cost` multiplies by `duration_factor`), instead of
treating every merge as equally long.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

#: Network pressure is capped here: a link that other traffic fills completely would make a merge endless.
MAX_NETWORK_PRESSURE = 0.95


def allreduce_bytes(payload_bytes: float, islands: int) -> float:
    """Bytes one island sends over its link in a ring all-reduce of `payload_bytes` across `islands`."""
    return 2.0 * payload_bytes * (islands - 1) / islands if islands > 1 else 0.0


def model_comm_s(payload_bytes: float, islands: int, rate_mbit: float | None, delay_ms: float = 0.0) -> float:
    """The cost model's communication time: the bytes at the link rate plus one delay per ring step."""
    if islands <= 1:
        return 0.0
    wire = 0.0 if rate_mbit is None else 8.0 * allreduce_bytes(payload_bytes, islands) / (rate_mbit * 1e6)
    return wire + 2.0 * (islands - 1) * delay_ms / 1e3


class LinkMeasurement(BaseModel):
    """Merges measured on one link setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_mbit: float | None
    delay_ms: float = 0.0
    merge_s: list[float]

    @property
    def median_s(self) -> float:
        return float(np.median(self.merge_s))


class MergeLink(BaseModel):
    """The fitted merge duration model of one fleet link (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    payload_bytes: Annotated[int, Field(gt=0)]
    islands: Annotated[int, Field(ge=2)]
    #: The link rate the fleet's merges see when nothing else uses the link, Mbit/s.
    link_mbit: Annotated[float, Field(gt=0)]
    delay_ms: Annotated[float, Field(ge=0)] = 0.0
    fixed_s: Annotated[float, Field(ge=0)]
    efficiency: Annotated[float, Field(gt=0)]
    #: What the fit was made from (kept with it as its evidence).
    measured: list[LinkMeasurement] = []

    def merge_s(self, network_pressure: float = 0.0) -> float:
        """Expected merge duration while other traffic takes `network_pressure` of the link."""
        free = 1.0 - min(max(float(network_pressure), 0.0), MAX_NETWORK_PRESSURE)
        rate = self.efficiency * self.link_mbit * free
        return self.fixed_s + model_comm_s(self.payload_bytes, self.islands, rate, self.delay_ms)

    def duration_factor(self, network_pressure: float) -> float:
        """How many times longer a merge takes at `network_pressure` than on a free link."""
        return self.merge_s(network_pressure) / self.merge_s(0.0)


def fit_merge_link(measurements: list[LinkMeasurement], payload_bytes: int, islands: int,
                   link_mbit: float, delay_ms: float = 0.0) -> MergeLink:
    """Least squares of the measured median merge time on the model's time on the wire, over the
    rate-limited settings: intercept = `fixed_s`, slope = 1 / `efficiency`. Needs two distinct rates."""
    limited = [m for m in measurements if m.rate_mbit is not None]
    if len({m.rate_mbit for m in limited}) < 2:
        raise ValueError(f"a merge link fit needs merges measured at two or more link rates "
                         f"(got {sorted({m.rate_mbit for m in limited})})")
    x = np.array([model_comm_s(payload_bytes, islands, m.rate_mbit, m.delay_ms) for m in limited])
    y = np.array([m.median_s for m in limited])
    from scipy import stats  # here, not at import: every stage that prices a merge imports this module

    fit = stats.linregress(x, y)
    if not fit.slope > 0:
        raise ValueError(f"merge time does not grow with the time on the wire (slope {fit.slope:.3g}): "
                         f"the link was not the bottleneck at these rates")
    return MergeLink(payload_bytes=payload_bytes, islands=islands, link_mbit=link_mbit, delay_ms=delay_ms,
                     fixed_s=max(float(fit.intercept), 0.0), efficiency=float(1.0 / fit.slope),
                     measured=list(measurements))
