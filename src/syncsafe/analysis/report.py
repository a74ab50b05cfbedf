"""The Markdown report: readable in a minute, never claiming beyond its tier.

Order: verdict table (one line per controller and regime: tier, what that
tier licenses in words, and the reason), then one policy table per regime,
then the per-seed matched-random envelope with the figure. Reference rows
(no-sync, matched random, offline bound) appear in the policy tables with
tier ``reference`` and make no claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from syncsafe.analysis.verdicts import MechanismEvidence, Tier

Row = dict[str, Any]

LICENSES = {
    Tier.STRESS_HARNESS_ONLY: "a stress-harness result only; no serving claim",
    Tier.MECHANISM_TRANSFERS: "merges measurably slow real serving here; no claim that this policy's timing helps",
    Tier.BEATS_FIXED_CADENCE: "better than a fixed merge cadence; not shown better than random timing with the same budget",
    Tier.BEATS_MATCHED_RANDOM: "SLO improvement claimed: its timing beats random timing with the same merge budget",
    Tier.REFERENCE: "reference, not a claim",
}


def render_report(
    policies: pd.DataFrame,
    seeds: pd.DataFrame,
    *,
    source: str,
    alpha: float,
    mechanism: MechanismEvidence | None,
    figure: str,
) -> str:
    """The report text. `policies` must carry tiers (see ``assign_tiers``)."""
    sections = [
        _header(source, alpha, mechanism),
        _verdicts(policies),
        *(_policy_section(regime, policies[policies["regime"] == regime]) for regime in sorted(policies["regime"].unique())),
        _envelope_section(seeds, figure),
    ]
    return "\n\n".join(sections) + "\n"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (cells rendered with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(source: str, alpha: float, mechanism: MechanismEvidence | None) -> str:
    if mechanism is None:
        evidence = "none supplied, so no policy can rise above *stress harness only*"
    else:
        measured = ", ".join(f"{r}: {mechanism.describe(r)}" for r in sorted(mechanism.regimes)) or "no regimes"
        evidence = f"{measured} (threshold {mechanism.sync_ratio_threshold:g})"
    return "\n".join(
        [
            "# syncsafe evidence report",
            "",
            f"- runs table: `{source}`",
            f"- one-sided tests at alpha = {alpha:g}; sync-excess = SLO % minus the same seed's no-sync replay (pp)",
            f"- real-backend mechanism evidence: {evidence}",
            "- tiers, lowest to highest: stress harness only < mechanism transfers < beats fixed cadence"
            " < beats matched random; each line claims only what its tier licenses.",
        ]
    )


def _verdicts(policies: pd.DataFrame) -> str:
    claims = policies[policies["tier"] != Tier.REFERENCE].sort_values(
        ["regime", "tier_rank", "policy"], ascending=[True, False, True]
    )
    rows = [(r.regime, r.policy, f"**{r.tier}**", LICENSES[Tier(r.tier)], r.reason) for r in claims.itertuples()]
    table = markdown_table(["regime", "policy", "tier", "what it licenses", "reason"], rows) if rows else "_No controller runs._"
    return "## Verdicts\n\n" + table


def _num(value: float, *, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:+.2f}" if signed else f"{value:.2f}"


def _p(value: float) -> str:
    return f"{value:.3g}"


def _interval(low: float, high: float) -> str:
    if math.isinf(low) or math.isinf(high):
        return "n/a (1 seed)"
    return f"[{low:+.2f}, {high:+.2f}]"


def _signed(value: float) -> str:
    return _num(value, signed=True)


def _p_vs_fixed_h(row: Row) -> str:
    return _p(row["p_vs_fixed_h"]) if row["n_seeds_vs_fixed_h"] > 0 else "n/a"


# (header, cell of a policy-table row, shown for controllers only)
POLICY_COLUMNS: tuple[tuple[str, Callable[[Row], str], bool], ...] = (
    ("policy", lambda r: str(r["policy"]), False),
    ("seeds", lambda r: str(r["n_seeds"]), False),
    ("SLO %", lambda r: _num(r["slo_pct_mean"]), False),
    ("sync-excess pp", lambda r: _signed(r["sync_excess_pct_mean"]), False),
    ("95% CI (pp)", lambda r: _interval(r["ci_low"], r["ci_high"]), False),
    ("matched-random pp", lambda r: _signed(r["mr_sync_excess_pct_mean"]), True),
    ("seeds won", lambda r: f"{r['seeds_won']}/{r['n_seeds']}", True),
    ("p vs matched random", lambda r: _p(r["p_vs_matched_random"]), True),
    ("p unpaired", lambda r: _p(r["p_unpaired"]), True),
    ("p vs fixed_h", _p_vs_fixed_h, True),
)
OPTIONAL_POLICY_COLUMNS = (
    ("p95 ms", "p95_ms_mean"),
    ("p99 ms", "p99_ms_mean"),
    ("merges", "n_merges_mean"),
    ("requests during merges", "requests_during_merges_mean"),
)


def _policy_section(regime: str, policies: pd.DataFrame) -> str:
    optional = [(title, column) for title, column in OPTIONAL_POLICY_COLUMNS if column in policies.columns]
    header = [title for title, _, _ in POLICY_COLUMNS] + [title for title, _ in optional] + ["tier"]
    rows = []
    for row in policies.sort_values(["tier_rank", "policy"], ascending=[False, True]).to_dict("records"):
        controller = row["tier"] != Tier.REFERENCE
        cells = [
            cell(row) if controller or not controller_only else ""
            for _, cell, controller_only in POLICY_COLUMNS
        ]
        cells += [_num(row[column]) for _, column in optional]
        rows.append([*cells, row["tier"]])
    return f"## Policies: regime {regime}\n\n" + markdown_table(header, rows)


def _envelope_section(seeds: pd.DataFrame, figure: str) -> str:
    controllers = seeds[seeds["n_draws"].notna()].sort_values(["regime", "policy", "seed"])
    header = ["regime", "policy", "seed", "sync-excess pp", "envelope min", "envelope mean", "envelope max", "draws", "won"]
    rows = [
        (
            r.regime,
            r.policy,
            r.seed,
            _signed(r.sync_excess_pct),
            _signed(r.mr_sync_excess_pct_min),
            _signed(r.mr_sync_excess_pct_mean),
            _signed(r.mr_sync_excess_pct_max),
            int(r.n_draws),
            "yes" if r.won else "no",
        )
        for r in controllers.itertuples()
    ]
    intro = (
        "## Matched-random envelope per seed\n\n"
        f"![SLO and sync-excess by policy with the matched-random envelope]({figure})\n\n"
        "Sync-excess (pp) of each controller run against min / mean / max over its matched-random draws "
        "(same merge budget, same seed). *won*: strictly below the envelope mean."
    )
    return intro + "\n\n" + (markdown_table(header, rows) if rows else "_No controller runs._")
