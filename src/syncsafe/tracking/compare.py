"""The policy x seed compare table from ``mlflow.search_runs``."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from syncsafe.errors import BadInput
from syncsafe.tracking.settings import (
    DEFAULT_METRIC,
    TAG_KIND,
    TAG_PIPELINE,
    TrackingError,
    experiment_name,
    one_line,
    preflight,
    redact,
    sqlite_path,
    tracking_uri,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

def search_item_runs(
    *,
    regime: str | None = None,
    stage: str | None = None,
    pipeline_run: str | None = None,
    uri: str | None = None,
    root: str | os.PathLike[str] = ".",
    experiment: str | None = None,
) -> pd.DataFrame:
    """``mlflow.search_runs`` over the pipeline's experiment: every item run (pandas)."""
    uri = uri or tracking_uri(root)
    experiment = experiment or experiment_name()
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise FileNotFoundError(f"{db}: no tracking store; run the pipeline first (or set MLFLOW_TRACKING_URI)")
    try:
        import mlflow

        preflight(uri)
        exp = mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
        if exp is None:
            raise ValueError(f"no experiment {experiment!r} in {redact(uri)}: nothing tracked yet")
        clauses = [f"tags.`{TAG_KIND}` = 'item'"]
        for key, value in (("regime", regime), ("stage", stage), (f"`{TAG_PIPELINE}`", pipeline_run)):
            if value:
                clauses.append(f"tags.{key} = '{_quote(value)}'")
        with _using_uri(uri):
            return mlflow.search_runs(
                experiment_ids=[exp.experiment_id], filter_string=" and ".join(clauses), output_format="pandas"
            )
    except (ValueError, FileNotFoundError, TrackingError):
        raise
    except Exception as err:  # noqa: BLE001
        raise TrackingError(f"could not read runs from {redact(uri)}: {one_line(err)}") from err


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


@contextlib.contextmanager
def _using_uri(uri: str) -> Iterator[None]:
    try:
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    except ImportError:  # pragma: no cover - private helper moved
        import mlflow

        old = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(uri)
        try:
            yield
        finally:
            mlflow.set_tracking_uri(old)
        return
    with _use_tracking_uri(uri):
        yield


def compare_table(
    regime: str | None = None,
    metric: str = DEFAULT_METRIC,
    *,
    stage: str | None = None,
    pipeline_run: str | None = None,
    uri: str | None = None,
    root: str | os.PathLike[str] = ".",
    experiment: str | None = None,
) -> pd.DataFrame:
    """The policy x seed table of `metric` from the tracked item runs.

    One row per (regime, policy, matched_to, backend) over the runs without a
    draw; columns ``seed_<s>`` (the value), ``n_seeds``, ``mean``, ``sd``
    (sample sd, NaN for one seed) and, where matched-random draws name the row's
    policy as ``matched_to`` (same regime, backend and seed), the per-seed
    envelope ``mr_seed_<s>_{min,mean,max}`` and its average over seeds
    ``mr_{min,mean,max}`` with ``mr_draws`` draws in all.

    When several runs share a (stage, regime, policy, matched_to, backend,
    seed, draw) key, as after nightly runs, the latest is used; pass
    ``pipeline_run`` to read one pipeline run only. If the metric comes from
    more than one stage, ``stage`` must say which.
    """
    runs = search_item_runs(
        regime=regime, stage=stage, pipeline_run=pipeline_run, uri=uri, root=root, experiment=experiment
    )
    return build_compare_table(runs, metric)


_KEY = ("regime", "policy", "matched_to", "backend")


def build_compare_table(runs: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """:func:`compare_table` on an ``mlflow.search_runs`` frame (for tests and custom searches)."""
    import pandas as pd

    column = f"metrics.{metric}"
    if runs.empty or column not in runs.columns or runs[column].notna().sum() == 0:
        available = sorted(c.removeprefix("metrics.") for c in runs.columns if c.startswith("metrics."))
        raise BadInput(f"--metric {metric!r}: no tracked run has it"
                       + (f"; tracked metrics: {', '.join(available)}" if available else ""))
    df = pd.DataFrame({"value": runs[column], "start_time": runs.get("start_time")})
    for tag in ("stage", *_KEY, "seed", "draw"):
        df[tag] = runs.get(f"tags.{tag}", pd.Series("", index=runs.index)).fillna("").astype(str)
    df = pd.concat([df, _reference_rows(runs, metric)], ignore_index=False)
    df = df[df["value"].notna()]
    stages = sorted(df["stage"].unique())
    if len(stages) > 1:
        raise BadInput(f"--metric {metric!r} is logged by stages {', '.join(stages)}; choose one with --stage")
    df = df.sort_values("start_time", kind="stable").drop_duplicates(
        ["stage", *_KEY, "seed", "draw"], keep="last"
    )
    seeds = sorted(df["seed"].unique(), key=_seed_order)
    own = df[df["draw"] == ""]
    envelope = _envelope(df[df["draw"] != ""], runs, metric)
    rows = []
    for key, group in own.groupby(list(_KEY), sort=False):
        row: dict[str, Any] = dict(zip(_KEY, key))
        by_seed = dict(zip(group["seed"], group["value"]))
        values = [by_seed[s] for s in seeds if s in by_seed]
        for s in seeds:
            row[f"seed_{s}"] = by_seed.get(s, math.nan)
        row["n_seeds"] = len(values)
        row["mean"] = statistics.fmean(values)
        row["sd"] = statistics.stdev(values) if len(values) > 1 else math.nan
        env = envelope[
            (envelope["regime"] == row["regime"])
            & (envelope["policy"] == row["policy"])
            & (envelope["backend"] == row["backend"])
        ]
        env_seeds = env[env["seed"].isin(list(by_seed))]
        row["mr_draws"] = int(env_seeds["count"].sum())
        for stat in ("min", "mean", "max"):
            row[f"mr_{stat}"] = float(env_seeds[stat].mean()) if len(env_seeds) else math.nan
        per_seed = env_seeds.set_index("seed")
        for s in seeds:
            for stat in ("min", "mean", "max"):
                row[f"mr_seed_{s}_{stat}"] = float(per_seed.at[s, stat]) if s in per_seed.index else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        raise ValueError(f"no tracked runs without a draw have metric {metric!r}")
    table["_order"] = table["policy"].map(_policy_order)
    table = table.sort_values(["regime", "_order", "matched_to", "backend"], kind="stable").drop(columns="_order")
    table.attrs.update(metric=metric, stage=stages[0], seeds=seeds)
    return table.reset_index(drop=True)


#: References of a controller that are part of its run (``<policy>.<metric>``), shown as rows of their own.
_REFERENCES = ("even_cadence", "slo_oracle", "offline_bound")
#: Numbered draws of a controller, part of its run (``<policy>.<metric>.min/mean/max``, ``<policy>.n``).
_DRAW_POLICIES = ("matched_random", "matched_random_free")


def _tags(runs: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({t: runs.get(f"tags.{t}", pd.Series("", index=runs.index)).fillna("").astype(str)
                         for t in names}, index=runs.index)


def _reference_rows(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """A row per reference a controller's run holds (its even cadence, SLO oracle, offline bound), keyed as
    the reference's own run used to be: policy the reference, ``matched_to`` the controller."""
    import pandas as pd

    frames = []
    for reference in _REFERENCES:
        column = f"metrics.{reference}.{metric}"
        if column not in runs.columns:
            continue
        has = runs[column].notna()
        rows = _tags(runs[has], ("stage", "regime", "backend", "seed"))
        rows["matched_to"] = runs.loc[has, "tags.policy"].astype(str)
        rows["policy"], rows["draw"] = reference, ""
        rows["value"], rows["start_time"] = runs.loc[has, column], runs.loc[has, "start_time"]
        frames.append(rows)
    return pd.concat(frames) if frames else pd.DataFrame(columns=["value", "start_time", "stage", *_KEY, "seed", "draw"])


def _envelope(draws: pd.DataFrame, runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (regime, policy, backend, seed): min, mean, max and count of the numbered draws' values (fair and
    free matched random alike) matched to the policy.

    From the controller's own run (``<draw policy>.<metric>.min/mean/max`` and ``<draw policy>.n``: draws are
    part of their controller's run) and, in stores written before, from draw runs of their own."""
    import pandas as pd

    keys = ["regime", "policy", "backend", "seed"]
    frames = []
    for policy in _DRAW_POLICIES:
        columns = [f"metrics.{policy}.{metric}.{s}" for s in ("min", "mean", "max")] + [f"metrics.{policy}.n"]
        if not all(c in runs.columns for c in columns):
            continue
        has = runs[columns[-1]].notna() & runs[columns[1]].notna()
        part = _tags(runs[has], keys)
        part[["min", "mean", "max", "count"]] = runs.loc[has, columns].to_numpy(dtype=float)
        frames.append(part)
    if len(draws):
        frames.append(draws.groupby(["regime", "matched_to", "backend", "seed"])["value"]
                      .agg(["min", "mean", "max", "count"]).reset_index().rename(columns={"matched_to": "policy"}))
    if not frames:
        return pd.DataFrame(columns=[*keys, "min", "mean", "max", "count"])
    parts = pd.concat(frames, ignore_index=True)
    parts["total"] = parts["mean"] * parts["count"]
    merged = parts.groupby(keys).agg(min=("min", "min"), max=("max", "max"), total=("total", "sum"),
                                     count=("count", "sum")).reset_index()
    merged["mean"] = merged["total"] / merged["count"]
    return merged.drop(columns="total")


def _seed_order(seed: str) -> tuple[int, int | str]:
    return (0, int(seed)) if seed.lstrip("-").isdigit() else (1, seed)


def _policy_order(policy: str) -> str:
    """no_sync, fixed_h and the controllers in their params order, other policies, offline_bound."""
    from syncsafe.config import CONTROLLER_POLICIES, split_policy

    if policy == "no_sync":
        return "0"
    try:
        base, term = split_policy(policy)
    except ValueError:
        base, term = "", None
    if base:  # an ablated variant right after its policy
        return f"1:{CONTROLLER_POLICIES.index(base):03d}:{term or ''}"
    if policy in ("matched_random", "offline_bound"):
        return f"3:{policy}"
    return f"2:{policy}"


def render_table(table: pd.DataFrame, fmt: str = "md") -> str:
    """The compare table as Markdown (``md``) or CSV (``csv``)."""
    if fmt == "csv":
        return table.to_csv(index=False, float_format="%.10g")
    if fmt != "md":
        raise ValueError(f"--format {fmt!r}: expected md or csv")
    seeds = table.attrs.get("seeds") or [c.removeprefix("seed_") for c in table.columns if c.startswith("seed_")]
    extra = [c for c in ("matched_to", "backend") if c in table and (table[c] != "").any()]
    envelope = "matched-random min / mean / max (draws)"
    header = ["regime", "policy", *extra, *(f"seed {s}" for s in seeds), "mean ± sd", envelope]
    lines = []
    metric, stage = table.attrs.get("metric"), table.attrs.get("stage")
    if metric:
        where = f" (stage {stage})" if stage else ""
        lines += [f"**{metric}**{where}; per seed: value (matched-random min / mean / max)", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.to_dict("records"):
        cells = [row["regime"], row["policy"], *(row[c] for c in extra)]
        for s in seeds:
            cell = _num(row.get(f"seed_{s}"))
            if not _isnan(row.get(f"mr_seed_{s}_mean")):
                cell += " ({} / {} / {})".format(*(_num(row[f"mr_seed_{s}_{k}"]) for k in ("min", "mean", "max")))
            cells.append(cell)
        cells.append(f"{_num(row['mean'])} ± {_num(row['sd'])}")
        stats = " / ".join(_num(row[f"mr_{k}"]) for k in ("min", "mean", "max"))
        cells.append(f"{stats} ({row['mr_draws']})" if row.get("mr_draws") else "–")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _isnan(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _num(value: Any) -> str:
    return "–" if _isnan(value) else f"{float(value):.4g}"
