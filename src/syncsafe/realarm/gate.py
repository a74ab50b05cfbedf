"""The mechanism gate's statistic, its block-bootstrap bounds, and its power.

The gate asks of a real server: are requests that live through a merge
window slower than the same requests when no merge ran, by more than two
no-merge replays of the same arrivals differ? Its data are `GatePairs`, one
row per merge-active request of a replay with merges:

- `mine`: the request's E2E in the replay with merges;
- `twin`: the same request in the no-sync control nearest that replay;
- `other`: the same request in the next-nearest no-sync control (the drift
  control: no merge in either);
- `block`: the block of consecutive arrivals it falls in (seed and block
  index; bootstrap resamples whole blocks).

Statistic (all ratios of p95 E2E over the pooled rows):
`sync = p95(mine) / p95(twin)`, `drift = p95(other) / p95(twin)`,
`gate = sync / max(drift, 1 / drift)`. Its 95 % bounds come from a block
bootstrap (per seed, blocks drawn with replacement). A resample that draws
no row has no statistic: it counts *against* the bound being claimed (as 0
for the lower bound, as infinity for the upper), never skipped.

Replay-level noise. Resampling requests holds each replay's pace fixed at
what it met, but a real server's pace wanders from replay to replay (two
identical no-merge replays of one warmed server differ by 10-40 % in p95
on 2 cores, benchmarks/bench_carryover.py), so two runs of one plan differ
by more than those bounds. `ReplayNoise` estimates that wander from the
no-sync controls: the pooled within-seed variance of their log p95. With
it, every bootstrap resample also multiplies each replay's latencies by its
own log-normal shock (rows carry their replays' ids), at an sd drawn from
the pooled variance's sampling spread (scaled inverse chi-square on its
degrees of freedom), so a regime with few controls gets bounds as wide as
its one estimate of the wander is uncertain. The estimate also holds the
controls' own per-request sampling noise, which the block bootstrap
carries already: the bounds err wide, never narrow. (Subtracting a block
bootstrap's variance of one control's p95 would over-correct: the controls
replay the same arrivals, so the bursts a block bootstrap varies are
common to all of them.) tests/unit/realarm/test_gate_replay_noise.py
simulates a wandering server: without the shocks the bounds miss the
plan's typical gate ratio far above their 5 %, with them at most 5 %.

Outcome against `threshold`: **passed** when the lower bound exceeds it,
**failed** (decisively) when the upper bound is below it, else
**inconclusive**. `gate_power` estimates, before any replay, the chance of
*passed* for a planned design: synthetic realisations of the planned pairs
at the expected effect (`mine = twin * effect * noise`), normal
approximation on the log scale: the realisations' log gate ratios give a
mean and sd, their bootstraps how far the lower bound sits below the
estimate (`margin`): `power = Phi((mean - margin - log threshold) / sd)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from syncsafe.schedules.schedule import Schedule
from syncsafe.serving.metrics import p95_of_resamples, p95_ratio

#: Bootstrap resamples of the gate's interval and one-sided level of each bound.
N_BOOTSTRAP = 1000
ALPHA = 0.05
#: Seed part of a block id: block = seed_index * BLOCK_STRIDE + arrival block.
BLOCK_STRIDE = 1_000_000

Outcome = Literal["passed", "failed", "inconclusive"]


@dataclass(frozen=True)
class GatePairs:
    """Merge-active requests: E2E (ms) with merges, in the nearest and next-nearest no-sync control, and block;
    `replay` (3 x rows, optional): the ids of the replays `mine`, `twin` and `other` were measured in."""

    mine: np.ndarray
    twin: np.ndarray
    other: np.ndarray
    block: np.ndarray
    replay: np.ndarray | None = None

    @staticmethod
    def of_replays(mine: np.ndarray, twin: np.ndarray, other: np.ndarray, block: np.ndarray,
                   replays: tuple[int, int, int]) -> GatePairs:
        """Rows of one replay with merges, measured in `replays` (the ids of mine's, twin's and other's replay)."""
        return GatePairs(mine, twin, other, block, np.repeat(np.array(replays)[:, None], np.size(mine), axis=1))

    @staticmethod
    def empty() -> GatePairs:
        return GatePairs(np.empty(0), np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))

    @staticmethod
    def concat(parts: Sequence[GatePairs]) -> GatePairs:
        """The rows of every part, with their replay ids when the parts with rows have them (a mix is an error:
        dropping the ids would drop the replay-level shocks of the bounds)."""
        if not parts:
            return GatePairs.empty()
        arrays = [np.concatenate([getattr(p, f) for p in parts]) for f in ("mine", "twin", "other", "block")]
        ids = [p.replay for p in parts if p.size]
        if any(i is None for i in ids) and any(i is not None for i in ids):
            raise ValueError("gate pairs mix parts with and without replay ids")
        known = bool(ids) and all(i is not None for i in ids)
        return GatePairs(*arrays, np.concatenate(ids, axis=1) if known else None)

    def take(self, rows: np.ndarray) -> GatePairs:
        return GatePairs(self.mine[rows], self.twin[rows], self.other[rows], self.block[rows],
                         None if self.replay is None else self.replay[:, rows])

    def scaled(self, factors: np.ndarray) -> GatePairs:
        """Each series times its factor per row (`factors`: 3 x rows, for mine, twin, other)."""
        return GatePairs(self.mine * factors[0], self.twin * factors[1], self.other * factors[2], self.block,
                         self.replay)

    @property
    def size(self) -> int:
        return int(self.mine.size)

    def replay_columns(self) -> tuple[int, np.ndarray]:
        """(how many distinct replays, each row's replay as a column 0.. per series: 3 x rows); needs ids."""
        assert self.replay is not None
        ids, column = np.unique(self.replay, return_inverse=True)
        return ids.size, column.reshape(self.replay.shape)


@dataclass(frozen=True)
class ReplayNoise:
    """How much a whole replay's log p95 E2E wanders (module docstring): `var`, the pooled within-seed
    variance of the no-sync controls' log p95, on `df` degrees of freedom."""

    var: float
    df: int

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)

    def draw_sd(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` draws of the replay-level sd through the pooled variance's sampling spread: var * df / chi2(df)."""
        return np.sqrt(self.var * self.df / rng.chisquare(self.df, n))


def replay_noise(controls: Sequence[Sequence[np.ndarray]]) -> ReplayNoise | None:
    """The replay-level noise of the no-sync controls, given per seed each control's E2E (ms) of its measured
    requests. None when no seed has two controls with requests."""
    squares, df = 0.0, 0
    for per_seed in controls:
        logs = np.log([np.percentile(e2e, 95) for e2e in per_seed if e2e.size])
        if logs.size >= 2:
            squares, df = squares + float(((logs - logs.mean()) ** 2).sum()), df + logs.size - 1
    return ReplayNoise(var=squares / df, df=df) if df else None


def block_ids(seed_index: int, arrival_s: np.ndarray, block_s: float) -> np.ndarray:
    return seed_index * BLOCK_STRIDE + np.floor(np.asarray(arrival_s, dtype=float) / block_s).astype(np.int64)


def merge_active(schedule: Schedule, arrival_s: np.ndarray, life_s: float) -> np.ndarray:
    """Requests the gate counts as merge-active: [arrival, arrival + life_s) overlaps a merge window.

    `life_s` is one nominal lifetime for every request of a seed (the median
    E2E of its first no-sync control, in trace seconds): chosen by arrival
    alone, so no request is selected by its own latency in any replay (a
    request that happened to be slow in one control would otherwise be
    picked more often and regress toward the mean in the others).
    """
    arrival = np.asarray(arrival_s, dtype=float)
    return schedule.overlaps(arrival, arrival + life_s)


def gate_statistic(pairs: GatePairs) -> tuple[float | None, float | None, float | None]:
    """(sync ratio, drift ratio, gate ratio) of the pooled rows; None where a ratio is undefined."""
    return _gate_of(p95_ratio(pairs.mine, pairs.twin), p95_ratio(pairs.other, pairs.twin))


def _gate_of(sync: float | None, drift: float | None) -> tuple[float | None, float | None, float | None]:
    if sync is None or drift is None or drift <= 0:  # a zero drift ratio (other's p95 of 0 ms) defines no gate
        return sync, drift, None
    return sync, drift, sync / max(drift, 1.0 / drift)


def _block_draws(block: np.ndarray, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's block column, how often each of `n` resamples draws each block): each seed's blocks drawn
    with replacement."""
    blocks, inverse = np.unique(block, return_inverse=True)
    seeds = blocks // BLOCK_STRIDE
    counts = np.zeros(n * blocks.size, dtype=np.int64)
    offsets = (np.arange(n) * blocks.size)[:, None]
    for idx in (np.flatnonzero(seeds == s) for s in np.unique(seeds)):
        drawn = idx[rng.integers(0, idx.size, (n, idx.size))]
        counts += np.bincount((offsets + drawn).ravel(), minlength=counts.size)
    return inverse, counts.reshape(n, blocks.size)


def _replay_shocks(pairs: GatePairs, noise: ReplayNoise | None, rng: np.random.Generator, n: int
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """Each resample's log shock per replay (n x replays), and each row's replay column per series (3 x rows):
    resample r multiplies series k's row i by exp(shocks[r, column[k, i]]). None without noise or replay ids."""
    if noise is None or pairs.replay is None or noise.df < 1:
        return None
    replays, column = pairs.replay_columns()
    return noise.draw_sd(rng, n)[:, None] * rng.standard_normal((n, replays)), column


def bootstrap_gates(pairs: GatePairs, seed: int = 0, n_bootstrap: int = N_BOOTSTRAP,
                    noise: ReplayNoise | None = None) -> np.ndarray:
    """The gate ratio of each block-bootstrap resample (NaN where a resample has no statistic); with `noise`
    and replay ids, each resample's replays also shocked (module docstring)."""
    if pairs.size == 0:
        return np.full(n_bootstrap, np.nan)
    rng = np.random.default_rng([seed, 0x6A7E])
    inverse, taken = _block_draws(pairs.block, rng, n_bootstrap)
    shocks = _replay_shocks(pairs, noise, rng, n_bootstrap)
    latencies = np.vstack([pairs.mine, pairs.twin, pairs.other])
    if bool(np.isfinite(latencies).all()):  # the common case: every latency measured
        chunks = []
        for i in range(0, n_bootstrap, _CHUNK):
            shocked = latencies if shocks is None else latencies * np.exp(shocks[0][i : i + _CHUNK][:, shocks[1]])
            chunks.append(_gates_of_resamples(shocked, inverse, taken[i : i + _CHUNK]))
        return np.concatenate([np.empty(0), *chunks])
    out = np.full(n_bootstrap, np.nan)
    for b in range(n_bootstrap):
        rows = np.repeat(np.arange(pairs.size), taken[b][inverse])  # each row as often as its block was drawn
        if rows.size:
            shocked = pairs if shocks is None else pairs.scaled(np.exp(shocks[0][b][shocks[1]]))
            g = gate_statistic(shocked.take(rows))[2]
            out[b] = np.nan if g is None else g
    return out


#: Resamples evaluated at once by `_gates_of_resamples` (bounds its (resamples x rows) arrays).
_CHUNK = 128


def _gates_of_resamples(latencies: np.ndarray, inverse: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """The gate ratio of each resample, every resample at once: resample r holds each row of block j
    `taken[r, j]` times (`metrics.p95_of_resamples` per latency series). `latencies`: (3, rows), or
    (resamples, 3, rows) when each resample's latencies differ (replay-level shocks)."""
    weight = taken[:, inverse].astype(np.int32)  # counts of a few thousand rows at most: int32 sums are faster
    series = latencies if latencies.ndim == 2 else np.moveaxis(latencies, 1, 0)
    mine, twin, other = (p95_of_resamples(s, weight) for s in series)  # NaN for an empty resample
    out = np.full(len(taken), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        sync, drift = mine / twin, other / twin
        gate = sync / np.maximum(drift, 1.0 / drift)
    ok = (twin > 0) & (drift > 0)  # as `_gate_of`: no gate without a positive twin p95 and drift ratio
    out[ok] = gate[ok]
    return out


def gate_bounds(pairs: GatePairs, seed: int = 0, n_bootstrap: int = N_BOOTSTRAP, noise: ReplayNoise | None = None
                ) -> tuple[float | None, float | None]:
    """One-sided 95 % (lower, upper) bounds of the gate ratio (replays shocked by `noise`); None without rows."""
    if pairs.size == 0:
        return None, None
    gates = bootstrap_gates(pairs, seed, n_bootstrap, noise)
    lower = np.quantile(np.where(np.isnan(gates), 0.0, gates), ALPHA, method="inverted_cdf")
    upper = np.quantile(np.where(np.isnan(gates), np.inf, gates), 1.0 - ALPHA, method="inverted_cdf")
    return (float(lower) if lower > 0 else None), (float(upper) if np.isfinite(upper) else None)


def gate_outcome(lower: float | None, upper: float | None, threshold: float) -> Outcome:
    """passed: lower bound above the threshold; failed: upper bound below it; else inconclusive."""
    if lower is not None and lower > threshold:
        return "passed"
    if upper is not None and upper < threshold:
        return "failed"
    return "inconclusive"


@dataclass(frozen=True)
class GatePower:
    """A gate's planned power: chance of *passed* at the expected effect, and what it rests on."""

    power: float
    #: Mean and standard deviation of the log gate ratio over the synthetic realisations.
    log_gate: float
    sd: float
    #: Mean distance, on the log scale, from a realisation's gate ratio down to its bootstrap lower bound.
    margin: float
    n_pairs: int

    @property
    def expected_gate(self) -> float:
        return float(np.exp(self.log_gate))


def gate_power(designs: Sequence[GatePairs], threshold: float, seed: int = 0, n_bootstrapped: int = 16,
               n_bootstrap: int = 400, noise: ReplayNoise | None = None) -> GatePower:
    """Power of the gate over synthetic realisations of one planned design (see the module docstring).

    Each element of `designs` is one noisy realisation of the planned pairs at
    the expected effect. Their log gate ratios give its mean and spread; the
    first `n_bootstrapped` are bootstrapped to find how far below the point
    estimate the lower bound sits (the `margin`). The gate passes when
    `log gate - margin > log threshold`: `power = Phi((mean - margin - log threshold) / sd)`. `noise`: the
    replay-level noise the bounds will carry (the realisations should carry it too).
    """
    n_pairs = int(np.mean([p.size for p in designs])) if designs else 0
    logs = [np.log(g) for p in designs if (g := gate_statistic(p)[2]) is not None]
    if len(logs) < 2 or len(logs) < len(designs):  # a realisation without a statistic: the plan cannot decide
        return GatePower(power=0.0, log_gate=float("nan"), sd=float("nan"), margin=float("nan"), n_pairs=n_pairs)
    margins = []
    for i, pairs in enumerate(designs[:n_bootstrapped]):
        lower = np.quantile(np.nan_to_num(bootstrap_gates(pairs, seed + i, n_bootstrap, noise), nan=0.0), ALPHA,
                            method="inverted_cdf")
        margins.append(logs[i] - np.log(lower) if lower > 0 else np.inf)
    mean, sd, margin = float(np.mean(logs)), float(np.std(logs, ddof=1)), float(np.mean(margins))
    if not np.isfinite(margin):
        power = 0.0
    elif sd > 0:
        power = float(stats.norm.cdf((mean - margin - np.log(threshold)) / sd))
    else:
        power = float(mean - margin > np.log(threshold))
    return GatePower(power=power, log_gate=mean, sd=sd, margin=margin, n_pairs=n_pairs)
