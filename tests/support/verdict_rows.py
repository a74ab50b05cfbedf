"""A policy-table row of a clear winner on the simulator, for tests of the claim tiers."""

from __future__ import annotations


def winner_row(**overrides) -> dict:
    """A policy-table row of a clear winner on the simulator (every seed won, a loss on every seed), with
    fields overridden."""
    base = dict(
        regime="bursty", policy="wa_diloco", n_seeds=10, seeds_won=10, backend="simulator",
        sync_excess_pct_mean=1.0, mr_sync_excess_pct_mean=5.0, p_rank=1e-6, p_adjusted=1e-5,
        p_vs_matched_random=0.001, p_vs_fixed_cadence=0.001, p_vs_fixed_cadence_adjusted=0.004,
        gap_closed_mean=0.8, training="non-inferior", loss_rel_diff_mean=0.0, loss_rel_diff_ci_high=0.004,
        loss_seeds="10/10",
    )
    return {**base, **overrides}
