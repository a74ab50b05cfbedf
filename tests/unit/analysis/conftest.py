"""Builders of constructed runs tables with known answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import pytest

from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence

Rates = Sequence[float]


def runs_frame(
    *,
    no_sync: Rates,
    policies: Mapping[str, Rates],
    draws: Mapping[str, Sequence[Rates]],
    regime: str = "bursty",
    backend: str = "simulator",
    references: Mapping[str, Mapping[str, Rates]] | None = None,
    losses: Mapping[str, Rates] | None = None,
) -> pd.DataFrame:
    """A runs table: seed i has ``no_sync[i]``, ``policies[p][i]`` and the
    matched-random draws ``draws[p][i]`` (matched to p); ``references[kind][p][i]``
    adds a single ``kind`` row (even_cadence, slo_oracle, offline_bound) matched to p;
    ``losses[p][i]`` is the eval loss of p's run on seed i."""
    rows = [dict(policy="no_sync", seed=s, rate=r) for s, r in enumerate(no_sync)]
    for policy, rates in policies.items():
        rows += [dict(policy=policy, seed=s, rate=r, eval_loss=(losses or {}).get(policy, [None] * len(rates))[s])
                 for s, r in enumerate(rates)]
    for policy, per_seed in draws.items():
        for s, rates in enumerate(per_seed):
            rows += [dict(policy="matched_random", seed=s, rate=r, draw=d, matched_to=policy) for d, r in enumerate(rates)]
    for kind, per_policy in (references or {}).items():
        for policy, rates in per_policy.items():
            rows += [dict(policy=kind, seed=s, rate=r, matched_to=policy) for s, r in enumerate(rates)]
    frame = pd.DataFrame(rows).rename(columns={"rate": "slo_violation_rate"})
    return frame.assign(regime=regime, backend=backend).reindex(
        columns=["regime", "policy", "seed", "draw", "matched_to", "slo_violation_rate", "backend"]
        + (["eval_loss"] if losses else [])
    )


@pytest.fixture
def build_runs():
    return runs_frame


def mechanism_for(*regimes: str, sync_ratio_paired: float = 1.3) -> MechanismEvidence:
    """Mechanism evidence whose drift-corrected bound is just below the paired ratio."""
    return MechanismEvidence(regimes={
        r: {"sync_ratio_paired": sync_ratio_paired, "drift_ratio": 1.0, "gate_ratio": sync_ratio_paired,
            "gate_ratio_ci_low": sync_ratio_paired * 0.98} for r in regimes})


def licensed_fidelity(*regimes: str, policies: Sequence[str] = ("wa_diloco",),
                      seeds: Sequence[int] = (0, 1, 2)) -> FidelityEvidence:
    """A fitted simulator that meets every target, with the same sign as the real server for `policies` on `seeds`."""
    return FidelityEvidence(
        calibration="fitted", fit_seeds=[9], held_out_seeds=list(seeds), n_held_out_replays=4 * len(seeds),
        p95_rel_error_max=0.1, p95_rel_error_mean=0.05, slo_abs_error_pp_max=1.0, slo_abs_error_pp_mean=0.5,
        sync_ratio_paired_sim_over_real=1.0,
        sign_agreement=[{"regime": r, "policy": policy, "seed": s, "n_draws": 3, "real_delta_pct": -2.0,
                         "sim_delta_pct": -1.5} for r in regimes for policy in policies for s in seeds],
    )


@pytest.fixture
def fidelity():
    return licensed_fidelity


@pytest.fixture
def mechanism():
    return mechanism_for


@pytest.fixture
def clear_winner() -> pd.DataFrame:
    """6 seeds, very different no-sync levels; ``wa_diloco`` adds 1 pp where
    matched random adds about 5 pp, its even cadence 4 pp and its SLO oracle
    0 pp: it wins every seed and closes 80 % of the gap. ``fixed_h`` adds 5 pp,
    like its draws and its even cadence. Both train to the same eval loss on every seed."""
    no_sync = [0.01, 0.30, 0.05, 0.60, 0.10, 0.20]
    return runs_frame(
        no_sync=no_sync,
        policies={"wa_diloco": [b + 0.01 for b in no_sync], "fixed_h": [b + 0.05 for b in no_sync]},
        draws={
            "wa_diloco": [[b + 0.04, b + 0.05, b + 0.06] for b in no_sync],
            "fixed_h": [[b + 0.045, b + 0.05, b + 0.055] for b in no_sync],
        },
        references={
            "even_cadence": {"wa_diloco": [b + 0.04 for b in no_sync], "fixed_h": [b + 0.05 for b in no_sync]},
            "slo_oracle": {"wa_diloco": list(no_sync), "fixed_h": list(no_sync)},
        },
        losses={"wa_diloco": [3.0] * 6, "fixed_h": [3.0] * 6},
    )
