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

import json
from pathlib import Path

import pandas as pd

from syncsafe.analysis.analyze import AnalysisResult, analyze_runs
from syncsafe.analysis.figures import write_png
from syncsafe.analysis.live import live_section
from syncsafe.analysis.pipeline_figures import LOSS_FIGURE, TIMELINE_FIGURE, loss_curves_figure, timeline_figure
from syncsafe.analysis.report import markdown_table
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.config import Params
from syncsafe.schedules.schedule import read_schedule
from syncsafe.schedules.stage import SCHEDULE_INDEX, read_index
from syncsafe.serving.replay import read_replay_index
from syncsafe.traces.stage import load_timeline

REPORTS_DIR = Path("reports")
MECHANISM = Path("runs") / "calibration" / "mechanism.json"
FIDELITY = Path("runs") / "fidelity" / "fidelity.json"
CALIBRATION_REPORT = Path("runs") / "calibration" / "report.md"
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
        raise ValueError(f"{Path(root) / 'runs/replay/index.csv'}: no simulator replays of the regimes and seeds in params")
    runs = runs[[c for c in RUN_COLUMNS if c in runs.columns]].reset_index(drop=True)
    return runs.merge(_eval_losses(root), on=["regime", "policy", "seed"], how="left")


def _eval_losses(root: Path) -> pd.DataFrame:
    """Final eval loss of every trained controller run (empty when schedules came from the harness)."""
    rows = []
    for path in sorted((Path(root) / "runs" / "train").glob("*/*/seed-*/metrics.json")):
        run = path.parent
        metrics = json.loads(path.read_text(encoding="utf-8"))
        if "final_eval_loss" in metrics:
            rows.append({"regime": run.parent.parent.name, "policy": run.parent.name,
                         "seed": int(run.name.removeprefix("seed-")), "eval_loss": float(metrics["final_eval_loss"])})
    return pd.DataFrame(rows, columns=["regime", "policy", "seed", "eval_loss"]).astype({"seed": "int64"})


def _timeline_figures(params: Params, root: Path) -> dict[str, object]:
    index = read_index(Path(root) / SCHEDULE_INDEX)
    seed = params.seeds[0]
    figures = {}
    for regime in params.regimes:
        rows = index[(index["regime"] == regime) & (index["seed"] == seed)
                     & index["source"].isin(["train", "harness", "live", "no_sync"])]
        order = sorted(rows.itertuples(), key=lambda r: (r.source == "offline_bound", r.source == "no_sync", r.policy))
        schedules = [read_schedule(Path(root) / r.path) for r in order]
        figures[f"figures/{regime}_{TIMELINE_FIGURE}"] = timeline_figure(regime, seed, load_timeline(root, regime, seed), schedules)
    return figures


def _training_curves(params: Params, root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    losses, merges = [], []
    for run in sorted((Path(root) / "runs" / "train").glob("*/*/seed-*")):
        if not (run / "metrics.json").is_file():
            continue
        key = {"regime": run.parent.parent.name, "policy": run.parent.name, "seed": int(run.name.removeprefix("seed-"))}
        losses.append(pd.read_csv(run / "losses.csv").groupby("step", as_index=False)["loss"].mean().assign(**key))
        merged = pd.read_csv(run / "merges.csv") if (run / "merges.csv").stat().st_size > 1 else pd.DataFrame()
        if "eval_loss" in merged:
            merges.append(merged[["step", "eval_loss"]].assign(**key))
    cols = ["regime", "policy", "seed", "step"]
    loss_df = pd.concat(losses, ignore_index=True)[[*cols, "loss"]] if losses else pd.DataFrame(columns=[*cols, "loss"])
    merge_df = pd.concat(merges, ignore_index=True) if merges else pd.DataFrame(columns=[*cols, "eval_loss"])
    return loss_df, merge_df


def _real_replay_section(root: Path) -> str:
    index = read_replay_index(root)
    real = index[index["backend"] == "vllm"]
    if real.empty:
        return "## Real replays (vLLM)\n\nNo vLLM replays in this run: no serving claim can be made."
    rows = [
        [r.regime, r.policy if pd.isna(r.matched_to) else f"{r.policy}[{r.matched_to}]", r.seed,
         "" if pd.isna(r.draw) else int(r.draw), f"{100 * r.slo_violation_rate:.1f}", f"{r.p95_ms:.0f}",
         r.n_requests, r.n_failed]
        for r in real.itertuples()
    ]  # fmt: skip
    return "## Real replays (vLLM)\n\n" + markdown_table(
        ["regime", "policy", "seed", "draw", "SLO violations %", "p95 ms", "requests", "failed"], rows)


def _calibration_section(root: Path, mechanism: MechanismEvidence | None) -> str:
    if mechanism is None or not mechanism.regimes:
        return ("## Calibration\n\nNo mechanism evidence (`runs/calibration/mechanism.json`): the calibrate stage has "
                "not run on real replays, so every verdict stays at *stress harness only*.")
    lines = [f"- {regime}: {mechanism.describe(regime)}" for regime in sorted(mechanism.regimes)]
    link = f"\n\nFit and held-out fidelity: `{CALIBRATION_REPORT}`." if (Path(root) / CALIBRATION_REPORT).is_file() else ""
    return "## Calibration\n\n" + "\n".join(lines) + link


def analyze_pipeline(params: Params, root: Path = Path("."), alpha: float | None = None) -> AnalysisResult:
    """The analyze stage: protocol on the simulator replays, real replays and training alongside."""
    root = Path(root)
    mechanism = MechanismEvidence.read(root / MECHANISM) if (root / MECHANISM).is_file() else None
    fidelity = FidelityEvidence.read(root / FIDELITY) if (root / FIDELITY).is_file() else None
    losses, merges = _training_curves(params, root)
    figures = _timeline_figures(params, root)
    if len(losses):
        figures[f"figures/{LOSS_FIGURE}"] = loss_curves_figure(losses, merges)
    sections = [_real_replay_section(root), _calibration_section(root, mechanism)]
    sections.append(live_section(root, params.analysis.alpha if alpha is None else alpha))  # runs/live/, if any
    sections += [f"## Bursts and merge windows: {Path(name).name.split('_' + TIMELINE_FIGURE)[0]}\n\n![timeline]({name})"
                 for name in figures if name.endswith(TIMELINE_FIGURE)]
    if f"figures/{LOSS_FIGURE}" in figures:
        sections.append(f"## Training\n\n![loss curves](figures/{LOSS_FIGURE})")
    extra_files = {name: (lambda fig: lambda tmp: write_png(fig, tmp))(fig) for name, fig in figures.items()}
    extra_files["loss_curves.csv"] = lambda tmp: losses.to_csv(tmp, index=False)
    settings = params.analysis
    return analyze_runs(pipeline_runs(params, root), root / REPORTS_DIR, mechanism=mechanism, fidelity=fidelity,
                        primary=(settings.primary.policy, settings.primary.regime), loss_margin=settings.loss_margin,
                        alpha=settings.alpha if alpha is None else alpha, extra_sections=sections,
                        extra_files=extra_files,
                        source="simulator replays of runs/replay/index.csv (the regimes, seeds and policies in params)")
