"""The analyze stage in the pipeline: replay index in, reports/ out.

Reads the simulator replays (every schedule, every seed, filtered to the
regimes, seeds and policies in params) as the runs table of the evidence
protocol, with each controller run's final eval loss from training; the
mechanism evidence measured on the real vLLM server
(`runs/calibration/mechanism.json`; without it no policy gets past "stress
harness only"); the simulator's held-out fidelity (`runs/fidelity/
fidelity.json`; without a licensed simulator no policy gets past "mechanism
transfers"); and the declared primary test, alpha and loss margin from
params `analysis`. Writes to
`reports/`: the protocol's files (policy_table.csv, envelope.csv,
metrics.json, report.md, envelope figure), plus a timeline figure per regime
(bursts vs merge windows), the loss curves (figure and `loss_curves.csv` for
DVC plots), and report sections on the real replays and the calibration.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from syncsafe.analysis.analyze import AnalysisResult, analyze_runs
from syncsafe.analysis.figures import write_png
from syncsafe.analysis.live import live_section, live_tests
from syncsafe.analysis.stage_figures import LOSS_FIGURE, TIMELINE_FIGURE, loss_curves_figure, timeline_figure
from syncsafe.analysis.report import markdown_table
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_json
from syncsafe.artifacts.calibration import read_fidelity, read_mechanism
from syncsafe.artifacts.replay_sets import read_replay_index
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.artifacts.schedules import read_schedule
from syncsafe.artifacts.traces import read_timeline
from syncsafe.artifacts.train_runs import eval_losses, loss_curves
from syncsafe.config import Params

REPORTS_DIR = layout.REPORTS
MECHANISM = layout.MECHANISM
FIDELITY = layout.FIDELITY_EVIDENCE
CALIBRATION_REPORT = layout.CALIBRATION_REPORT
RUN_COLUMNS = ["regime", "policy", "seed", "draw", "slo_violation_rate", "matched_to", "backend", "p95_ms", "p99_ms",
               "n_requests", "requests_during_merges", "n_merges", "tokens_per_s"]


def pipeline_runs(params: Params, root: Path) -> pd.DataFrame:
    """The simulator replays of the regimes, seeds and policies in `params`, as the protocol's runs table."""
    index = read_replay_index(root)
    controllers = set(params.control.policies)
    runs = index[
        (index["backend"] == "simulator")
        & index["regime"].isin(list(params.regimes))
        & index["seed"].isin(params.seeds)
        & (index["policy"].isin(controllers) | index["matched_to"].isin(controllers) | (index["policy"] == "no_sync"))
    ]
    if runs.empty:
        raise ValueError(f"{layout.at(root, layout.REPLAY_INDEX)}: no simulator replays of the regimes and seeds "
                         "in params")
    runs = runs[[c for c in RUN_COLUMNS if c in runs.columns]].reset_index(drop=True)
    # final eval loss of every trained controller run (none when schedules came from the harness)
    return runs.merge(eval_losses(root), on=["regime", "policy", "seed"], how="left")


def _timeline_figures(params: Params, root: Path) -> dict[str, object]:
    index = read_schedule_index(root)
    seed = params.seeds[0]
    figures = {}
    for regime in params.regimes:
        rows = index[(index["regime"] == regime) & (index["seed"] == seed)
                     & index["source"].isin(["train", "harness", "live", "no_sync"])]
        order = sorted(rows.itertuples(), key=lambda r: (r.source == "offline_bound", r.source == "no_sync", r.policy))
        schedules = [read_schedule(layout.at(root, r.path)) for r in order]
        figures[f"{layout.FIGURES_DIR}/{regime}_{TIMELINE_FIGURE}"] = timeline_figure(
            regime, seed, read_timeline(root, regime, seed), schedules)
    return figures


def _real_replay_section(root: Path) -> str:
    index = read_replay_index(root)
    real = index[index["backend"] == "vllm"]
    if real.empty:
        return "## Real replays (vLLM)\n\nNo vLLM replays in this run: no serving claim can be made."
    rows = [
        [r.regime, r.policy if pd.isna(r.matched_to) else f"{r.policy}[{r.matched_to}]", r.seed,
         "" if pd.isna(r.draw) else int(r.draw), f"{100 * r.slo_violation_rate:.1f}", f"{r.p95_ms:.0f}",
         r.n_requests, r.n_failed, "yes" if getattr(r, "valid", True) else "NO"]
        for r in real.itertuples()
    ]  # fmt: skip
    plan = _plan_lines(root)
    invalid = real[~real["valid"].astype(bool)] if "valid" in real.columns else real.iloc[0:0]
    note = (f"\n\n{len(invalid)} of {len(real)} real replays are invalid and license nothing (their seeds are left "
            "out of the gate, the fit and the fidelity check; reasons in the calibration report)." if len(invalid) else "")
    return ("## Real replays (vLLM)\n\n" + (plan + "\n\n" if plan else "")
            + markdown_table(["regime", "policy", "seed", "draw", "SLO violations %", "p95 ms", "requests", "failed",
                              "valid"], rows) + note)


def _plan_lines(root: Path) -> str:
    """The real arm's plan per regime (load, span, what was replayed, planned power), from its plan.json."""
    path = layout.at(root, layout.VLLM_PLAN)
    if not path.is_file():
        return ""
    plan = read_json(path, "real-arm plan")
    lines = []
    for regime, p in sorted(plan.get("regimes", {}).items()):
        load = plan.get("loads", {}).get(regime, {})
        lines.append(
            f"- {regime}: capacity {load.get('capacity_rps', float('nan')):.3g} requests/s, busiest window at "
            f"{load.get('utilisation', float('nan')):.0%} of it (time scale {p['time_scale']:.3g}); span "
            f"[0, {p['span_s']:g}) s of seeds {p['fit_seeds'] + p['held_out_seeds']}; {', '.join(p['controllers'])} with "
            f"{p['draws']} span-matched draws and {p['controls']} no-sync controls; planned gate power "
            f"{(p.get('power') or 0.0):.0%} (target {plan.get('power_target', 0.8):.0%})"
            + (f"; left out for the budget: {', '.join(p['left_out'])}" if p.get("left_out") else ""))
    placement = plan.get("placement") or {}
    if placement:
        lines.append(f"- placement: {placement.get('mode')} (client CPUs {placement.get('client_cpus')}, server and "
                     f"merge work CPUs {placement.get('server_cpus')})")
    return "\n".join(lines)


def _calibration_section(root: Path, mechanism: MechanismEvidence | None) -> str:
    if mechanism is None or not mechanism.regimes:
        return (f"## Calibration\n\nNo mechanism evidence (`{MECHANISM.as_posix()}`): the calibrate stage has "
                "not run on real replays, so every verdict stays at *stress harness only*.")
    lines = [f"- {regime}: {mechanism.describe(regime)}" for regime in sorted(mechanism.regimes)]
    link = (f"\n\nFit and held-out fidelity: `{CALIBRATION_REPORT.as_posix()}`."
            if layout.at(root, CALIBRATION_REPORT).is_file() else "")
    return "## Calibration\n\n" + "\n".join(lines) + link


def analyze_pipeline(params: Params, root: Path = Path("."), alpha: float | None = None) -> AnalysisResult:
    """The analyze stage: protocol on the simulator replays, real replays and training alongside."""
    root = Path(root)
    mechanism = read_mechanism(root, MechanismEvidence)
    fidelity = read_fidelity(root, FidelityEvidence)
    losses, merges = loss_curves(root)
    figures = _timeline_figures(params, root)
    loss_figure = f"{layout.FIGURES_DIR}/{LOSS_FIGURE}"
    if len(losses):
        figures[loss_figure] = loss_curves_figure(losses, merges)
    settings = params.analysis
    alpha = settings.alpha if alpha is None else alpha
    judged = mechanism.model_copy(update={"gate_ratio_threshold": settings.gate_ratio_threshold}) if mechanism else None
    sections = [_real_replay_section(root), _calibration_section(root, judged)]
    sections.append(live_section(root, alpha, judged))  # runs/live/, if any: its tests join the table's family
    sections += [f"## Bursts and merge windows: {Path(name).name.split('_' + TIMELINE_FIGURE)[0]}\n\n![timeline]({name})"
                 for name in figures if name.endswith(TIMELINE_FIGURE)]
    if loss_figure in figures:
        sections.append(f"## Training\n\n![loss curves]({loss_figure})")
    extra_files = {name: (lambda fig: lambda tmp: write_png(fig, tmp))(fig) for name, fig in figures.items()}
    extra_files[layout.LOSS_CURVES_FILE] = lambda tmp: losses.to_csv(tmp, index=False)
    return analyze_runs(pipeline_runs(params, root), layout.reports_dir(root), mechanism=mechanism, fidelity=fidelity,
                        primary=(settings.primary.policy, settings.primary.regime), loss_margin=settings.loss_margin,
                        alpha=alpha, extra_sections=sections, extra_files=extra_files, extra_tests=live_tests(root),
                        targets=settings.fidelity, gate_ratio_threshold=settings.gate_ratio_threshold,
                        source=f"simulator replays of {layout.REPLAY_INDEX.as_posix()} "
                               "(the regimes, seeds and policies in params)")
