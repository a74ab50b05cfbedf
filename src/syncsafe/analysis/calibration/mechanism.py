"""The mechanism gate: do merges slow the real server, beyond how much its no-merge replays differ?

Per regime, pooled over the replayed seeds (the statistic, its bounds and
outcome: `syncsafe.realarm.gate`):

- *merge-active* requests of a replay with merges are those whose arrival
  plus one nominal lifetime (the seed's first no-sync control's median E2E)
  overlaps a merge window of the replay's span (`gate.merge_active`):
  chosen by arrival alone, so no latency of any replay selects them;
- each replay with merges is paired with its **nearest** no-sync control in
  the seed's replay order (`twin`) and the next-nearest (`other`, the drift
  control): `sync = p95(mine) / p95(twin)`, `drift = p95(other) / p95(twin)`,
  `gate = sync / max(drift, 1 / drift)`;
- block bootstrap over `block_s` trace seconds of arrivals, each resample's
  replays also shocked by the wander of a whole replay's pace that the
  seeds' no-sync controls show (their own sampling noise included, so the
  bounds err wide; `replay_noise`, `gate.ReplayNoise`): one-sided 95 % lower and upper
  bounds that two runs of one plan can agree within. The gate *passes* when the lower bound exceeds the
  threshold, *fails* (decisively) when the upper bound is below it, and is
  otherwise *inconclusive*: underpowered when the plan's power
  (`plan.json`) was below its target;
- the noise floor per seed: the spread of p95 E2E and SLO rate over the
  seed's no-sync controls;
- `sync_ratio_unpaired` (merge-active / inactive inside the merge replays,
  by the requests' own flag) and `pressure_ratio` (high / low inference
  pressure in the first no-sync replays) are diagnostics only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from syncsafe.analysis.calibration.records import (
    ReplayRecord,
    control_records,
    nearest_control_records,
    no_sync_records,
    ok_mask,
    p95,
)
from syncsafe.analysis.evidence import MechanismEvidence, NoSyncSpread, RegimeMechanism
from syncsafe.realarm.gate import (
    GatePairs,
    ReplayNoise,
    block_ids,
    gate_bounds,
    gate_statistic,
    merge_active,
    replay_noise,
)
from syncsafe.serving.metrics import derive_slo, p95_ratio, violation_mask
from syncsafe.realarm.design import RealPlan

#: Bootstrap resamples and block length of the gate's interval.
N_BOOTSTRAP = 1000
BLOCK_S = 10.0


def nominal_life_s(control: ReplayRecord) -> float:
    """The seed's nominal request lifetime in trace seconds: its first control's median E2E."""
    e2e = control.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(control.results)]
    return float(np.median(e2e)) / 1000.0 * control.time_scale if e2e.size else 0.0


def _replay_pairs(rec: ReplayRecord, controls: list[ReplayRecord], seed_index: int, block_s: float,
                  number: dict[str, int]) -> GatePairs:
    """`rec`'s merge-active requests with its nearest and next-nearest control (NaN without a second);
    `number`: each replay's id by name (-1 for a missing drift control)."""
    near = nearest_control_records(rec, controls)
    twin, other = near[0], (near[1] if len(near) > 1 else None)
    frames = [rec.by_id(), twin.by_id()] + ([other.by_id()] if other is not None else [])
    ids = frames[0].index
    for frame in frames:
        ids = ids.intersection(frame.index[ok_mask(frame)])
    arrival = twin.by_id().loc[ids, "arrival_s"].to_numpy(dtype=float)
    keep = merge_active(rec.replayed_schedule(), arrival, nominal_life_s(controls[0]))
    ids, arrival = ids[keep], arrival[keep]
    e2e = [f.loc[ids, "e2e_ms"].to_numpy(dtype=float) for f in frames]
    other_e2e = e2e[2] if other is not None else np.full(ids.size, np.nan)
    replays = (number[rec.name], number[twin.name], number[other.name] if other is not None else -1)
    return GatePairs.of_replays(e2e[0], e2e[1], other_e2e, block_ids(seed_index, arrival, block_s), replays)


def active_pairs(records: Sequence[ReplayRecord], block_s: float = BLOCK_S) -> GatePairs:
    """The gate's rows of every replay with merges in `records` (see the module docstring)."""
    controls = control_records(records)
    seeds = sorted({r.seed for r in records})
    missing = sorted({r.key for r in records} - set(controls))
    if missing:
        no_sync_records(records)  # raises, naming the seeds without a no-sync replay
    number = {rec.name: i for i, rec in enumerate(records)}
    return GatePairs.concat([_replay_pairs(rec, controls[rec.key], seeds.index(rec.seed), block_s, number)
                             for rec in records if rec.has_merges and not rec.is_no_sync])


def controls_noise(records: Sequence[ReplayRecord]) -> ReplayNoise | None:
    """The wander of a whole replay's pace among each seed's no-sync controls (`gate.replay_noise`)."""
    return replay_noise([[c.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(c.results)] for c in controls]
                         for _, controls in sorted(control_records(records).items())])


def no_sync_spread(records: Sequence[ReplayRecord], slo_multiplier: float) -> list[NoSyncSpread]:
    """Per seed: p95 E2E and SLO-violation rate of each no-sync control (the noise floor)."""
    out = []
    for (_, seed), controls in sorted(control_records(records).items()):
        first = controls[0]
        slo = first.slo or derive_slo(first.results, slo_multiplier)
        p95s = [p95(c.results["e2e_ms"].to_numpy(dtype=float)[ok_mask(c.results)]) for c in controls]
        slos = [100.0 * float(violation_mask(c.results, slo).mean()) for c in controls]
        known = [v for v in p95s if v]
        out.append(NoSyncSpread(seed=seed, p95_ms=[v or 0.0 for v in p95s], slo_pct=slos,
                                p95_spread=(max(known) / min(known) - 1.0) if len(known) > 1 else None,
                                slo_range_pp=(max(slos) - min(slos)) if len(slos) > 1 else None))
    return out


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
                     n_bootstrap: int = N_BOOTSTRAP, seed: int = 0, slo_multiplier: float = 1.5,
                     plan: RealPlan | None = None) -> RegimeMechanism | None:
    """The mechanism measurement of one regime's real replays (None: no merge-active request to measure)."""
    pairs = active_pairs(records, block_s)
    sync, drift, gate = gate_statistic(pairs)
    if sync is None:
        return None
    noise = controls_noise(records)
    low, high = gate_bounds(pairs, seed, n_bootstrap, noise) if gate is not None else (None, None)
    regime = records[0].regime
    planned = plan.regimes.get(regime) if plan is not None else None
    load = plan.loads.get(regime) if plan is not None else None
    return RegimeMechanism(
        sync_ratio_paired=sync, sync_ratio_unpaired=sync_ratio_unpaired(records),
        pressure_ratio=pressure_ratio(records, high_pressure), drift_ratio=drift, gate_ratio=gate,
        gate_ratio_ci_low=low, gate_ratio_ci_high=high, n_bootstrap=n_bootstrap if gate is not None else 0,
        block_s=block_s, replay_sd=noise.sd if noise is not None else None,
        replay_sd_df=noise.df if noise is not None else None, seeds=sorted({r.seed for r in records}),
        n_requests=int(sum(len(r.results) for r in records if r.has_merges and not r.is_no_sync)),
        n_merge_active=pairs.size, n_controls=max(len(c) for c in control_records(records).values()),
        no_sync_spread=no_sync_spread(records, slo_multiplier),
        power=planned.power if planned is not None else None,
        power_target=plan.power_target if plan is not None else None,
        time_scale=records[0].time_scale, span_s=records[0].span_s,
        utilisation=load.utilisation if load is not None else None,
    )  # fmt: skip


def mechanism_evidence(records: Sequence[ReplayRecord], high_pressure: float, threshold: float | None = None,
                       plan: RealPlan | None = None, **kwargs) -> tuple[MechanismEvidence, list[str]]:
    """MechanismEvidence over every regime of `records`, and the regimes it had to leave out; each regime
    of the plan without a measurement is named in `unmeasured` with the reason."""
    regimes, unmeasured = {}, {}
    for regime in sorted({r.regime for r in records}):
        mine = [r for r in records if r.regime == regime]
        measured = regime_mechanism(mine, high_pressure, plan=plan, **kwargs)
        if measured is None:
            merges = sum(len(r.merge_starts_s) for r in mine if not r.is_no_sync)
            span = mine[0].span_s
            unmeasured[regime] = (f"no merge-active request in its valid real replays: {merges} merge(s) of the "
                                  f"replayed schedules start inside the span"
                                  + (f" [0, {span:g}) s" if span is not None else ""))
        else:
            regimes[regime] = measured
    if plan is not None:
        unmeasured.update({r: f"not replayed: {why}" for r, why in plan.left_out.items()})
        unmeasured.update({r: "no valid real replay" for r in plan.regimes if r not in regimes and r not in unmeasured})
    extra = {} if threshold is None else {"gate_ratio_threshold": threshold}
    return MechanismEvidence(regimes=regimes, unmeasured=unmeasured, **extra), sorted(unmeasured)


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
                         "sim_over_real": b / a if a and b is not None else None, "n_real": r_act.size})
    return pd.DataFrame(rows, columns=["regime", "metric", "real", "simulated", "sim_over_real", "n_real"])
