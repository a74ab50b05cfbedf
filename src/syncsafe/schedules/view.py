"""The `syncsafe schedules` view: merges per seed and busy overlap per regime and policy."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from syncsafe.artifacts.layout import at
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.artifacts.traces import read_timeline
from syncsafe.schedules.schedule import LoadIntegral, busy_overlap_fraction, read_schedule


def summarize(root: Path = Path(".")) -> pd.DataFrame:
    """Per regime × policy (matched-random per controller): merges per seed and busy overlap."""
    index = read_schedule_index(root)
    loads: dict[tuple[str, int], LoadIntegral] = {}
    rows = []
    for rec in index.itertuples(index=False):
        key = (rec.regime, int(rec.seed))
        if key not in loads:
            loads[key] = LoadIntegral(read_timeline(root, rec.regime, int(rec.seed)))
        schedule = read_schedule(at(root, rec.path))
        label = rec.policy if pd.isna(rec.matched_to) else f"{rec.policy}[{rec.matched_to}]"
        rows.append(
            {
                "regime": rec.regime,
                "policy": label,
                "seed": int(rec.seed),
                "n_merges": schedule.n_merges,
                "overlap_s": busy_overlap_fraction(schedule, loads[key]) * schedule.n_merges * schedule.window_s,
                "window_s": schedule.n_merges * schedule.window_s,
            }
        )
    df = pd.DataFrame(rows)
    per_seed = df.groupby(["regime", "policy", "seed"], as_index=False).agg(
        n_merges=("n_merges", "mean"), overlap_s=("overlap_s", "sum"), window_s=("window_s", "sum")
    )
    table = per_seed.groupby(["regime", "policy"], as_index=False).agg(
        merges_per_seed=("n_merges", lambda s: " ".join(f"{v:g}" for v in s)),
        overlap_s=("overlap_s", "sum"),
        window_s=("window_s", "sum"),
    )
    table["busy_overlap"] = (table["overlap_s"] / table["window_s"]).where(table["window_s"] > 0, 0.0)
    # no_sync first, then each controller followed by the baselines matched to it
    controller = table["policy"].str.extract(r"\[(.+)\]$")[0].fillna(table["policy"])
    order = (controller != "no_sync").astype(int)
    table = table.assign(_c=controller, _o=order, _d=table["policy"] != controller)
    table = table.sort_values(["regime", "_o", "_c", "_d", "policy"]).reset_index(drop=True)
    return table[["regime", "policy", "merges_per_seed", "busy_overlap"]]


def print_summary(table: pd.DataFrame, console: Console | None = None) -> None:
    console = console or Console()
    for regime, part in table.groupby("regime", sort=False):
        t = Table(title=f"regime {regime}", title_justify="left")
        t.add_column("policy")
        t.add_column("merges per seed")
        t.add_column("busy overlap", justify="right")
        for rec in part.itertuples(index=False):
            t.add_row(escape(rec.policy), rec.merges_per_seed, f"{rec.busy_overlap:.1%}")
        console.print(t)
