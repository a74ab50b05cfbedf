"""The mechanism gate: do merges slow the real server, beyond its drift from replay to replay?

Per regime, pooled over the replayed seeds (all ratios of p95 E2E):

- *merge-active* requests of a replay with merges are those whose **no-sync
  twin** (the same request id in the seed's first no-sync replay) lived
  through a merge window of that replay: chosen by the twin's lifetime, not by
  their own latency, so slowness cannot select them.
- `sync_ratio_paired`: merge-active requests / the same ids in no-sync.
- `drift_ratio`: the seed's no-sync replay repeated *last* / its first run,
  over every request (no merge in either: anything but ~1 is the server
  drifting across the replays in between).
- gate statistic: `sync_ratio_paired / max(drift, 1 / drift)`; its lower 95 %
  bound by a block bootstrap over blocks of `block_s` trace seconds of
  arrivals (per seed, the blocks resampled with replacement; every replay's
  requests of a block move together, so the dependence inside a burst and
  between replays of the same arrivals is kept). A missing drift control
  leaves the bound empty and fails the gate.
- `sync_ratio_unpaired` (merge-active / inactive inside the merge replays)
  and `pressure_ratio` (high / low inference pressure in no-sync) are
  diagnostics only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncsafe.analysis.calibration.records import (
    ReplayRecord,
    no_sync_records,
    ok_mask,
    p95,
    repeat_records,
)
from syncsafe.analysis.evidence import MechanismEvidence, RegimeMechanism
from syncsafe.serving.metrics import p95_ratio
from syncsafe.serving.simulator import overlaps_merge_window

#: Bootstrap resamples and block length of the gate's interval.
N_BOOTSTRAP = 1000
BLOCK_S = 10.0
#: One-sided level of the lower bound.
LOWER_QUANTILE = 0.05


@dataclass(frozen=True)
class PairedRows:
    """Pooled request pairs of one regime: E2E (ms) in a replay and in its twin, with the arrival's block."""

    mine: np.ndarray
    twin: np.ndarray
    block: np.ndarray  # global block id (seed and arrival block)

    @staticmethod
    def empty() -> PairedRows:
        return PairedRows(np.empty(0), np.empty(0), np.empty(0, dtype=np.int64))


def _block_ids(seed_index: int, arrival_s: np.ndarray, block_s: float) -> np.ndarray:
    return seed_index * 1_000_000 + np.floor(arrival_s / block_s).astype(np.int64)


def _pairs(rec: ReplayRecord, twin: ReplayRecord, ids_mask: str, seed_index: int, block_s: float) -> PairedRows:
    """Pairs of `rec` and `twin` over their common ok requests: all, or the twin-defined merge-active ones."""
    r, b = rec.by_id(), twin.by_id()
    r = r[ok_mask(r)]
    b = b[ok_mask(b)]
    ids = r.index.intersection(b.index)
    r, b = r.loc[ids], b.loc[ids]
    if ids_mask == "active":
        start = b["arrival_s"].to_numpy(dtype=float)
        end = start + b["e2e_ms"].to_numpy(dtype=float) / 1000.0 * twin.time_scale  # twin's life, trace seconds
        keep = overlaps_merge_window(rec.replayed_schedule(), start, end)
        r, b = r[keep], b[keep]
    return PairedRows(r["e2e_ms"].to_numpy(dtype=float), b["e2e_ms"].to_numpy(dtype=float),
                      _block_ids(seed_index, b["arrival_s"].to_numpy(dtype=float), block_s))


def _concat(rows: Sequence[PairedRows]) -> PairedRows:
    if not rows:
        return PairedRows.empty()
    return PairedRows(*(np.concatenate([getattr(p, f) for p in rows]) for f in ("mine", "twin", "block")))


def active_pairs(records: Sequence[ReplayRecord], block_s: float = BLOCK_S) -> PairedRows:
    """Twin-defined merge-active requests of every replay with merges, paired with their no-sync twin."""
    twins = no_sync_records(records)
    seeds = sorted({r.seed for r in records})
    return _concat([_pairs(rec, twins[rec.key], "active", seeds.index(rec.seed), block_s)
                    for rec in records if rec.has_merges and not rec.is_no_sync])


def drift_pairs(records: Sequence[ReplayRecord], block_s: float = BLOCK_S) -> PairedRows:
    """Every request of each repeated no-sync replay, paired with the same request in the first no-sync run."""
    twins, repeats = no_sync_records(records), repeat_records(records)
    seeds = sorted({r.seed for r in records})
    return _concat([_pairs(rep, twins[key], "all", seeds.index(key[1]), block_s) for key, rep in repeats.items()])


def gate_statistic(active: PairedRows, drift: PairedRows | None) -> tuple[float | None, float | None, float | None]:
    """(sync_ratio_paired, drift_ratio, gate_ratio) of the pooled pairs."""
    sync = p95_ratio(active.mine, active.twin)
    if drift is None or drift.mine.size == 0:
        return sync, None, None
    d = p95_ratio(drift.mine, drift.twin)
    if sync is None or d is None:
        return sync, d, None
    return sync, d, sync / max(d, 1.0 / d)


def bootstrap_lower_bound(active: PairedRows, drift: PairedRows, seed: int = 0,
                          n_bootstrap: int = N_BOOTSTRAP) -> float | None:
    """Block-bootstrap lower 95 % bound of the gate statistic (None without both kinds of pairs)."""
    if active.mine.size == 0 or drift.mine.size == 0:
        return None
    blocks = np.union1d(active.block, drift.block)
    a_of = {b: np.flatnonzero(active.block == b) for b in blocks}
    d_of = {b: np.flatnonzero(drift.block == b) for b in blocks}
    seeds = blocks // 1_000_000
    rng = np.random.default_rng([seed, 0x6A7E])
    stats = []
    for _ in range(n_bootstrap):
        chosen = np.concatenate([rng.choice(blocks[seeds == s], size=int((seeds == s).sum())) for s in np.unique(seeds)])
        ai = np.concatenate([a_of[b] for b in chosen])
        di = np.concatenate([d_of[b] for b in chosen])
        if ai.size == 0 or di.size == 0:
            continue
        _, _, g = gate_statistic(PairedRows(active.mine[ai], active.twin[ai], active.block[ai]),
                                 PairedRows(drift.mine[di], drift.twin[di], drift.block[di]))
        if g is not None:
            stats.append(g)
    return float(np.quantile(stats, LOWER_QUANTILE)) if stats else None


def sync_ratio_unpaired(records: Sequence[ReplayRecord]) -> float | None:
    """p95 E2E of merge-active / merge-inactive requests (their own flag), pooled over the replays with merges."""
    with_merges = [rec.results for rec in records if rec.has_merges and not rec.is_no_sync]
    return _pooled_p95_ratio(with_merges, lambda r: r["merge_active"].to_numpy(dtype=bool))


def pressure_ratio(records: Sequence[ReplayRecord], high_pressure: float) -> float | None:
    """p95 E2E at inference pressure >= `high_pressure` / below it, pooled over the first no-sync replays."""
    no_sync = [rec.results for rec in no_sync_records(records).values()]
    return _pooled_p95_ratio(no_sync, lambda r: r["inference_pressure"].to_numpy(dtype=float) >= high_pressure)


def _pooled_p95_ratio(tables: Sequence[pd.DataFrame], split: Callable[[pd.DataFrame], np.ndarray]) -> float | None:
    """p95 E2E of the ok requests where `split` holds / where it does not, pooled over `tables` (None: no tables)."""
    if not tables:
        return None
    inside, outside = [], []
    for r in tables:
        ok, mask = ok_mask(r), split(r)
        e2e = r["e2e_ms"].to_numpy(dtype=float)
        inside.append(e2e[ok & mask])
        outside.append(e2e[ok & ~mask])
    return p95_ratio(np.concatenate(inside), np.concatenate(outside))


def regime_mechanism(records: Sequence[ReplayRecord], high_pressure: float, *, block_s: float = BLOCK_S,
                     n_bootstrap: int = N_BOOTSTRAP, seed: int = 0) -> RegimeMechanism | None:
    """The mechanism measurement of one regime's real replays (None: no merge-active request to measure)."""
    active = active_pairs(records, block_s)
    drift = drift_pairs(records, block_s)
    sync, d, gate = gate_statistic(active, drift)
    if sync is None:
        return None
    low = bootstrap_lower_bound(active, drift, seed, n_bootstrap) if gate is not None else None
    return RegimeMechanism(
        sync_ratio_paired=sync, sync_ratio_unpaired=sync_ratio_unpaired(records),
        pressure_ratio=pressure_ratio(records, high_pressure), drift_ratio=d, gate_ratio=gate,
        gate_ratio_ci_low=low, n_bootstrap=n_bootstrap if low is not None else 0, block_s=block_s,
        seeds=sorted({r.seed for r in records}),
        n_requests=int(sum(len(r.results) for r in records if r.has_merges and not r.is_no_sync)),
        n_merge_active=int(active.mine.size),
    )  # fmt: skip


def mechanism_evidence(records: Sequence[ReplayRecord], high_pressure: float, threshold: float | None = None,
                       **kwargs) -> tuple[MechanismEvidence, list[str]]:
    """MechanismEvidence over every regime of `records`, and the regimes it had to leave out."""
    regimes, skipped = {}, []
    for regime in sorted({r.regime for r in records}):
        measured = regime_mechanism([r for r in records if r.regime == regime], high_pressure, **kwargs)
        if measured is None:
            skipped.append(regime)
        else:
            regimes[regime] = measured
    extra = {} if threshold is None else {"gate_ratio_threshold": threshold}
    return MechanismEvidence(regimes=regimes, **extra), skipped


def transfer_table(real: Sequence[ReplayRecord], simulated: Sequence[ReplayRecord], high_pressure: float
                   ) -> pd.DataFrame:
    """Per regime: each mechanism measure on the real replays and on the simulator given the same inputs."""
    rows = []
    for regime in sorted({r.regime for r in real}):
        r_recs = [r for r in real if r.regime == regime]
        s_recs = [r for r in simulated if r.regime == regime]
        r_act, s_act = active_pairs(r_recs), active_pairs(s_recs)
        values = {
            "sync_ratio_paired": (p95_ratio(r_act.mine, r_act.twin), p95_ratio(s_act.mine, s_act.twin)),
            "sync_ratio_unpaired": (sync_ratio_unpaired(r_recs), sync_ratio_unpaired(s_recs)),
            "pressure_ratio": (pressure_ratio(r_recs, high_pressure), pressure_ratio(s_recs, high_pressure)),
            "merge_active_p95_ms": (p95(r_act.mine), p95(s_act.mine)),
        }
        for metric, (a, b) in values.items():
            rows.append({"regime": regime, "metric": metric, "real": a, "simulated": b,
                         "sim_over_real": b / a if a and b is not None else None, "n_real": int(r_act.mine.size)})
    return pd.DataFrame(rows, columns=["regime", "metric", "real", "simulated", "sim_over_real", "n_real"])
