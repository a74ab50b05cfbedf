"""The evidence protocol's numbers: per seed, then per regime x policy.

Per seed (:func:`seed_scores`), every controller run gets its raw SLO %, its
sync-excess % against the same seed's ``no_sync`` replay, its matched-random
envelope (draws from its own action space), its normalised rank among those
draws, the free-placement envelope, its evenly spaced twin, its SLO oracle
and offline bound, the share of the random-to-oracle gap it closes, and its
eval loss relative to ``fixed_h`` on the same seed.

Per regime x policy across seeds (:func:`summarize_policies`):

- ``p_rank``: the primary test, the exact within-seed rank test against the
  matched-random draws (:func:`syncsafe.analysis.stats.rank_test`);
- ``p_adjusted``: ``p_rank`` through the declared primary and Holm
  (:mod:`syncsafe.analysis.multiplicity`); tiers use it;
- ``p_vs_matched_random``: the paired sign-flip test against the envelope
  mean, kept as a secondary column (it assumes a symmetric null that skewed,
  zero-inflated SLO rates do not have);
- ``p_vs_fixed_cadence`` (exact sign test against the evenly spaced twin)
  and its Holm-adjusted ``p_vs_fixed_cadence_adjusted`` over all controllers
  and regimes;
- ``p_rank_min`` and ``p_vs_fixed_cadence_min``: the smallest p each test
  can return with the seeds and draws the row has (the design's power floor:
  above alpha, no data could have made the claim);
- ``gap_closed_mean`` and its bootstrap interval: per seed
  ``(matched random - controller) / (matched random - oracle)``, seeds where
  random sits within one request of the oracle left out;
- training non-inferiority against ``fixed_h``: ``loss_rel_diff_mean``, its
  interval, and ``training`` (``non-inferior``, ``not shown non-inferior``,
  ``hurts training`` or ``not measured``).

``no_sync`` is the only reference row; the per-controller references are
columns of their controller's row (averaging references of controllers with
different merge counts would mean nothing). Tiers are assigned in
:mod:`syncsafe.analysis.verdicts`.

Blocks (``block``): the runs table is one block; a second runs table of real
vLLM replays (``real``: the real arm's controller, its span-matched draws
and its span cadence) is scored on its own, never pooled with the first, as
the block :data:`~syncsafe.analysis.runs_table.REAL_BLOCK`. Its tests carry
the block in their keys and join the same family.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from syncsafe.analysis import stats
from syncsafe.errors import BadInput
from syncsafe.analysis.envelope import ENVELOPE_KEY, draw_scores, seed_envelopes, seed_references
from syncsafe.analysis.multiplicity import gatekept_adjusted
from syncsafe.analysis.runs_table import (
    FIXED_H,
    LATENCY_COLUMNS,
    MAIN_BLOCK,
    MATCHED_POLICIES,
    MATCHED_RANDOM_FREE,
    NO_SYNC,
    REAL_BLOCK,
    RunsTable,
    is_controller,
)
from syncsafe.analysis.sync_excess import no_sync_baseline, with_sync_excess

ROLES = {NO_SYNC: "baseline", FIXED_H: "fixed cadence"}


class ProtocolError(BadInput):
    """Runs whose numbers contradict the protocol's own guarantees (one line naming the run)."""
CONTROLLER_ROLE = "controller"
DEFAULT_LOSS_MARGIN = 0.01
#: A random-to-oracle gap narrower than this (pp) leaves nothing to close on that seed; with an
#: ``n_requests`` column the floor is one request's worth (100 / n_requests pp), since a smaller
#: gap is a fraction of one violation averaged over draws, and a ratio over it is noise.
MIN_GAP_PP = 1e-6


def role_of(policy: str) -> str:
    """``baseline``, ``fixed cadence`` or ``controller``."""
    return ROLES.get(policy, CONTROLLER_ROLE)


@dataclass(frozen=True)
class ProtocolResult:
    """The protocol's tables.

    * ``seeds``: one row per regime x policy x seed (see :func:`seed_scores`).
    * ``draws``: one row per controller run x matched-random draw.
    * ``policies``: one row per regime x policy (see :func:`summarize_policies`).
    * ``extra_adjusted``: the adjusted p of each test joined to the table's family (`with_adjusted_p`).
    * ``real_seeds`` / ``real_draws``: ``seeds`` and ``draws`` of the real-only block (empty without one);
      ``policies`` holds both blocks (``block``).
    * ``family``: every test of the family, raw p by key (`table_family`).
    """

    seeds: pd.DataFrame
    draws: pd.DataFrame
    policies: pd.DataFrame
    extra_adjusted: Mapping[Hashable, float] = field(default_factory=dict)
    real_seeds: pd.DataFrame = field(default_factory=pd.DataFrame)
    real_draws: pd.DataFrame = field(default_factory=pd.DataFrame)
    family: Mapping[Hashable, float] = field(default_factory=dict)


def run_protocol(
    table: RunsTable,
    *,
    primary: tuple[str, str] | None = None,
    loss_margin: float = DEFAULT_LOSS_MARGIN,
    confidence: float = 0.95,
    extra_tests: Mapping[Hashable, float] | None = None,
    real: RunsTable | None = None,
    block: str = MAIN_BLOCK,
) -> ProtocolResult:
    """Score every run, build the envelopes and summarize each regime x policy.

    `primary` is the declared ``(policy, regime)`` tested first; None (or a
    pair neither block has) makes every test one Holm family. `extra_tests`
    (p-values by key) join that family (`with_adjusted_p`). `real` (every
    row on the real backend) is scored on its own as the real-only block;
    `block` labels `table`'s rows.
    """
    if block == REAL_BLOCK:
        raise ValueError(f"block {REAL_BLOCK!r} is the real-only block's label; label the runs table otherwise")
    seeds, draws, policies = _score_block(table, block, loss_margin, confidence)
    real_seeds = real_draws = pd.DataFrame()
    if real is not None:
        _check_real(real)
        real_seeds, real_draws, real_policies = _score_block(real, REAL_BLOCK, loss_margin, confidence,
                                                             training_losses=training_losses(table))
        policies = pd.concat([policies, real_policies], ignore_index=True)
    adjusted, extra = with_adjusted_p(policies, primary, extra_tests)
    return ProtocolResult(seeds=seeds, draws=draws, policies=adjusted, extra_adjusted=extra, real_seeds=real_seeds,
                          real_draws=real_draws, family=table_family(policies, extra_tests))


def _score_block(table: RunsTable, block: str, loss_margin: float, confidence: float,
                 training_losses: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One block's per-seed scores, draws and policy rows (``block`` set)."""
    baseline = no_sync_baseline(table)
    draws = draw_scores(table, baseline)
    seeds = seed_scores(table, baseline, draws, training_losses=training_losses)
    policies = summarize_policies(seeds, draws, loss_margin=loss_margin, confidence=confidence)
    policies = policies.assign(backend=[evidence_backend(table, r, p) for r, p in zip(policies["regime"], policies["policy"])],
                               block=block)
    return seeds, draws, policies


def _check_real(real: RunsTable) -> None:
    """The real-only block holds real replays only: a row on another (or no) backend is an error naming it."""
    other = real.frame[real.frame["backend"].fillna("unspecified") != REAL_BLOCK]
    if not other.empty:
        r = other.iloc[0]
        raise ProtocolError(f"{real.source}: the real-only block holds {REAL_BLOCK} replays only, but "
                            f"{r['regime']}/{r['policy']}/seed {int(r['seed'])} is on {r['backend']!s}: real and "
                            "simulator replays are never mixed in one block")


def training_losses(table: RunsTable) -> pd.DataFrame | None:
    """Per (regime, policy, seed) of `table`'s controllers: the eval loss of the training run (the same run
    whichever backend replays its schedule); None without an ``eval_loss`` column."""
    if "eval_loss" not in table.frame.columns:
        return None
    runs = table.controller_runs()
    runs = runs[runs["eval_loss"].notna()].astype({"regime": str, "policy": str})
    return runs.groupby(ENVELOPE_KEY, as_index=False)["eval_loss"].mean()


def evidence_backend(table: RunsTable, regime: str, policy: str) -> str:
    """Every backend behind a row (``a+b``): its own runs, the regime's no-sync runs, and for a controller
    every schedule derived from it (draws, even cadence, SLO oracle, offline bound); a blank counts as
    ``unspecified``. A row rests on the real server only when this is exactly ``vllm``."""
    frame = table.frame[table.frame["regime"] == regime]
    behind = (frame["policy"] == policy) | (frame["policy"] == NO_SYNC)
    if is_controller(policy):
        behind |= frame["matched_to"] == policy
        behind |= frame["policy"].isin([p for p in MATCHED_POLICIES]) & frame["matched_to"].isna()
    return _joined(frame.loc[behind, "backend"].fillna("unspecified"))


def seed_scores(table: RunsTable, baseline: pd.DataFrame, draws: pd.DataFrame,
                training_losses: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per regime x policy x seed, for controllers and ``no_sync``; see the module docstring.

    `training_losses` (``regime, policy, seed, eval_loss``: the training runs, e.g. from another block's
    table) supply the eval loss of a run without its own and of ``fixed_h`` where the table has none.

    Columns: ``regime, policy, role, seed, backend, slo_pct, no_sync_slo_pct,
    sync_excess_pct``, the table's latency columns, and for controllers
    ``n_draws, mr_{slo,sync_excess}_pct_{min,mean,max}, delta_vs_mr_pct,
    rank, won, mrf_*, even_sync_excess_pct, oracle_sync_excess_pct,
    bound_sync_excess_pct, gap_closed, loss_rel_vs_fixed_h``.
    """
    runs = _runs_per_seed(table)
    scored = with_sync_excess(runs, baseline).drop(columns="slo_violation_rate")
    free_draws = draw_scores(table, baseline, MATCHED_RANDOM_FREE)
    scored = scored.merge(seed_envelopes(draws, "mr"), on=ENVELOPE_KEY, how="left")
    scored = scored.merge(seed_envelopes(free_draws, "mrf"), on=ENVELOPE_KEY, how="left")
    scored = scored.merge(seed_references(table, baseline), on=ENVELOPE_KEY, how="left")
    scored["delta_vs_mr_pct"] = scored["sync_excess_pct"] - scored["mr_sync_excess_pct_mean"]
    controller = scored["policy"].map(is_controller).to_numpy(dtype=bool)
    below = stats.quantised(scored["sync_excess_pct"]) < stats.quantised(scored["mr_sync_excess_pct_mean"])
    scored["won"] = below & controller
    scored["rank"] = _normalised_ranks(scored, draws)
    gap = scored["mr_sync_excess_pct_mean"] - scored["oracle_sync_excess_pct"]
    closed = (scored["mr_sync_excess_pct_mean"] - scored["sync_excess_pct"]) / gap
    floor = np.maximum(100.0 / scored["n_requests"] if "n_requests" in scored.columns else MIN_GAP_PP, MIN_GAP_PP)
    _check_oracle_gap(scored, gap, floor)
    scored["gap_closed"] = closed.where(gap >= floor)
    if training_losses is not None:
        scored = _with_training_losses(scored, training_losses)
    scored["loss_rel_vs_fixed_h"] = _loss_vs_fixed_h(scored, training_losses)
    scored.insert(2, "role", scored["policy"].map(role_of))
    return scored.sort_values(ENVELOPE_KEY, ignore_index=True)


def _check_oracle_gap(scored: pd.DataFrame, gap: pd.Series, floor: pd.Series | float) -> None:
    """A random-to-oracle gap below minus the floor means the oracle lost to its own candidates: an error
    naming the seed (the oracle is never worse than any draw it was given)."""
    negative = gap < -np.asarray(floor)
    if negative.any():
        row = scored[negative].iloc[0]
        raise ProtocolError(
            f"{row['regime']}/{row['policy']}/seed {int(row['seed'])}: the SLO oracle's sync-excess "
            f"{row['oracle_sync_excess_pct']:.4g} % is worse than the matched-random mean "
            f"{row['mr_sync_excess_pct_mean']:.4g} % (gap {gap[negative].iloc[0]:+.4g} pp): the oracle must never be "
            "worse than the draws it was given; rerun the replay stage")


def _runs_per_seed(table: RunsTable) -> pd.DataFrame:
    """Controller and no-sync runs: the mean over a seed's rows (one row, unless a table repeats a baseline)."""
    frame = table.frame[table.frame["policy"].map(is_controller) | (table.frame["policy"] == NO_SYNC)]
    frame = frame.assign(backend=frame["backend"].fillna("unspecified"))
    grouped = frame.groupby(ENVELOPE_KEY)
    runs = grouped[["slo_violation_rate", *table.latency_columns]].mean()
    runs.insert(0, "backend", grouped["backend"].agg(_joined))
    return runs.reset_index().astype({"regime": str, "policy": str})


def _joined(labels: Iterable[str]) -> str:
    """Distinct backend labels as ``a+b`` (inputs may already be joined)."""
    return "+".join(sorted({part for label in labels for part in label.split("+")}))


def _draw_samples(draws: pd.DataFrame) -> dict[tuple[str, str, int], np.ndarray]:
    return {key: group["sync_excess_pct"].to_numpy() for key, group in draws.groupby(ENVELOPE_KEY)}


def _normalised_ranks(scored: pd.DataFrame, draws: pd.DataFrame) -> pd.Series:
    """Per run: (mid-rank - 1) / K among itself and its K draws (0 best, 1 worst); NaN without draws."""
    samples = _draw_samples(draws)
    ranks = []
    for regime, policy, seed, value in scored[[*ENVELOPE_KEY, "sync_excess_pct"]].itertuples(index=False):
        sample = samples.get((regime, policy, seed))
        ranks.append(np.nan if sample is None else stats.rank_test([value], [sample]).rank_mean)
    return pd.Series(ranks, index=scored.index, dtype=float)


def _with_training_losses(scored: pd.DataFrame, losses: pd.DataFrame) -> pd.DataFrame:
    """`scored` with each run's eval loss taken from `losses` where it has none of its own."""
    merged = scored.merge(losses.rename(columns={"eval_loss": "_train_loss"}), on=ENVELOPE_KEY, how="left")
    own = merged["eval_loss"] if "eval_loss" in merged.columns else pd.Series(np.nan, index=merged.index)
    merged["eval_loss"] = own.astype(float).fillna(merged["_train_loss"])
    return merged.drop(columns="_train_loss")


def _loss_vs_fixed_h(scored: pd.DataFrame, losses: pd.DataFrame | None = None) -> pd.Series:
    """Relative eval-loss difference to fixed_h on the same regime and seed (NaN where either is missing);
    fixed_h's loss from `losses` where `scored` has no fixed_h run of that seed."""
    if "eval_loss" not in scored.columns:
        return pd.Series(np.nan, index=scored.index)
    fixed = scored[scored["policy"] == FIXED_H][["regime", "seed", "eval_loss"]].dropna()
    if losses is not None:
        fixed = pd.concat([fixed, losses[losses["policy"] == FIXED_H][["regime", "seed", "eval_loss"]]])
    fixed = fixed.drop_duplicates(["regime", "seed"]).rename(columns={"eval_loss": "ref"})
    ref = scored[["regime", "seed"]].merge(fixed, on=["regime", "seed"], how="left")["ref"].to_numpy()
    return pd.Series((scored["eval_loss"].to_numpy() - ref) / ref, index=scored.index)


def summarize_policies(
    seeds: pd.DataFrame,
    draws: pd.DataFrame,
    *,
    loss_margin: float = DEFAULT_LOSS_MARGIN,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Per regime x policy across seeds; see the module docstring for the evidence columns."""
    latency = [c for c in LATENCY_COLUMNS if c in seeds.columns]
    samples = _draw_samples(draws)
    rows = []
    for (regime, policy), runs in seeds.groupby(["regime", "policy"], sort=True):
        row = _describe(regime, policy, runs, latency, confidence)
        if is_controller(policy):
            row |= _evidence(runs, samples, confidence) | _training(runs, loss_margin, confidence)
        rows.append(row)
    return pd.DataFrame(rows)


def _describe(regime: str, policy: str, runs: pd.DataFrame, latency: list[str], confidence: float) -> dict[str, Any]:
    ci_low, ci_high = stats.bootstrap_mean_ci(runs["sync_excess_pct"], confidence=confidence)
    return {
        "regime": regime,
        "policy": policy,
        "role": role_of(policy),
        "backend": _joined(runs["backend"]),
        "n_seeds": int(runs["seed"].nunique()),
        "slo_pct_mean": float(runs["slo_pct"].mean()),
        "sync_excess_pct_mean": float(runs["sync_excess_pct"].mean()),
        "ci_low": ci_low,
        "ci_high": ci_high,
        **{f"{column}_mean": float(runs[column].mean()) for column in latency},
        "seeds_won": 0,
        "p_rank": stats.NO_EVIDENCE_P,
        "p_vs_matched_random": stats.NO_EVIDENCE_P,
        "p_vs_fixed_cadence": stats.NO_EVIDENCE_P,
    }


def _evidence(runs: pd.DataFrame, samples: dict, confidence: float) -> dict[str, Any]:
    """The envelope summary and the tests against matched random and the even cadence."""
    keys = list(runs[ENVELOPE_KEY].itertuples(index=False, name=None))
    with_draws = [k in samples for k in keys]
    matched = runs[with_draws]
    rank = stats.rank_test(matched["sync_excess_pct"], [samples[k] for k, ok in zip(keys, with_draws) if ok])
    vs_mr = stats.paired_test(matched["sync_excess_pct"], matched["mr_sync_excess_pct_mean"])
    even = runs[runs["even_sync_excess_pct"].notna()]
    vs_even = stats.sign_test(even["sync_excess_pct"], even["even_sync_excess_pct"])
    draw_counts = [samples[k].size for k, ok in zip(keys, with_draws) if ok]
    gap = runs["gap_closed"].dropna()
    gap_low, gap_high = stats.bootstrap_mean_ci(gap, confidence=confidence) if gap.size else (np.nan, np.nan)
    with_oracle = int(runs["oracle_sync_excess_pct"].notna().sum())
    return {
        "n_draws": int(matched["n_draws"].sum()),
        **{f"mr_sync_excess_pct_{s}": float(matched[f"mr_sync_excess_pct_{s}"].mean()) for s in ("min", "mean", "max")},
        "mrf_sync_excess_pct_mean": float(runs["mrf_sync_excess_pct_mean"].mean()),
        "even_sync_excess_pct_mean": float(runs["even_sync_excess_pct"].mean()),
        "oracle_sync_excess_pct_mean": float(runs["oracle_sync_excess_pct"].mean()),
        "bound_sync_excess_pct_mean": float(runs["bound_sync_excess_pct"].mean()),
        "delta_vs_mr_pct_mean": vs_mr.effect,
        "seeds_won": int(runs["won"].sum()),
        "rank_mean": rank.rank_mean,
        "p_rank": rank.p_value,
        "n_seeds_rank": rank.n,
        "p_rank_min": smallest_rank_p(draw_counts),
        "p_vs_fixed_cadence_min": smallest_sign_p(len(even)),
        "p_vs_matched_random": vs_mr.p_value,
        "n_seeds_vs_fixed_cadence": vs_even.n,
        "delta_vs_fixed_cadence_pct_mean": vs_even.effect,
        "p_vs_fixed_cadence": vs_even.p_value,
        "gap_closed_seeds": f"{gap.size}/{with_oracle}",
        "gap_closed_mean": float(gap.mean()) if gap.size else np.nan,
        "gap_closed_ci_low": gap_low,
        "gap_closed_ci_high": gap_high,
    }


def smallest_rank_p(draw_counts: Iterable[int]) -> float:
    """The smallest p :func:`~syncsafe.analysis.stats.rank_test` can return with `draw_counts` draws on each
    seed: the controller strictly below all its draws on every seed, prod 1 / (K_i + 1) (any tie only raises
    it); computed by the test itself. 1.0 without a seed with draws."""
    counts = [int(k) for k in draw_counts if k > 0]
    return stats.rank_test(np.zeros(len(counts)), [np.ones(k) for k in counts]).p_value


def smallest_sign_p(n_seeds: int) -> float:
    """The smallest p :func:`~syncsafe.analysis.stats.sign_test` can return on `n_seeds` pairs (below its
    reference on every seed: 2^-n); 1.0 without a pair."""
    return stats.sign_test(np.zeros(n_seeds), np.ones(n_seeds)).p_value


def _training(runs: pd.DataFrame, loss_margin: float, confidence: float) -> dict[str, Any]:
    """Eval loss relative to fixed_h on the same seeds: non-inferior unless worse beyond `loss_margin`.

    Non-inferiority needs a loss on every seed of the row: a seed without one (no eval loss, or no fixed_h
    run beside it) leaves training ``not measured``, which keeps the policy from the top tier.
    """
    diffs = runs["loss_rel_vs_fixed_h"].dropna()
    if diffs.empty or len(diffs) < len(runs):
        mean = float(diffs.mean()) if len(diffs) else np.nan
        return {"loss_rel_diff_mean": mean, "loss_rel_diff_ci_high": np.nan, "training": "not measured",
                "loss_seeds": f"{len(diffs)}/{len(runs)}"}
    mean = float(diffs.mean())
    high = stats.bootstrap_mean_ci(diffs, confidence=confidence)[1]
    if mean > loss_margin:
        verdict = "hurts training"
    elif high > loss_margin:
        verdict = "not shown non-inferior"
    else:
        verdict = "non-inferior"
    return {"loss_rel_diff_mean": mean, "loss_rel_diff_ci_high": high, "training": verdict,
            "loss_seeds": f"{len(diffs)}/{len(runs)}"}


#: The two tier tests of each controller row, and further tests that join the same family (live lines).
MATCHED_RANDOM_TEST, FIXED_CADENCE_TEST = "matched random", "fixed cadence"


def test_key(test: str, policy: str, regime: str, block: str | None = None) -> tuple[str, ...]:
    """A test's key in the family: ``(test, policy, regime)``, with the block appended for the real-only block."""
    return (test, policy, regime, REAL_BLOCK) if block == REAL_BLOCK else (test, policy, regime)


def _row_keys(policies: pd.DataFrame, test: str) -> list[tuple[str, ...]]:
    blocks = policies["block"] if "block" in policies.columns else [None] * len(policies)
    return [test_key(test, p, r, b) for p, r, b in zip(policies["policy"], policies["regime"], blocks)]


def table_family(policies: pd.DataFrame, extra_tests: Mapping[Hashable, float] | None = None) -> dict[Hashable, float]:
    """Every test of the verdict table's family, raw p by key: each controller row's (of every block)
    matched-random and fixed-cadence test, and `extra_tests`."""
    controllers = policies[policies["policy"].map(is_controller)]
    family: dict[Hashable, float] = dict(zip(_row_keys(controllers, MATCHED_RANDOM_TEST), controllers["p_rank"]))
    family |= dict(zip(_row_keys(controllers, FIXED_CADENCE_TEST), controllers["p_vs_fixed_cadence"]))
    return family | dict(extra_tests or {})


def primary_key(family: Mapping[Hashable, float], primary: tuple[str, str] | None) -> tuple[str, ...] | None:
    """The family key of the declared primary: its row of the runs table, else its row of the real-only
    block; None when neither is in the family."""
    if primary is None:
        return None
    for key in (test_key(MATCHED_RANDOM_TEST, *primary), test_key(MATCHED_RANDOM_TEST, *primary, REAL_BLOCK)):
        if key in family:
            return key
    return None


def with_adjusted_p(policies: pd.DataFrame, primary: tuple[str, str] | None,
                    extra_tests: Mapping[Hashable, float] | None = None
                    ) -> tuple[pd.DataFrame, dict[Hashable, float]]:
    """Add ``p_adjusted`` and ``p_vs_fixed_cadence_adjusted``: one family at alpha over both tier tests.

    The declared primary's matched-random test comes first, alone (`primary_key`); then one Holm family
    holds every other test of the table, of both blocks: each controller row's fixed-cadence test (the
    primary's too), the other rows' matched-random tests, and `extra_tests` (keys of their own).
    Fixed-sequence gatekeeping keeps the family-wise error of every claim the table (and the tests joined
    to it) makes at alpha. Returns the table and the adjusted p of each extra test.
    """
    family = table_family(policies, extra_tests)
    gate = primary_key(family, primary)
    adjusted = gatekept_adjusted(family, gate)
    ranks = _row_keys(policies, MATCHED_RANDOM_TEST)
    out = policies.assign(
        p_adjusted=[adjusted.get(k, stats.NO_EVIDENCE_P) for k in ranks],
        p_vs_fixed_cadence_adjusted=[adjusted.get(k, stats.NO_EVIDENCE_P)
                                     for k in _row_keys(policies, FIXED_CADENCE_TEST)],
        primary=[k == gate for k in ranks],
    )
    return out, {k: adjusted[k] for k in (extra_tests or {})}
