"""Figures for the report: SLO by policy with the per-seed matched-random envelope.

Drawn on matplotlib's Agg canvas directly (no pyplot, no global state), so it
works headless and in parallel. One column per regime; the top row is raw
SLO violations %, the bottom row sync-excess % (0 = the seed's no-sync
replay). Each controller gets one slot per seed: a grey bar from the
envelope's min to max, a grey tick at its mean and the policy's own value as
a coloured dot, so a reader sees at a glance whether a dot sits below the
tick on most seeds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from syncsafe.artifacts import layout
from syncsafe.io import atomic_path

ENVELOPE_FIGURE = layout.ENVELOPE_FIGURE_FILE
PANELS = (("slo_pct", "mr_slo_pct", "SLO violations (%)"), ("sync_excess_pct", "mr_sync_excess_pct", "sync-excess (pp)"))
SLOT_WIDTH = 0.8
DPI = 120


def envelope_figure(seeds: pd.DataFrame) -> Figure:
    """Build the figure from :func:`syncsafe.analysis.protocol.seed_scores` output."""
    controllers = seeds[seeds["n_draws"].notna()]
    regimes = sorted(controllers["regime"].unique()) or ["(no controller runs)"]
    figure = Figure(figsize=(max(6.0, 4.5 * len(regimes)), 7.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(PANELS), len(regimes), squeeze=False)
    for column, regime in enumerate(regimes):
        runs = controllers[controllers["regime"] == regime]
        for row, (value, envelope, label) in enumerate(PANELS):
            _draw_panel(axes[row][column], runs, value, envelope)
            axes[row][column].set_ylabel(label)
        axes[0][column].set_title(f"regime: {regime}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize="small")
    return figure


def save_envelope_figure(seeds: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Atomically write :func:`envelope_figure` as PNG to `path`."""
    with atomic_path(path) as tmp:
        write_png(envelope_figure(seeds), tmp)
    return Path(path)


def write_png(figure: Figure, path: str | os.PathLike[str]) -> None:
    """Render `figure` as PNG to `path` (whatever the file name's suffix)."""
    figure.savefig(path, format="png", dpi=DPI)


def _draw_panel(ax: Axes, runs: pd.DataFrame, value: str, envelope: str) -> None:
    policies = sorted(runs["policy"].unique())
    for slot, policy in enumerate(policies):
        per_seed = runs[runs["policy"] == policy].sort_values("seed")
        step = SLOT_WIDTH / max(len(per_seed), 1)
        x = [slot - SLOT_WIDTH / 2 + step * (i + 0.5) for i in range(len(per_seed))]
        first = slot == 0
        ax.vlines(x, per_seed[f"{envelope}_min"], per_seed[f"{envelope}_max"], color="0.7", linewidth=3,
                  label="matched-random min-max" if first else None)
        ax.scatter(x, per_seed[f"{envelope}_mean"], marker="_", s=120, color="0.3",
                   label="matched-random mean" if first else None, zorder=3)
        ax.scatter(x, per_seed[value], marker="o", s=18, color="C0", label="policy (per seed)" if first else None, zorder=4)
    if value.startswith("sync_excess"):
        ax.axhline(0.0, color="0.5", linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(policies)), policies, rotation=30, ha="right", fontsize="small")
