"""Builders of constructed runs tables with known answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
import pytest

from syncsafe.analysis.verdicts import MechanismEvidence

Rates = Sequence[float]


def runs_frame(
    *,
    no_sync: Rates,
    policies: Mapping[str, Rates],
    draws: Mapping[str, Sequence[Rates]],
    regime: str = "bursty",
    backend: str = "simulator",
) -> pd.DataFrame:
    """A runs table: seed i has ``no_sync[i]``, ``policies[p][i]`` and the
    matched-random draws ``draws[p][i]`` (matched to p)."""
    rows = [dict(policy="no_sync", seed=s, rate=r) for s, r in enumerate(no_sync)]
    for policy, rates in policies.items():
        rows += [dict(policy=policy, seed=s, rate=r) for s, r in enumerate(rates)]
    for policy, per_seed in draws.items():
        for s, rates in enumerate(per_seed):
            rows += [dict(policy="matched_random", seed=s, rate=r, draw=d, matched_to=policy) for d, r in enumerate(rates)]
    frame = pd.DataFrame(rows).rename(columns={"rate": "slo_violation_rate"})
    return frame.assign(regime=regime, backend=backend).reindex(
        columns=["regime", "policy", "seed", "draw", "matched_to", "slo_violation_rate", "backend"]
    )


@pytest.fixture
def build_runs():
    return runs_frame


def mechanism_for(*regimes: str, sync_ratio: float = 1.3) -> MechanismEvidence:
    return MechanismEvidence(regimes={r: {"sync_ratio": sync_ratio, "pressure_ratio": 1.6} for r in regimes})


@pytest.fixture
def mechanism():
    return mechanism_for


@pytest.fixture
def clear_winner() -> pd.DataFrame:
    """6 seeds, very different no-sync levels; ``wa_diloco`` adds 1 pp where
    matched random adds about 5 pp and ``fixed_h`` 5 pp: it wins every seed."""
    no_sync = [0.01, 0.30, 0.05, 0.60, 0.10, 0.20]
    return runs_frame(
        no_sync=no_sync,
        policies={"wa_diloco": [b + 0.01 for b in no_sync], "fixed_h": [b + 0.05 for b in no_sync]},
        draws={
            "wa_diloco": [[b + 0.04, b + 0.05, b + 0.06] for b in no_sync],
            "fixed_h": [[b + 0.045, b + 0.05, b + 0.055] for b in no_sync],
        },
    )
