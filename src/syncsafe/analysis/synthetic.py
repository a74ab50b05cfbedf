"""Constructed runs tables with known effects (tests, benchmarks, demos).

Not pipeline output: a seeded generator of the analysis input so the
protocol can be exercised before real replays exist. Per regime and seed, a
no-sync violation rate is drawn; matched-random draws add a sync-excess
around ``random_excess``; each controller adds ``random_excess +
effects[policy]`` plus noise (negative effect = better than random timing);
per controller run, ``even_cadence`` adds about the random excess,
``slo_oracle`` and ``offline_bound`` a small fraction of it (the oracle never
above the controller or its best draw, as a real oracle that had them as
candidates). Every controller run has an ``eval_loss`` (``fixed_h``'s plus
``loss_effects[policy]`` relative, plus noise), so training non-inferiority is
measured on every seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from syncsafe.analysis.runs_table import EVEN_CADENCE, FIXED_H, MATCHED_RANDOM, NO_SYNC, OFFLINE_BOUND, SLO_ORACLE

DEFAULT_EFFECTS: Mapping[str, float] = {
    FIXED_H: 0.0,
    "pressure_gate": -0.01,
    "random_deferral": 0.0,
    "wa_diloco": -0.02,
    "wa_calibrated": -0.03,
    "wa_forecast": -0.03,
}


def synthetic_runs(
    *,
    regimes: Sequence[str] = ("bursty", "steady", "pressure_heavy"),
    effects: Mapping[str, float] = DEFAULT_EFFECTS,
    n_seeds: int = 10,
    n_draws: int = 20,
    random_excess: float = 0.05,
    noise: float = 0.01,
    backend: str = "simulator",
    seed: int = 0,
    loss_effects: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """A valid runs table: ``no_sync``, the controllers in `effects`, and per
    controller run `n_draws` matched-random draws, an even cadence, an SLO
    oracle and an offline bound."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for regime in regimes:
        for run_seed in range(n_seeds):
            no_sync = rng.uniform(0.02, 0.2)
            base_loss = rng.uniform(2.5, 3.5)
            rows.append(_run(regime, NO_SYNC, run_seed, no_sync, 0, backend))
            for policy, effect in effects.items():
                excess = random_excess + effect + rng.normal(0.0, noise)
                loss = base_loss * (1.0 + (loss_effects or {}).get(policy, 0.0) + rng.normal(0.0, 1e-4))
                rows.append(_run(regime, policy, run_seed, no_sync + excess, 6, backend) | {"eval_loss": loss})
                even = random_excess + rng.normal(0.0, noise)
                rows.append(_run(regime, EVEN_CADENCE, run_seed, no_sync + even, 6, backend, matched_to=policy))
                draws = [random_excess + rng.normal(0.0, 1.5 * noise) for _ in range(n_draws)]
                oracle = min(0.1 * random_excess, excess, *draws)
                rows.append(_run(regime, SLO_ORACLE, run_seed, no_sync + oracle, 6, backend, matched_to=policy))
                rows.append(_run(regime, OFFLINE_BOUND, run_seed, no_sync + 0.2 * random_excess, 6, backend,
                                 matched_to=policy))
                for draw, draw_excess in enumerate(draws):
                    rows.append(_run(regime, MATCHED_RANDOM, run_seed, no_sync + draw_excess, 6, backend, draw, policy))
    return pd.DataFrame(rows)


def _run(
    regime: str,
    policy: str,
    seed: int,
    rate: float,
    n_merges: int,
    backend: str,
    draw: int | None = None,
    matched_to: str | None = None,
) -> dict[str, object]:
    rate = float(np.clip(rate, 0.0, 1.0))
    return {
        "regime": regime,
        "policy": policy,
        "seed": seed,
        "draw": draw,
        "matched_to": matched_to,
        "slo_violation_rate": rate,
        "p95_ms": 400.0 + 4000.0 * rate,
        "p99_ms": 700.0 + 8000.0 * rate,
        "n_requests": 2000,
        "n_merges": n_merges,
        "requests_during_merges": 40 * n_merges,
        "backend": backend,
    }
