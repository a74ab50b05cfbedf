"""The `syncsafe replay` view: SLO violation rate and p95 per backend, regime and policy."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from syncsafe.serving.replay import read_replay_index


def print_replay_summary(root: Path = Path("."), console: Console | None = None) -> None:
    index = read_replay_index(root)
    index["label"] = index["policy"].where(index["matched_to"].isna(), index["policy"] + "[" + index["matched_to"].fillna("") + "]")
    console = console or Console()
    for (backend, regime), part in index.groupby(["backend", "regime"], sort=False):
        table = Table(title=f"{backend} · regime {regime}", title_justify="left")
        for col, justify in (("policy", "left"), ("replays", "right"), ("SLO violations", "right"),
                             ("p95 ms", "right"), ("sync ratio (unpaired)", "right")):
            table.add_column(col, justify=justify, no_wrap=col == "policy")  # a label stays one searchable line
        agg = part.groupby("label", sort=True).agg(n=("seed", "size"), slo=("slo_violation_rate", "mean"),
                                                   p95=("p95_ms", "mean"), sync=("sync_ratio_unpaired", "mean"))
        for label, rec in agg.iterrows():
            sync = "" if rec.sync != rec.sync else f"{rec.sync:.2f}"
            table.add_row(escape(label), str(int(rec.n)), f"{rec.slo:.1%}", f"{rec.p95:.0f}", sync)
        console.print(table)
