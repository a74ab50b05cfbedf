"""The per-run results table: the analysis stage's input, loaded and validated.

One row is one replay of one schedule: a ``regime``, a ``policy``, a ``seed``
(the serving load), a ``draw`` (only for matched-random schedules) and the
replay's ``slo_violation_rate`` (a fraction in [0, 1]).

Policies with special roles:

* ``no_sync``: the same load replayed with no merges; every other policy is
  scored as *sync-excess* against the no-sync row of the same regime and seed.
* ``matched_random``: random schedules with the merge count of a controller
  run, drawn from the controller's own action space; each row is one draw of
  the matched-random envelope. ``matched_to`` names the controller whose
  count it copies. When the column is absent (or blank on a row), the draw
  matches every controller of that regime and seed.
* ``matched_random_free``: the secondary reference envelope (free placement).
* ``even_cadence``: the controller's count evenly spaced (one row per
  controller run): the fixed cadence a controller must beat first.
* ``slo_oracle``: the placement of the controller's count minimising the
  simulated SLO violations (headroom; the far end of ``gap closed``).
* ``offline_bound``: the least-busy-overlap placement (headroom only).

Every other policy, ``fixed_h`` included, is a *controller* (a claim
candidate). An optional ``eval_loss`` column on controller rows feeds the
training non-inferiority check. Validation fails
loudly with :class:`RunsTableError`, whose message starts with the table's
source (file path, or ``<DataFrame>``) and names the offending column, value
and row(s) (0-based data rows, header excluded).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import pandas as pd

from syncsafe.errors import BadInput

NO_SYNC = "no_sync"
MATCHED_RANDOM = "matched_random"
MATCHED_RANDOM_FREE = "matched_random_free"
EVEN_CADENCE = "even_cadence"
SLO_ORACLE = "slo_oracle"
OFFLINE_BOUND = "offline_bound"
FIXED_H = "fixed_h"
#: Policies with numbered draws.
DRAW_POLICIES = frozenset({MATCHED_RANDOM, MATCHED_RANDOM_FREE})
#: Schedules derived from one controller run (``matched_to`` names it).
MATCHED_POLICIES = frozenset({MATCHED_RANDOM, MATCHED_RANDOM_FREE, EVEN_CADENCE, SLO_ORACLE, OFFLINE_BOUND})
REFERENCE_POLICIES = frozenset({NO_SYNC}) | MATCHED_POLICIES

REQUIRED_COLUMNS = ("regime", "policy", "seed", "draw", "slo_violation_rate")
LATENCY_COLUMNS = (
    "p95_ms",
    "p99_ms",
    "tokens_per_s",
    "n_requests",
    "n_merges",
    "requests_during_merges",
    "eval_loss",
)
LABEL_COLUMNS = ("matched_to", "backend", "source")
BACKENDS = ("vllm", "simulator")
SOURCES = ("harness", "train", "live", MATCHED_RANDOM, MATCHED_RANDOM_FREE, EVEN_CADENCE, NO_SYNC, OFFLINE_BOUND,
           SLO_ORACLE)
RUN_KEY = ("regime", "policy", "seed", "draw", "matched_to")
#: The blocks of the policy table: the runs table analysed (in the pipeline: the simulator replays), and the
#: real vLLM replays judged on their own (evidence protocol item 8), never mixed with the other block.
MAIN_BLOCK = "main"
REAL_BLOCK = "vllm"

_SHOW_ROWS = 5  # offending rows quoted in an error message


class RunsTableError(BadInput):
    """A per-run results table that the evidence protocol cannot use."""

    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")
        self.source = source


def is_controller(policy: str) -> bool:
    """True for a claim candidate: any policy that is not a reference role."""
    return policy not in REFERENCE_POLICIES


@dataclass(frozen=True)
class RunsTable:
    """A validated runs table.

    ``frame`` has string ``regime``/``policy``/``matched_to`` (``matched_to``
    is always present, NA where blank), int64 ``seed``, nullable Int64
    ``draw`` and float ``slo_violation_rate``; optional columns are kept.
    """

    frame: pd.DataFrame
    source: str

    @property
    def regimes(self) -> list[str]:
        return sorted(self.frame["regime"].unique())

    @property
    def latency_columns(self) -> tuple[str, ...]:
        """The optional latency/merge columns this table carries."""
        return tuple(c for c in LATENCY_COLUMNS if c in self.frame.columns)

    def controller_runs(self) -> pd.DataFrame:
        """Rows of controller policies (``fixed_h`` included)."""
        return self.frame[self.frame["policy"].map(is_controller)]

    def matched_rows(self, policy: str = MATCHED_RANDOM) -> pd.DataFrame:
        """Rows of a derived `policy` with ``matched_to`` resolved to a controller.

        A row with a blank ``matched_to`` is repeated once per controller of
        its regime and seed, so every returned row names exactly one
        controller in ``matched_to``.
        """
        return _resolve_matched_to(self.frame, self.controller_runs(), policy)


def load_runs_table(runs: str | Path | pd.DataFrame) -> RunsTable:
    """Read (CSV or Parquet) and validate a per-run results table."""
    if isinstance(runs, pd.DataFrame):
        source, frame = "<DataFrame>", runs.copy()
    else:
        source, frame = str(runs), _read(Path(runs))
    return RunsTable(frame=_validated(frame, source), source=source)


def _read(path: Path) -> pd.DataFrame:
    source = str(path)
    if not path.is_file():
        raise RunsTableError(source, "runs table not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
    except (OSError, ValueError) as exc:  # pandas/pyarrow parse errors are ValueErrors
        raise RunsTableError(source, f"cannot read runs table: {exc}") from exc
    raise RunsTableError(source, f"unsupported runs table format {suffix!r} (use .csv or .parquet)")


def _validated(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    frame = frame.reset_index(drop=True)
    _check_required_columns(frame, source)
    if frame.empty:
        raise RunsTableError(source, "runs table is empty (no rows)")
    frame = frame.assign(
        regime=_labels(frame, "regime", source, required=True),
        policy=_labels(frame, "policy", source, required=True),
        seed=_integers(frame, "seed", source),
        slo_violation_rate=_rates(frame, source),
    )
    for column in LABEL_COLUMNS:
        frame[column] = _labels(frame, column, source, required=False)
    frame["draw"] = _draws(frame, source)
    for column in LATENCY_COLUMNS:
        if column in frame.columns:
            frame[column] = _numbers(frame, column, source)
    _check_choices(frame, "backend", BACKENDS, source)
    _check_choices(frame, "source", SOURCES, source)
    _check_unique_runs(frame, source)
    _check_no_sync_baselines(frame, source)
    _check_matched_to(frame, source)
    _check_draw_coverage(frame, source)
    _check_matched_counts(frame, source)
    _check_oracle_bound(frame, source)
    return frame


def _check_required_columns(frame: pd.DataFrame, source: str) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise RunsTableError(
            source,
            f"missing required column(s) {missing}; required: {list(REQUIRED_COLUMNS)}, "
            f"found: {list(frame.columns)}",
        )


def _fail_rows(source: str, column: str, problem: str, frame: pd.DataFrame, bad: pd.Series) -> NoReturn:
    rows = list(bad[bad].index[:_SHOW_ROWS])
    values = frame.loc[rows, column].tolist()
    more = "" if bad.sum() <= _SHOW_ROWS else f" (and {int(bad.sum()) - _SHOW_ROWS} more)"
    raise RunsTableError(source, f"column {column!r} {problem} at row(s) {rows}{more}: values {values}")


def _labels(frame: pd.DataFrame, column: str, source: str, *, required: bool) -> pd.Series:
    """A string column with surrounding blanks stripped; blanks become NA."""
    if column not in frame.columns:
        return pd.Series(pd.NA, index=frame.index, dtype="string")
    text = frame[column].astype("string").str.strip()
    text = text.mask(text == "")
    if required and text.isna().any():
        _fail_rows(source, column, "is empty", frame, text.isna())
    return text


def _numbers(frame: pd.DataFrame, column: str, source: str, *, problem: str = "must be numeric") -> pd.Series:
    """Floats; blanks become NaN, anything else unparsable fails with `problem`."""
    values = pd.to_numeric(frame[column], errors="coerce").astype(float)
    unparsable = values.isna() & frame[column].notna() & (frame[column].astype("string").str.strip() != "")
    if unparsable.any():
        _fail_rows(source, column, problem, frame, unparsable)
    return values


def _integers(frame: pd.DataFrame, column: str, source: str) -> pd.Series:
    values = _numbers(frame, column, source, problem="must be an integer")
    bad = values.isna() | (values != np.round(values))
    if bad.any():
        _fail_rows(source, column, "must be an integer", frame, bad)
    return values.astype("int64")


def _rates(frame: pd.DataFrame, source: str) -> pd.Series:
    column = "slo_violation_rate"
    values = _numbers(frame, column, source, problem="must be a fraction in [0, 1]")
    bad = values.isna() | (values < 0.0) | (values > 1.0)
    if bad.any():
        _fail_rows(source, column, "must be a fraction in [0, 1]", frame, bad)
    return values


def _draws(frame: pd.DataFrame, source: str) -> pd.Series:
    """``draw``: an integer on matched-random rows (either envelope), empty everywhere else."""
    values = _numbers(frame, "draw", source, problem="must be an integer")
    is_draw = frame["policy"].isin(DRAW_POLICIES)
    missing = is_draw & values.isna()
    if missing.any():
        _fail_rows(source, "draw", "is empty on matched_random row(s)", frame, missing)
    stray = ~is_draw & values.notna()
    if stray.any():
        _fail_rows(source, "draw", "must be empty except on matched_random rows", frame, stray)
    fractional = values.notna() & (values != np.round(values))
    if fractional.any():
        _fail_rows(source, "draw", "must be an integer", frame, fractional)
    return values.round().astype("Int64")


def _check_choices(frame: pd.DataFrame, column: str, allowed: tuple[str, ...], source: str) -> None:
    """Blank, or one of `allowed`."""
    bad = frame[column].notna() & ~frame[column].isin(allowed)
    if bad.any():
        _fail_rows(source, column, f"must be one of {list(allowed)}", frame, bad)


def _check_unique_runs(frame: pd.DataFrame, source: str) -> None:
    duplicated = frame.duplicated(list(RUN_KEY), keep=False)
    if duplicated.any():
        rows = list(duplicated[duplicated].index[:_SHOW_ROWS])
        hint = " (one backend per table: filter on 'backend' first)" if frame["backend"].nunique() > 1 else ""
        raise RunsTableError(
            source, f"duplicate runs for key {list(RUN_KEY)} at row(s) {rows}{hint}"
        )


def _pairs(frame: pd.DataFrame) -> set[tuple[str, int]]:
    return set(zip(frame["regime"], frame["seed"], strict=True))


def _check_no_sync_baselines(frame: pd.DataFrame, source: str) -> None:
    scored = frame[frame["policy"] != NO_SYNC]
    missing = sorted(_pairs(scored) - _pairs(frame[frame["policy"] == NO_SYNC]))
    if missing:
        raise RunsTableError(
            source,
            f"no {NO_SYNC!r} row for (regime, seed) {_quote(missing)}: "
            "sync-excess needs the no-sync replay of the same seed",
        )


def _check_matched_to(frame: pd.DataFrame, source: str) -> None:
    """A derived row's ``matched_to`` must name a controller run of its regime and seed."""
    derived = frame["policy"].isin(MATCHED_POLICIES)
    draws = frame[derived & frame["matched_to"].notna()]
    known = set(
        zip(frame["regime"], frame["seed"], frame["policy"], strict=True)
    )
    targets = zip(draws["regime"], draws["seed"], draws["matched_to"], strict=True)
    orphans = sorted({t for t in targets if t not in known or not is_controller(t[2])})
    if orphans:
        raise RunsTableError(
            source,
            f"column 'matched_to' names no controller run for (regime, seed, matched_to) "
            f"{_quote(orphans)}",
        )
    blank = frame[derived & frame["matched_to"].isna()]
    unmatched = sorted(_pairs(blank) - _pairs(frame[frame["policy"].map(is_controller)]))
    if unmatched:
        raise RunsTableError(
            source, f"matched_random draws with no controller run to match for (regime, seed) {_quote(unmatched)}"
        )
    stray = frame[~derived & frame["matched_to"].notna()]
    if not stray.empty:
        rows = list(stray.index[:_SHOW_ROWS])
        raise RunsTableError(
            source, f"column 'matched_to' must be empty except on {sorted(MATCHED_POLICIES)} rows, at row(s) {rows}"
        )


def _check_draw_coverage(frame: pd.DataFrame, source: str) -> None:
    """Every controller run has at least one matched-random draw, each draw once."""
    controllers = frame[frame["policy"].map(is_controller)]
    draws = _resolve_matched_to(frame, controllers, MATCHED_RANDOM)
    repeated = draws.duplicated(["regime", "seed", "matched_to", "draw"])
    if repeated.any():
        first = draws[repeated].iloc[0]
        raise RunsTableError(
            source,
            f"draw {first['draw']} matched to {first['matched_to']!r} appears twice in regime "
            f"{first['regime']!r} seed {first['seed']} (a blank 'matched_to' matches every controller)",
        )
    have = set(zip(draws["regime"], draws["seed"], draws["matched_to"], strict=True))
    need = set(zip(controllers["regime"], controllers["seed"], controllers["policy"], strict=True))
    missing = sorted(need - have)
    if missing:
        raise RunsTableError(
            source,
            f"controller run(s) without matched-random draws for (regime, seed, policy) {_quote(missing)}",
        )


def _with_controller(frame: pd.DataFrame, policy: str, column: str) -> pd.DataFrame:
    """Rows of a derived `policy` (their row numbers in ``row``) beside their controller's `column` (``ctrl``)."""
    controllers = frame[frame["policy"].map(is_controller)]
    derived = frame[frame["policy"] == policy].assign(row=lambda d: d.index)
    resolved = _resolve_matched_to(derived, controllers, policy)
    ref = controllers[["regime", "seed", "policy", column]].rename(columns={"policy": "matched_to", column: "ctrl"})
    return resolved.merge(ref.astype({"matched_to": "string"}), on=["regime", "seed", "matched_to"], how="inner")


def _check_matched_counts(frame: pd.DataFrame, source: str) -> None:
    """With an ``n_merges`` column: every derived schedule has its controller's merge count."""
    if "n_merges" not in frame.columns:
        return
    for policy in sorted(MATCHED_POLICIES):
        rows = _with_controller(frame, policy, "n_merges")
        bad = rows[rows["n_merges"].notna() & rows["ctrl"].notna() & (rows["n_merges"] != rows["ctrl"])]
        if not bad.empty:
            r = bad.iloc[0]
            raise RunsTableError(
                source, f"row {int(r['row'])}: {policy} of {r['matched_to']!r} (regime {r['regime']!r}, seed "
                f"{int(r['seed'])}) has {r['n_merges']:g} merges, its controller {r['ctrl']:g}: a matched schedule "
                "must copy the controller's merge count")


def _check_oracle_bound(frame: pd.DataFrame, source: str) -> None:
    """An SLO oracle is never worse than its controller or any of its draws (it had them as candidates)."""
    oracle = _with_controller(frame, SLO_ORACLE, "slo_violation_rate")
    if oracle.empty:
        return
    draws = frame[frame["policy"] == MATCHED_RANDOM]
    best_draw = (_resolve_matched_to(draws, frame[frame["policy"].map(is_controller)], MATCHED_RANDOM)
                 .groupby(["regime", "seed", "matched_to"])["slo_violation_rate"].min().rename("best_draw").reset_index())
    oracle = oracle.merge(best_draw, on=["regime", "seed", "matched_to"], how="left")
    bound = np.fmin(oracle["ctrl"].to_numpy(dtype=float), oracle["best_draw"].to_numpy(dtype=float))
    bad = oracle[oracle["slo_violation_rate"].to_numpy(dtype=float) > bound + 1e-12]
    if not bad.empty:
        r = bad.iloc[0]
        raise RunsTableError(
            source, f"row {int(r['row'])}: slo_oracle of {r['matched_to']!r} (regime {r['regime']!r}, seed "
            f"{int(r['seed'])}) violates {r['slo_violation_rate']:.4g}, more than min(controller, draws) "
            f"{min(r['ctrl'], r['best_draw']):.4g}: an oracle is never worse than its own candidates")


def _resolve_matched_to(frame: pd.DataFrame, controllers: pd.DataFrame, policy: str) -> pd.DataFrame:
    draws = frame[frame["policy"] == policy]
    named = draws[draws["matched_to"].notna()]
    targets = (
        controllers[["regime", "seed", "policy"]]
        .drop_duplicates()
        .rename(columns={"policy": "matched_to"})
    )
    blank = draws[draws["matched_to"].isna()].drop(columns="matched_to")
    expanded = blank.merge(targets, on=["regime", "seed"], how="inner")
    resolved = pd.concat([named, expanded[named.columns]], ignore_index=True)
    return resolved.astype({"matched_to": "string"})


def _quote(items: Iterable[tuple[object, ...]]) -> str:
    items = list(items)
    shown = ", ".join(str(tuple(str(x) for x in item)) for item in items[:_SHOW_ROWS])
    more = "" if len(items) <= _SHOW_ROWS else f" (and {len(items) - _SHOW_ROWS} more)"
    return shown + more
