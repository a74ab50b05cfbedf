"""The study's one picture: gap closed and SLO violations against the varied setting.

One column per axis (an ablation study has one: the ablated variants); the top row is the gap closed
(share of the random-to-oracle gap, 1 = the oracle), the bottom row the SLO violation rate. At each point and
regime: a small dot per seed, the mean with its bootstrap interval, and the tier the point's own protocol
gave the policy printed above. An ablation column also shows the full policy's mean in grey beside each
variant. Drawn on matplotlib's Agg canvas (no pyplot).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from syncsafe.analysis.figures import write_png
from syncsafe.config import policy_label
from syncsafe.io import atomic_path

PANELS = (("gap_closed", "gap closed (random = 0, oracle = 1)"), ("slo_pct", "SLO violations (%)"))
#: Short tier labels printed on the points.
TIER_ABBREV = {"stress harness only": "SH", "mechanism transfers": "MT", "beats fixed cadence": "FC",
               "beats matched random": "MR", "reference": "ref", "": "-"}


def study_figure(seeds: pd.DataFrame, rows: pd.DataFrame, title: str) -> Figure:
    axes_names = list(dict.fromkeys(seeds["axis"])) or ["(no points)"]
    regimes = sorted(seeds["regime"].unique())
    figure = Figure(figsize=(max(6.0, 4.8 * len(axes_names)), 7.5), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(len(PANELS), len(axes_names), squeeze=False)
    figure.suptitle(title)
    width = 0.7 / max(len(regimes), 1)
    for column, axis in enumerate(axes_names):
        points = list(dict.fromkeys(seeds.loc[seeds["axis"] == axis].sort_values("order")["point"]))
        labels = [policy_label(str(seeds.loc[seeds["point"] == p, "value"].iloc[0])) for p in points]
        for row, (metric, ylabel) in enumerate(PANELS):
            ax = grid[row][column]
            for k, regime in enumerate(regimes):
                offset = -0.35 + width * (k + 0.5)
                for x, point in enumerate(points):
                    here = seeds[(seeds["point"] == point) & (seeds["regime"] == regime)]
                    subject = pd.to_numeric(here.loc[here["role"] == "subject", metric], errors="coerce").dropna()
                    reference = pd.to_numeric(here.loc[here["role"] == "reference", metric], errors="coerce").dropna()
                    ax.scatter(np.full(len(subject), x + offset), subject, s=8, color=f"C{k}", alpha=0.45)
                    line = rows[(rows["point"] == point) & (rows["regime"] == regime)]
                    if line.empty or not len(subject):
                        continue
                    mean, low, high = (float(line.iloc[0][f"{metric}_{s}"]) for s in ("mean", "ci_low", "ci_high"))
                    ax.errorbar([x + offset], [mean], yerr=_yerr(mean, low, high), fmt="o", color=f"C{k}",
                                capsize=3, label=regime if (x == 0 and row == 0 and column == 0) else None)
                    if len(reference):
                        ax.scatter([x + offset], [reference.mean()], marker="D", s=22, facecolors="none",
                                   edgecolors="0.4", label="full policy (mean)" if (x == 0 and k == 0 and row == 0
                                                                                  and column == 0) else None)
                    if row == 0:
                        ax.annotate(TIER_ABBREV.get(str(line.iloc[0]["tier"]), str(line.iloc[0]["tier"])),
                                    (x + offset, 1.0), xycoords=("data", "axes fraction"), ha="center",
                                    va="bottom", fontsize="x-small")
            ax.set_xticks(range(len(points)), labels, rotation=20, ha="right", fontsize="small")
            ax.set_ylabel(ylabel)
            if row == len(PANELS) - 1:
                ax.set_xlabel(axis)
    grid[0][0].legend(fontsize="x-small", loc="lower left")
    figure.text(0.01, 0.0, "tiers: " + ", ".join(f"{v} {k}" for k, v in TIER_ABBREV.items() if k and v != "ref"),
                fontsize="x-small")
    return figure


def _yerr(mean: float, low: float, high: float) -> list[list[float]] | None:
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    return [[max(mean - low, 0.0)], [max(high - mean, 0.0)]]


def save_study_figure(seeds: pd.DataFrame, rows: pd.DataFrame, title: str, path: str | os.PathLike[str]) -> Path:
    with atomic_path(path) as tmp:
        write_png(study_figure(seeds, rows, title), tmp)
    return Path(path)
