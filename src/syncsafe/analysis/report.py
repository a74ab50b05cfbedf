"""The Markdown report: readable in a minute, never claiming beyond its tier.

Order: a header block (runs table, seeds, calibration status and held-out
fidelity, the test family, its order and correction, the mechanism
evidence), the verdict table (one line per controller and regime: tier, what
that tier licenses in words, and the reason), one policy table per regime,
the real-only block (the real vLLM replays judged on their own, when there
is one: its rows, power and per-seed ranks), the real-vs-simulated sign
agreement per held-out seed, then the per-seed matched-random envelope with
the figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.analysis.runs_table import REAL_BLOCK
from syncsafe.analysis.verdicts import Tier
from syncsafe.config import policy_label

Row = dict[str, Any]

LICENSES = {
    Tier.STRESS_HARNESS_ONLY: "a stress-harness result only; no serving claim",
    Tier.MECHANISM_TRANSFERS: "merges measurably slow real serving here; no claim that this policy's timing helps",
    Tier.BEATS_FIXED_CADENCE: "better than its merge count evenly spaced; not shown better than random timing "
                              "with the same count",
    Tier.BEATS_MATCHED_RANDOM: "SLO improvement claimed: its timing beats random timing with the same merge count "
                               "in its own action space",
    Tier.REFERENCE: "reference, not a claim",
}


@dataclass(frozen=True)
class ReportContext:
    """What the header states besides the tables."""

    source: str
    alpha: float
    mechanism: MechanismEvidence | None
    fidelity: FidelityEvidence | None = None
    primary: tuple[str, str] | None = None
    loss_margin: float = 0.01
    seeds: list[int] = field(default_factory=list)
    #: What the real-only block left out, and why (one line each).
    real_notes: list[str] = field(default_factory=list)


def render_report(policies: pd.DataFrame, seeds: pd.DataFrame, context: ReportContext, *, figure: str,
                  real_seeds: pd.DataFrame | None = None) -> str:
    """The report text. `policies` must carry tiers (see ``assign_tiers``); `real_seeds` are the real-only
    block's per-seed scores."""
    real = _is_real(policies)
    main = policies[~real]
    sections = [
        _header(policies, context),
        _verdicts(policies),
        *(_policy_section(regime, main[main["regime"] == regime]) for regime in sorted(main["regime"].unique())),
        _real_block_section(policies[real], real_seeds, context) if real.any() else "",
        _sign_agreement_section(context.fidelity),
        _envelope_section(seeds, figure),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _is_real(policies: pd.DataFrame) -> pd.Series:
    if "block" not in policies.columns:
        return pd.Series(False, index=policies.index)
    return policies["block"] == REAL_BLOCK


def _label(row: Row) -> str:
    return policy_label(str(row["policy"])) + (" (real replays only, vllm)" if row.get("block") == REAL_BLOCK else "")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (cells rendered with ``str``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(policies: pd.DataFrame, context: ReportContext) -> str:
    mechanism = context.mechanism
    if mechanism is None:
        evidence = "none supplied, so no policy can rise above *stress harness only*"
    else:
        evidence = "; ".join(f"{r}: {mechanism.describe(r)}" for r in sorted(mechanism.regimes)) or "no regimes measured"
    fidelity = context.fidelity
    if fidelity is None:
        calibration = "no fidelity evidence: rows replayed on the simulator stay at *mechanism transfers* at most"
    else:
        status = "licensed" if fidelity.licenses() else "NOT licensed"
        t = fidelity.targets
        calibration = (f"`{fidelity.calibration}`; simulator-wide {status}: {fidelity.describe()} "
                       f"(fit seeds {fidelity.fit_seeds}, held-out seeds {fidelity.held_out_seeds}; targets used: p95 "
                       f"error <= {t.p95_rel_error_max:.0%}, SLO-rate error <= {t.slo_abs_error_pp_max:g} pp, paired "
                       f"sync ratio sim/real in [{t.sync_ratio_paired_low:g}, {t.sync_ratio_paired_high:g}]; each "
                       "(policy, regime) also needs its own real-server check, see its reason)")
    controllers = policies[policies["tier"] != Tier.REFERENCE]
    n_tests = 2 * len(controllers)
    n_real = int(_is_real(controllers).sum())
    blocks = (f", the real-only block's {2 * n_real} tests included" if n_real else "")
    primary = context.primary
    gate = controllers[(controllers["policy"] == primary[0]) & (controllers["regime"] == primary[1])] \
        if primary is not None else controllers.iloc[0:0]
    if "primary" in gate.columns:
        gate = gate[gate["primary"].astype(bool)]
    if not gate.empty:
        where = " (its real-only row: the runs table lacks it)" if _is_real(gate).all() else ""
        family = (f"declared primary `{primary[0]}` on `{primary[1]}`{where} tested first at alpha; only if it is "
                  f"rejected are the other {n_tests - 1} tests judged (every row's fixed-cadence test, the other "
                  f"rows' matched-random tests{blocks} and any live test), as one Holm family (fixed-sequence "
                  "gatekeeping: family-wise error of every claim of the table <= alpha)")
    else:
        family = (f"no declared primary in this table: all {n_tests} tests (each row's matched-random and "
                  f"fixed-cadence test{blocks}, and any live test) form one Holm family")
    seeds = ", ".join(str(s) for s in context.seeds)
    return "\n".join(
        [
            "# syncsafe evidence report",
            "",
            f"- runs table: {context.source}",
            f"- seeds ({len(context.seeds)}): {seeds}",
            f"- calibration: {calibration}",
            f"- real-backend mechanism evidence: {evidence}",
            f"- primary test: exact within-seed rank test of sync-excess against the matched-random draws from each "
            f"controller's own action space (`p_rank`); {family}; tiers use the adjusted p (`p_adjusted`) at "
            f"alpha = {context.alpha:g}",
            "- fixed cadence: exact sign test against the controller's merge count evenly spaced, adjusted in the "
            "same family; the paired sign-flip p against the envelope mean (`p_vs_matched_random`) is shown for "
            "reference only (it assumes a symmetric null)",
            f"- training: eval loss relative to fixed_h on the same seeds; worse by more than {context.loss_margin:.1%}, "
            "not shown within it, or not measured on every seed keeps a policy from the top tier",
            f"- mechanism gate threshold used: {mechanism.gate_ratio_threshold:g}" if mechanism is not None else
            "- mechanism gate: no evidence",
            "- sync-excess = SLO % minus the same seed's no-sync replay (pp); gap closed = (matched random - "
            "controller) / (matched random - SLO oracle) per seed",
            "- tiers, lowest to highest: stress harness only < mechanism transfers < beats fixed cadence"
            " < beats matched random; each line claims only what its tier licenses.",
        ]
    )


def _verdicts(policies: pd.DataFrame) -> str:
    claims = policies[policies["tier"] != Tier.REFERENCE]
    claims = claims.assign(_real=_is_real(claims)).sort_values(
        ["_real", "regime", "tier_rank", "policy"], ascending=[True, True, False, True]
    )
    rows = [(r["regime"], _label(r), f"**{r['tier']}**", LICENSES[Tier(r["tier"])], r["reason"])
            for r in claims.to_dict("records")]
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


def _percent(value: float) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def _gap(row: Row) -> str:
    """Mean gap closed with its interval and how many seeds define it (k/n); `undefined` where none does."""
    low, high = row.get("gap_closed_ci_low"), row.get("gap_closed_ci_high")
    text = _percent(row.get("gap_closed_mean")) or "undefined"
    if text != "undefined" and low is not None and not (math.isnan(low) or math.isinf(low) or math.isinf(high)):
        text += f" [{low:.0%}, {high:.0%}]"
    seeds = row.get("gap_closed_seeds")
    return f"{text} ({seeds} seeds)" if isinstance(seeds, str) else text


# (header, cell of a policy-table row, shown for controllers only)
POLICY_COLUMNS: tuple[tuple[str, Callable[[Row], str], bool], ...] = (
    ("policy", lambda r: policy_label(str(r["policy"])) + (" (primary)" if r.get("primary") else ""), False),
    ("seeds", lambda r: str(r["n_seeds"]), False),
    ("SLO %", lambda r: _num(r["slo_pct_mean"]), False),
    ("sync-excess pp", lambda r: _signed(r["sync_excess_pct_mean"]), False),
    ("95% CI (pp)", lambda r: _interval(r["ci_low"], r["ci_high"]), False),
    ("matched random pp", lambda r: _signed(r["mr_sync_excess_pct_mean"]), True),
    ("free random pp", lambda r: _signed(r["mrf_sync_excess_pct_mean"]), True),
    ("even cadence pp", lambda r: _signed(r["even_sync_excess_pct_mean"]), True),
    ("SLO oracle pp", lambda r: _signed(r["oracle_sync_excess_pct_mean"]), True),
    ("gap closed", _gap, True),
    ("seeds won", lambda r: f"{r['seeds_won']}/{r['n_seeds']}", True),
    ("p rank", lambda r: _p(r["p_rank"]), True),
    ("p adjusted", lambda r: _p(r["p_adjusted"]), True),
    ("p cadence (adj.)", lambda r: _p(r["p_vs_fixed_cadence_adjusted"]), True),
    ("p sign-flip", lambda r: _p(r["p_vs_matched_random"]), True),
    ("training", lambda r: str(r.get("training", "")), True),
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


def _real_block_section(policies: pd.DataFrame, seeds: pd.DataFrame | None, context: ReportContext) -> str:
    """The real-only block: its rows (tests in the table's family), the power of its tests, its seeds."""
    header = ["regime", *(title for title, _, _ in POLICY_COLUMNS), "smallest p rank / cadence", "tier"]
    rows = []
    for row in policies.sort_values(["regime", "tier_rank", "policy"], ascending=[True, False, True]).to_dict("records"):
        controller = row["tier"] != Tier.REFERENCE
        cells = [cell(row) if controller or not only else "" for _, cell, only in POLICY_COLUMNS]
        floor = f"{_p(row['p_rank_min'])} / {_p(row['p_vs_fixed_cadence_min'])}" if controller else ""
        rows.append([row["regime"], *cells, floor, row["tier"]])
    intro = ("## Real replays judged on their own (vLLM)\n\n"
             "The real arm's controller, its span-matched random draws and the span's evenly spaced schedule of the "
             "same merge count, replayed on the real vLLM server on every planned seed and scored against that seed's "
             "real no-sync replay only (never pooled with simulator replays). Their rank and cadence tests are in the "
             "verdict table's family (rows marked *real replays only, vllm*); they need no simulator licence, only "
             f"the regime's mechanism gate. *smallest p*: the least p each test can return with these seeds and draws "
             f"(rank: prod 1/(K+1) over seeds; cadence: 2^-seeds); above alpha = {context.alpha:g} the test is "
             "underpowered and its \"no\" is no evidence against the policy. No SLO oracle is replayed on the real "
             "server, so gap closed is undefined here.")
    parts = [intro, markdown_table(header, rows)]
    if context.real_notes:
        parts.append("Left out of the real-only block:\n\n" + "\n".join(f"- {note}" for note in context.real_notes))
    if seeds is not None and not seeds.empty:
        runs = seeds[seeds["n_draws"].notna()].sort_values(["regime", "policy", "seed"])
        parts.append(markdown_table(
            ["regime", "policy", "seed", "sync-excess pp", "draws min", "draws mean", "draws max", "draws", "rank",
             "even cadence pp", "won"],
            [(r.regime, r.policy, r.seed, _signed(r.sync_excess_pct), _signed(r.mr_sync_excess_pct_min),
              _signed(r.mr_sync_excess_pct_mean), _signed(r.mr_sync_excess_pct_max), int(r.n_draws), f"{r.rank:.2f}",
              _signed(r.even_sync_excess_pct), "yes" if r.won else "no") for r in runs.itertuples()]))
    return "\n\n".join(parts)


def _sign_agreement_section(fidelity: FidelityEvidence | None) -> str:
    if fidelity is None:
        return ""
    rows = [
        (a.regime, a.policy, a.seed, a.n_draws, _signed(a.real_delta_pct), _signed(a.sim_delta_pct),
         "tie (no information)" if a.tie else "yes" if a.agree else "**no**")
        for a in fidelity.sign_agreement
    ]
    intro = ("## Real server vs simulator: controller minus matched random\n\n"
             "Per real-replayed seed, the controller's SLO % minus the mean of its matched-random draws on the real "
             "vLLM server and in the fitted simulator; a simulator verdict above *mechanism transfers* for a (policy, "
             "regime) needs the same sign on every held-out seed of it, at least one of them a non-zero real "
             "difference (zero against zero is a tie that carries no information).")
    return intro + "\n\n" + (markdown_table(["regime", "policy", "seed", "draws", "real pp", "simulated pp", "same sign"],
                                             rows) if rows else "_No real replays with matched-random draws._")


def _envelope_section(seeds: pd.DataFrame, figure: str) -> str:
    controllers = seeds[seeds["n_draws"].notna()].sort_values(["regime", "policy", "seed"])
    header = ["regime", "policy", "seed", "sync-excess pp", "envelope min", "envelope mean", "envelope max", "draws",
              "rank", "SLO oracle pp", "won"]
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
            f"{r.rank:.2f}",
            _signed(r.oracle_sync_excess_pct),
            "yes" if r.won else "no",
        )
        for r in controllers.itertuples()
    ]
    intro = (
        "## Matched-random envelope per seed\n\n"
        f"![SLO and sync-excess by policy with the matched-random envelope]({figure})\n\n"
        "Sync-excess (pp) of each controller run against min / mean / max over its matched-random draws "
        "(same merge count, same action space, same seed). *rank*: 0 best, 1 worst among itself and its draws; "
        "*won*: strictly below the envelope mean."
    )
    return intro + "\n\n" + (markdown_table(header, rows) if rows else "_No controller runs._")
