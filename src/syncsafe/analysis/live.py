"""The live section of the report: the controller as a sidecar on a real server, per seed.

Reads `runs/live/index.csv` (written by `syncsafe live`, see
`syncsafe.live.sidecar`): per regime and seed, four runs on the same
arrivals, the live policy, its matched-random draw (same merge count, same
action space, issued live), training without merges and no training.

Per seed:
- `sync_excess` of the policy and of matched random: SLO violation rate minus
  training without merges (the same islands and cycles, no merge);
- `compute_pp`: training without merges minus no training, the SLO cost of
  inner-step compute alone (it competes with the server for the CPU here, it
  would not on a GPU node), and `compute_share`: that cost as a share of the
  policy run's whole excess over no training (when there is one).

Across seeds: the exact within-seed rank test the main protocol uses
(`syncsafe.analysis.stats.rank_test`, policy among its draws, lower is
better). A seed whose policy run was degraded (the server stopped answering
and the safe action took over) or whose schedules left the action space
counts as a loss for the policy (ranked worst), never dropped. The live
tests join the verdict table's family (`live_tests`, adjusted with it by
`syncsafe.analysis.protocol.with_adjusted_p`). Tier *live: beats matched
random* when the adjusted p is below alpha and the mechanism gate passes in
the regime, else *live: no evidence* with the reason.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from syncsafe.analysis.analyze import Section
from syncsafe.analysis.evidence import MechanismEvidence
from syncsafe.analysis.report import markdown_table
from syncsafe.artifacts import layout
from syncsafe.analysis.stats import rank_test

LIVE_INDEX = layout.LIVE_INDEX
TIER_BEATS = "live: beats matched random"
TIER_NONE = "live: no evidence"
CONDITIONS = ("policy", "matched_random", "train_no_merge", "no_train")


def read_live_index(root: Path) -> pd.DataFrame | None:
    path = layout.at(root, LIVE_INDEX)
    if not path.is_file():
        return None
    index = pd.read_csv(path, dtype={"draw": "Int64"})
    return index if len(index) else None


def live_seeds(index: pd.DataFrame) -> pd.DataFrame:
    """One row per (regime, policy, seed) with all four runs: SLO rates, sync-excess, compute share."""
    rows = []
    for (regime, seed), group in index.groupby(["regime", "seed"], sort=True):
        by = {r.condition: r for r in group.itertuples()}
        if any(c not in by for c in CONDITIONS):
            continue
        p, m, t, n = (by[c] for c in CONDITIONS)
        excess = p.slo_violation_rate - n.slo_violation_rate
        compute = t.slo_violation_rate - n.slo_violation_rate
        rows.append({
            "regime": regime, "policy": p.policy, "seed": int(seed), "n_merges": int(p.n_merges),
            "slo_policy": p.slo_violation_rate, "slo_matched_random": m.slo_violation_rate,
            "slo_train_no_merge": t.slo_violation_rate, "slo_no_train": n.slo_violation_rate,
            "sync_excess_policy": p.slo_violation_rate - t.slo_violation_rate,
            "sync_excess_matched_random": m.slo_violation_rate - t.slo_violation_rate,
            "compute_pp": compute, "compute_share": compute / excess if excess > 0 and compute >= 0 else np.nan,
            "p95_ratio_train_vs_none": t.p95_ms / n.p95_ms if n.p95_ms > 0 else np.nan,
            "degraded": bool(p.degraded), "feasible": bool(p.feasible) and bool(m.feasible),
        })  # fmt: skip
    return pd.DataFrame(rows)


LIVE_TEST = "live"


def live_verdicts(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per (regime, policy): means and the rank test over every seed (a degraded or infeasible seed a loss)."""
    rows = []
    for (regime, policy), group in seeds.groupby(["regime", "policy"], sort=True):
        lost = group["degraded"] | ~group["feasible"]
        policy_values = np.where(lost, np.inf, group["slo_policy"].to_numpy(dtype=float))
        test = rank_test(policy_values, [[v] for v in group["slo_matched_random"]])
        rows.append({
            "regime": regime, "policy": policy, "n_seeds": len(group), "n_used": test.n, "n_lost": int(lost.sum()),
            "n_degraded": int(group["degraded"].sum()), "n_infeasible": int((~group["feasible"]).sum()),
            "slo_pct_policy": 100 * group["slo_policy"].mean(),
            "slo_pct_matched_random": 100 * group["slo_matched_random"].mean(),
            "slo_pct_train_no_merge": 100 * group["slo_train_no_merge"].mean(),
            "slo_pct_no_train": 100 * group["slo_no_train"].mean(),
            "sync_excess_pct_policy": 100 * group["sync_excess_policy"].mean(),
            "sync_excess_pct_matched_random": 100 * group["sync_excess_matched_random"].mean(),
            "compute_pp_mean": 100 * group["compute_pp"].mean(),
            "compute_share_mean": group["compute_share"].mean(),
            "p_rank": test.p_value,
        })  # fmt: skip
    return pd.DataFrame(rows)


def live_tests(root: Path) -> dict[tuple[str, str, str], float]:
    """The live rank tests, keyed (``live``, policy, regime), to join the verdict table's family."""
    index = read_live_index(root)
    seeds = live_seeds(index) if index is not None else pd.DataFrame()
    if seeds.empty:
        return {}
    return {(LIVE_TEST, v.policy, v.regime): float(v.p_rank) for v in live_verdicts(seeds).itertuples()}


def live_tier(regime: str, p_adjusted: float, alpha: float, mechanism: MechanismEvidence | None) -> tuple[str, str]:
    """(tier, why) of one live line."""
    if mechanism is None or not mechanism.shows(regime):
        why = "no mechanism evidence" if mechanism is None else mechanism.failure(regime)
        return TIER_NONE, f"mechanism gate: {why}"
    if not p_adjusted < alpha:
        return TIER_NONE, f"adjusted p {p_adjusted:.3g} >= {alpha}"
    return TIER_BEATS, f"adjusted p {p_adjusted:.3g} < {alpha}, mechanism shown"


def _pct(x: float) -> str:
    return "" if pd.isna(x) else f"{100 * x:.1f}"


def live_section(root: Path, alpha: float, mechanism: MechanismEvidence | None) -> str | Section:
    """The report's live section (Markdown): a function of the family's adjusted p when there are live runs."""
    title = "## Live: the controller as a sidecar on a real server\n\n"
    index = read_live_index(root)
    if index is None:
        return title + "No live runs (`syncsafe live`, or the `live` stage with `live.enabled: true`)."
    seeds = live_seeds(index)
    if seeds.empty:
        return title + "No seed has all four live runs (policy, matched random, training without merges, no training)."
    verdicts = live_verdicts(seeds)

    def render(adjusted: Mapping[Hashable, float]) -> str:
        per_seed = markdown_table(
            ["regime", "policy", "seed", "merges", "policy %", "matched random %", "train, no merges %",
             "no training %", "sync-excess policy pp", "sync-excess random pp", "compute pp", "compute share",
             "degraded"],
            [[r.regime, r.policy, r.seed, r.n_merges, _pct(r.slo_policy), _pct(r.slo_matched_random),
              _pct(r.slo_train_no_merge), _pct(r.slo_no_train), _pct(r.sync_excess_policy),
              _pct(r.sync_excess_matched_random), _pct(r.compute_pp),
              "" if pd.isna(r.compute_share) else f"{r.compute_share:.2f}", "yes" if r.degraded else ""]
             for r in seeds.itertuples()])  # fmt: skip
        lines = []
        for v in verdicts.itertuples():
            p_adj = adjusted.get((LIVE_TEST, v.policy, v.regime), 1.0)
            tier, why = live_tier(v.regime, p_adj, alpha, mechanism)
            lines.append([v.regime, v.policy, f"{v.n_seeds} ({v.n_lost} lost)", f"{v.slo_pct_policy:.1f}",
                          f"{v.slo_pct_matched_random:.1f}", f"{v.sync_excess_pct_policy:.1f}",
                          f"{v.sync_excess_pct_matched_random:.1f}", f"{v.compute_pp_mean:.1f}", f"{v.p_rank:.3f}",
                          f"{p_adj:.3f}", tier, why])
        summary = markdown_table(
            ["regime", "policy", "seeds (lost)", "policy %", "matched random %", "sync-excess policy pp",
             "sync-excess random pp", "compute pp", "p_rank", "p_adjusted", "tier", "why"], lines)
        note = ("SLO violations per run (SLO: each seed's training-without-merges p95 x the multiplier); sync-excess "
                "against training without merges; compute pp = training without merges minus no training (inner-step "
                "compute competing for the CPU), its share of the policy run's excess over no training. p_rank: exact "
                "within-seed rank test of the policy among its matched-random draws, a degraded or infeasible seed "
                "counted as a loss; p_adjusted: in one family with the verdict table's tests (declared primary first, "
                f"then Holm); tier at family-wise alpha {alpha}, only where the regime's mechanism gate passes.")
        return title + summary + "\n\n" + per_seed + "\n\n" + note

    return render
