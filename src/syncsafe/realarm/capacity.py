"""How much load the real server takes, and the replay's load declared as a share of it.

**Capacity** (`search_capacity`): open-loop probes of Poisson arrivals at a
fixed rate (wall requests per second), `probe_s` long and lengthened at
low rates to hold `MIN_PROBE_REQUESTS` requests (a p95 needs a count, not a
duration: 2 s at a light rate used to be three requests), with the regime's own
token mix (prompt and output lengths drawn, seeded, from its request
tables). The first probe, at a light rate, sets the reference TTFT p95; a
rate is *sustained* when its TTFT p95 stays within `ttft_factor` times that
reference and no request fails. A probe that is not sustained is retried
once with other arrivals, and the rate fails only when the retry fails too
(`holds`): two cold profiles of the same server and token mix measured 49.7
and 93 requests/s. Rates rise geometrically until one is not sustained, then
two bisection steps narrow the knee. One probe is noisy, so the knee is then
confirmed (`confirm_capacity`): the rate is probed `repeats` more times with
other arrivals (each with its retry), and stepped down by GROWTH ** 0.5 until
every repeat holds. The capacity is that lower bound.

**Check** (`check_capacity`): a pinned plan needs the capacity only to be
at least its busiest window's rate over the target utilisation; that rate
is confirmed directly (the light probe for the TTFT bound, then the
confirmation's repeats), and the full search runs only when it does not
hold, to name what the machine holds. About 30 s of probes instead of four
minutes of search on a machine that holds the plan.

**Load scale** (`load_scale`): the regime's busiest window (`window_s` trace
seconds of arrivals, over every seed of its request tables) has
`peak_rate` requests per trace second. Replaying trace time `time_scale`
times faster than wall time puts it at `peak_rate * time_scale` requests per
wall second, so `time_scale = target_utilisation * capacity / peak_rate`
sets the busiest window at the declared utilisation of the measured
capacity, rounded *down* onto a coarse grid (`TIME_SCALE_GRID`, steps of
at most 1.33x). Measured capacities of machines of one kind differ by 2x,
so a sized time scale does not reproduce across machines: the default
plan pins it (`replay.vllm.time_scale`) and the profile only checks it. A
pinned time scale that puts the busiest window over `target_utilisation`
of the measured capacity is refused (`LoadError`, one line naming the
largest time scale the machine holds): an overloaded queue, not merges,
would decide the SLO.

**Noise floor** (`noise_probe`): the same probe at the replay's busiest
rate, sent twice (same arrivals, same prompts, no merge; each at least
`MIN_PROBE_REQUESTS` long): per request the
log ratio of the two E2E latencies. Its spread is the per-request noise
the gate's power estimate assumes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from syncsafe import timebase
from syncsafe.errors import BadInput
from syncsafe.serving.metrics import failed_mask

#: Light-load probe as a share of the first capacity guess, growth per step and bisection steps.
LIGHT_SHARE = 0.1
GROWTH = 1.5
BISECTIONS = 2
MAX_PROBES = 24  # rates probed, retries included
#: Confirmation probes at the knee and step-downs allowed before the capacity is the light rate.
CONFIRM_REPEATS = 2
MAX_STEP_DOWNS = 6
#: Seed offset of a failed probe's retry (other arrivals, same rate and mix).
RETRY_SEED = 104729
#: Expected requests of the shortest probe: a probe at a low rate runs longer than `probe_s` to hold them.
MIN_PROBE_REQUESTS = 30
#: Mantissas of the coarse time-scale grid (times powers of ten).
TIME_SCALE_GRID = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)

#: Sends one open-loop request table at an epoch of `syncsafe.timebase`; returns the load generator's rows.
Sender = Callable[[pd.DataFrame, float], pd.DataFrame]


class LoadError(BadInput):
    """The declared load does not fit the measured server (one line naming the regime)."""


class CapacityProbe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_rps: float = Field(gt=0)
    n_requests: int = Field(ge=0)
    ttft_p95_ms: float | None
    failure_rate: float = Field(ge=0, le=1)
    sustained: bool


class RegimeLoad(BaseModel):
    """A regime's measured capacity and the time scale that sets its replay's load (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regime: str
    capacity_rps: float = Field(gt=0)
    ttft_bound_ms: float = Field(gt=0)
    probes: list[CapacityProbe]
    #: Busiest and median `window_s`-long window of arrivals over all seeds, requests per trace second.
    peak_rate: float = Field(gt=0)
    median_rate: float = Field(ge=0)
    window_s: float = Field(gt=0)
    time_scale: float = Field(gt=0)
    #: `time_scale` came from params rather than from the target utilisation.
    time_scale_fixed: bool = False
    target_utilisation: float = Field(gt=0, le=1)
    #: Busiest window's and median window's wall rate as a share of the capacity.
    utilisation: float = Field(gt=0)
    median_utilisation: float = Field(ge=0)
    #: Per-request log E2E ratio of two identical no-merge probes at the busiest rate.
    noise_log_ratios: list[float] = Field(default_factory=list)

    @property
    def noise_sd(self) -> float | None:
        return float(np.std(self.noise_log_ratios, ddof=1)) if len(self.noise_log_ratios) > 1 else None


def token_mix(requests: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The (prompt, output) token pairs of a regime's request tables, pooled."""
    frames = [r[["prompt_tokens", "output_tokens"]] for r in requests if len(r)]
    if not frames:
        raise LoadError("no requests to take a token mix from")
    return pd.concat(frames, ignore_index=True)


def poisson_requests(rate_rps: float, duration_s: float, mix: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Poisson arrivals at `rate_rps` over `duration_s` (wall seconds), token pairs drawn from `mix` (seeded)."""
    rng = np.random.default_rng([seed, int(round(rate_rps * 1000)), 0xCA9])
    n = max(int(rng.poisson(rate_rps * duration_s)), 1)
    arrival = np.sort(rng.uniform(0.0, duration_s, n))
    pick = rng.integers(0, len(mix), n)
    return pd.DataFrame({"arrival_s": arrival, "prompt_tokens": mix["prompt_tokens"].to_numpy()[pick],
                         "output_tokens": mix["output_tokens"].to_numpy()[pick]})


def _ttft_p95(rows: pd.DataFrame) -> float | None:
    ok = rows[~failed_mask(rows)]["ttft_ms"].to_numpy(dtype=float)
    ok = ok[np.isfinite(ok)]
    return float(np.percentile(ok, 95)) if ok.size else None


def probe(send: Sender, rate_rps: float, duration_s: float, mix: pd.DataFrame, seed: int,
          lead_s: float = 0.5) -> tuple[pd.DataFrame, float | None, float]:
    """One open-loop probe, `duration_s` long or long enough to expect `MIN_PROBE_REQUESTS` requests:
    (load generator rows, TTFT p95 ms, failure rate)."""
    duration_s = max(duration_s, MIN_PROBE_REQUESTS / rate_rps)
    rows = send(poisson_requests(rate_rps, duration_s, mix, seed), timebase.now() + lead_s)
    return rows, _ttft_p95(rows), float(failed_mask(rows).mean()) if len(rows) else 1.0


def holds(send: Sender, rate_rps: float, probe_s: float, mix: pd.DataFrame, bound_ms: float, seed: int,
          probes: list[CapacityProbe]) -> bool:
    """Whether the server sustains `rate_rps`: a probe within the TTFT bound with no failure; a probe that is
    not gets one retry with other arrivals, and the rate fails only when both do (one stalled probe on a
    2-core machine used to cut the capacity). Every probe is appended to `probes`."""
    for attempt in range(2):
        rows, p95, fail = probe(send, rate_rps, probe_s, mix, seed + RETRY_SEED * attempt)
        ok = p95 is not None and p95 <= bound_ms and fail == 0
        probes.append(CapacityProbe(rate_rps=rate_rps, n_requests=len(rows), ttft_p95_ms=p95,
                                    failure_rate=fail, sustained=ok))
        if ok:
            return True
    return False


def _light_probe(send: Sender, mix: pd.DataFrame, light_rps: float, probe_s: float, ttft_factor: float,
                 seed: int) -> tuple[float, list[CapacityProbe]]:
    """(the TTFT bound: `ttft_factor` times the TTFT p95 at `light_rps`, [that probe]); LoadError when the
    server fails requests even there."""
    rows, reference, failures = probe(send, light_rps, probe_s, mix, seed)
    if reference is None or failures > 0:
        raise LoadError(f"the server failed requests at a light load of {light_rps:.2g} requests/s: "
                        "no capacity to measure")
    return ttft_factor * reference, [CapacityProbe(rate_rps=light_rps, n_requests=len(rows), ttft_p95_ms=reference,
                                                   failure_rate=failures, sustained=True)]


def search_capacity(send: Sender, mix: pd.DataFrame, first_guess_rps: float, probe_s: float, ttft_factor: float,
                    seed: int = 0) -> tuple[float, float, list[CapacityProbe]]:
    """(capacity rps, TTFT bound ms, probes) by the search of the module docstring."""
    light = max(first_guess_rps * LIGHT_SHARE, 0.5)
    bound, probes = _light_probe(send, mix, light, probe_s, ttft_factor, seed)

    def run(rate: float) -> bool:
        return holds(send, rate, probe_s, mix, bound, seed, probes)

    good, bad = light, max(first_guess_rps * LIGHT_SHARE * GROWTH, light * GROWTH)
    while len(probes) < MAX_PROBES and run(bad):
        good, bad = bad, bad * GROWTH
    for _ in range(BISECTIONS):
        if len(probes) >= MAX_PROBES:
            break
        mid = (good * bad) ** 0.5
        if run(mid):
            good = mid
        else:
            bad = mid
    return good, bound, probes


def confirm_capacity(send: Sender, mix: pd.DataFrame, rate_rps: float, floor_rps: float, probe_s: float,
                     bound_ms: float, seed: int, repeats: int = CONFIRM_REPEATS
                     ) -> tuple[float, list[CapacityProbe]]:
    """(the highest rate from `rate_rps` down whose `repeats` probes with fresh arrivals are all sustained,
    those probes); `floor_rps` (the light rate the search started from) when none is."""
    probes: list[CapacityProbe] = []
    rate = rate_rps
    for _ in range(MAX_STEP_DOWNS):
        if rate <= floor_rps:
            break
        if all(holds(send, rate, probe_s, mix, bound_ms, seed + 7919 * repeat, probes)
               for repeat in range(1, repeats + 1)):
            return rate, probes
        rate /= GROWTH ** 0.5
    return floor_rps, probes


def check_capacity(send: Sender, mix: pd.DataFrame, required_rps: float, first_guess_rps: float, probe_s: float,
                   ttft_factor: float, seed: int = 0) -> tuple[float, float, list[CapacityProbe]]:
    """(capacity rps, TTFT bound ms, probes) for a pinned load: the light probe sets the TTFT bound, then the
    rate the pinned plan needs (`required_rps`: its busiest window over the target utilisation) is confirmed
    like a knee (`CONFIRM_REPEATS` probes with fresh arrivals, each with its retry). Held, the capacity is that
    rate, a lower bound: the machine holds the plan and nothing above it is probed. Not held, the full search
    and its confirmation measure what the machine does hold (for the refusal to name)."""
    light = max(min(first_guess_rps, required_rps) * LIGHT_SHARE, 0.5)
    bound, probes = _light_probe(send, mix, light, probe_s, ttft_factor, seed)
    if all(holds(send, required_rps, probe_s, mix, bound, seed + 7919 * repeat, probes)
           for repeat in range(1, CONFIRM_REPEATS + 1)):
        return required_rps, bound, probes
    knee, bound, searched = search_capacity(send, mix, first_guess_rps, probe_s, ttft_factor, seed)
    capacity, confirmations = confirm_capacity(send, mix, knee, searched[0].rate_rps, probe_s, bound, seed)
    return capacity, bound, [*probes, *searched, *confirmations]


def coarse_time_scale(raw: float) -> float:
    """The largest value of the coarse grid (`TIME_SCALE_GRID` x 10^k) at or below `raw`."""
    if not (np.isfinite(raw) and raw > 0):
        raise LoadError(f"no time scale from a capacity of {raw}")
    decade = 10.0 ** np.floor(np.log10(raw * (1 + 1e-9)))  # 0.9999999999 is 1 (a float), not 0.8
    below = [m * decade for m in TIME_SCALE_GRID if m * decade <= raw * (1 + 1e-9)]
    return float(round(below[-1], 10))


def window_rates(arrivals: Sequence[np.ndarray], window_s: float, duration_s: float) -> np.ndarray:
    """Requests per second in every `window_s` window (step window_s / 4) of every seed's arrivals."""
    step = window_s / 4.0
    starts = np.arange(0.0, max(duration_s - window_s, 0.0) + step / 2, step)
    rates = []
    for arrival in arrivals:
        a = np.sort(np.asarray(arrival, dtype=float))
        counts = np.searchsorted(a, starts + window_s, side="left") - np.searchsorted(a, starts, side="left")
        rates.append(counts / window_s)
    return np.concatenate(rates) if rates else np.empty(0)


@dataclass(frozen=True)
class LoadShape:
    peak_rate: float
    median_rate: float


def load_shape(arrivals: Sequence[np.ndarray], window_s: float, duration_s: float) -> LoadShape:
    rates = window_rates(arrivals, window_s, duration_s)
    if rates.size == 0 or rates.max() <= 0:
        raise LoadError("the regime has no arrivals to size a load from")
    return LoadShape(float(rates.max()), float(np.median(rates)))


def holdable_time_scale(capacity_rps: float, shape: LoadShape, target_utilisation: float) -> float:
    """The largest time scale of the coarse grid that puts the busiest window at or below `target_utilisation`
    of `capacity_rps`."""
    return coarse_time_scale(target_utilisation * capacity_rps / shape.peak_rate)


def load_scale(regime: str, capacity_rps: float, shape: LoadShape, target_utilisation: float,
               fixed_time_scale: float | None) -> tuple[float, float, float]:
    """(time_scale, busiest-window utilisation, median-window utilisation). A pinned `fixed_time_scale` is
    checked, never changed: LoadError, in one line naming the largest time scale this capacity holds, when it
    puts the busiest window over `target_utilisation` of the capacity (a sized one never does)."""
    holds = holdable_time_scale(capacity_rps, shape, target_utilisation)
    scale = fixed_time_scale if fixed_time_scale is not None else holds
    peak_u = shape.peak_rate * scale / capacity_rps
    median_u = shape.median_rate * scale / capacity_rps
    if peak_u > target_utilisation * (1 + 1e-9):
        raise LoadError(f"regime {regime}: the pinned replay.vllm.time_scale {scale:g} puts its busiest window at "
                        f"{shape.peak_rate * scale:.3g} requests/s, {peak_u:.0%} of this machine's measured capacity "
                        f"({capacity_rps:.3g} requests/s), over target_utilisation {target_utilisation:.0%}; the "
                        f"largest time scale this machine holds is {holds:g}")
    return scale, peak_u, median_u


def noise_probe(send: Sender, rate_rps: float, duration_s: float, mix: pd.DataFrame, seed: int) -> list[float]:
    """Per-request log(E2E second / E2E first) of the same probe sent twice (see the module docstring)."""
    first, _, _ = probe(send, rate_rps, duration_s, mix, seed)
    second, _, _ = probe(send, rate_rps, duration_s, mix, seed)
    ok = ~failed_mask(first) & ~failed_mask(second)
    a = first["e2e_ms"].to_numpy(dtype=float)[ok]
    b = second["e2e_ms"].to_numpy(dtype=float)[ok]
    keep = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return [float(v) for v in np.log(b[keep] / a[keep])]
