"""Pipeline figures beyond the envelope: bursts vs merge windows, and training loss curves.

- `timeline_figure`: per regime, one row per policy on one seed's trace:
  serving bursts shaded, inference pressure as a line, each merge window as
  a bar (the paper's Figure 1, for every policy and its offline bound).
- `loss_curves_figure`: per regime, the mean island training loss per inner
  step and the merged model's held-out loss at each merge, per policy.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from syncsafe.artifacts import layout
from syncsafe.schedules.schedule import Schedule

TIMELINE_FIGURE = layout.TIMELINE_FIGURE_SUFFIX
LOSS_FIGURE = layout.LOSS_FIGURE_FILE


def timeline_figure(regime: str, seed: int, timeline: pd.DataFrame, schedules: list[Schedule]) -> Figure:
    rows = len(schedules)
    figure = Figure(figsize=(11.0, 0.7 * rows + 1.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    t = timeline["t_s"].to_numpy()
    step = float(t[1] - t[0]) if len(t) > 1 else 1.0
    for ax, schedule in zip(axes, schedules):
        ax.fill_between(t, 0, 1, where=timeline["busy"].to_numpy(), step="post", color="C3", alpha=0.18, linewidth=0)
        ax.plot(t, timeline["inference_pressure"], color="C3", linewidth=0.6, alpha=0.7)
        ax.broken_barh([(s, schedule.window_s) for s in schedule.merge_starts_s], (0.15, 0.7), color="C0")
        label = schedule.policy if not schedule.matched_to else f"{schedule.policy}[{schedule.matched_to}]"
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize="small")
        ax.set_yticks([])
        ax.set_ylim(0, 1)
    axes[-1].set_xlim(0, t[-1] + step)
    axes[-1].set_xlabel("trace time (s)")
    figure.suptitle(f"regime {regime}, seed {seed}: serving bursts (red) and merge windows (blue)")
    return figure


def loss_curves_figure(losses: pd.DataFrame, merges: pd.DataFrame) -> Figure:
    """`losses`: regime, policy, seed, step, loss; `merges`: regime, policy, seed, step, eval_loss."""
    regimes = sorted(losses["regime"].unique())
    figure = Figure(figsize=(5.0 * max(len(regimes), 1), 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(len(regimes), 1), squeeze=False)[0]
    for ax, regime in zip(axes, regimes):
        for i, (policy, part) in enumerate(losses[losses["regime"] == regime].groupby("policy")):
            curve = part.groupby("step")["loss"].mean()
            ax.plot(curve.index, curve.to_numpy(), color=f"C{i}", linewidth=0.9, label=policy)
            merged = merges[(merges["regime"] == regime) & (merges["policy"] == policy)]
            if "eval_loss" in merged and len(merged):
                ax.scatter(merged["step"], merged["eval_loss"], color=f"C{i}", s=10, marker="x")
        ax.set_title(f"{regime}: island training loss (lines), merged eval (x)", fontsize="medium")
        ax.set_xlabel("inner step")
        ax.set_ylabel("cross-entropy")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 7), fontsize="small")
    return figure
