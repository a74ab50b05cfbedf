"""The analyze stage in the pipeline: replay index in, reports/ out.

Reads the simulator replays (every schedule, every seed, filtered to the
regimes, seeds and policies in params) as the runs table of the evidence
protocol, with each controller run's final eval loss from training; the
real vLLM replays of the real arm's planned seeds (the primary controller,
its span-matched draws and span cadence: `pipeline_real_runs`) as the
real-only block, judged on its own in the same test family; the
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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from syncsafe.analysis.analyze import AnalysisResult, analyze_runs
from syncsafe.analysis.figures import write_png
from syncsafe.analysis.headroom import headroom_section
from syncsafe.analysis.live import live_section, live_tests
from syncsafe.analysis.stage_figures import LOSS_FIGURE, TIMELINE_FIGURE, loss_curves_figure, timeline_figure
from syncsafe.analysis.report import markdown_table
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.analysis.protocol import smallest_rank_p, smallest_sign_p
from syncsafe.analysis.runs_table import EVEN_CADENCE, MATCHED_RANDOM, NO_SYNC, REAL_BLOCK
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


# --------------------------------------------------------------------------- the real-only block
# From the replay index's `backend == "vllm"` rows (the real arm's runs/replay-sets/vllm/index.csv), per
# planned regime and seed: `no_sync` (the seed's first no-sync control; the later controls are in
# repeats.csv and are no rows of a runs table), the controller (`source` train or harness; the declared
# primary), its span-matched draws (`matched_random`, `matched_to` the controller) and its span's evenly
# spaced schedule of the same counts (`even_cadence`, `matched_to` the controller). A replay marked invalid
# (`valid` false: too many failures, a late load generator, a busy machine) licenses nothing and is left
# out; a seed without its valid no-sync control, its valid controller replay or a valid draw is left out
# whole, and a seed without a valid even cadence stays out of the cadence test only. Every exclusion comes
# back as a note for the report. `syncsafe.analysis.protocol.run_protocol` scores the rows as the block
# `REAL_BLOCK`, never pooled with the simulator's.

#: Sources of a controller's own schedule.
CONTROLLER_SOURCES = ("train", "harness")
_FALSE = {"false", "0", "no", "n", "f"}


@dataclass(frozen=True)
class RealSelection:
    """The real-only block's runs (None when no seed survives) and what was left out, and why."""

    runs: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)


def valid_mask(index: pd.DataFrame) -> pd.Series:
    """True for a replay not marked invalid (a blank ``valid``, or no column, counts as valid, as a summary
    without the key does)."""
    if "valid" not in index.columns:
        return pd.Series(True, index=index.index)
    text = index["valid"].astype("string").str.strip().str.lower()
    return ~text.isin(_FALSE).fillna(False).astype(bool)


def real_block_runs(index: pd.DataFrame, seeds: Mapping[str, Iterable[int]], controllers: Iterable[str],
                    columns: Iterable[str]) -> RealSelection:
    """The real-only block of `index` for the planned `seeds` of each regime and the `controllers`, with
    `columns` kept (those `index` has); see the comment above."""
    controllers = list(controllers)
    real = index[index["backend"] == REAL_BLOCK]
    valid = valid_mask(real)
    kept, notes = [], []
    for regime, planned in seeds.items():
        for seed in sorted(set(int(s) for s in planned)):
            rows = real[(real["regime"] == regime) & (real["seed"] == seed)]
            ok = rows[valid.loc[rows.index]]
            invalid = len(rows) - len(ok)
            if rows.empty:
                notes.append(f"{regime} seed {seed}: no real replay")
                continue
            if invalid:
                names = ", ".join(_replay_name(r) for r in rows[~valid.loc[rows.index]].to_dict("records"))
                notes.append(f"{regime} seed {seed}: {invalid} invalid real replay(s) left out ({names})")
            no_sync = ok[ok["policy"] == NO_SYNC]
            if no_sync.empty:
                notes.append(f"{regime} seed {seed}: no valid no-sync control, so nothing to score against: "
                             "seed left out")
                continue
            seed_rows = [no_sync.iloc[:1]]
            for controller in controllers:
                own = ok[(ok["policy"] == controller)
                         & (ok["source"].isin(CONTROLLER_SOURCES) if "source" in ok.columns else True)]
                draws = ok[(ok["policy"] == MATCHED_RANDOM) & (ok["matched_to"] == controller)]
                even = ok[(ok["policy"] == EVEN_CADENCE) & (ok["matched_to"] == controller)]
                if own.empty or draws.empty:
                    what = "replay" if own.empty else "span-matched draw"
                    if not (rows["policy"] == controller).any():
                        notes.append(f"{regime} seed {seed}: {controller} not replayed on the real server")
                    else:
                        notes.append(f"{regime} seed {seed}: no valid {what} of {controller}: left out")
                    continue
                if even.empty:
                    notes.append(f"{regime} seed {seed}: no valid even-cadence replay of {controller}: the seed "
                                 "is in its rank test but not its cadence test")
                seed_rows += [own.iloc[:1], draws, even.iloc[:1]]
            if len(seed_rows) > 1:
                kept += seed_rows
    if not kept:
        return RealSelection(None, notes)
    runs = pd.concat(kept, ignore_index=True)
    return RealSelection(runs[[c for c in columns if c in runs.columns]].reset_index(drop=True), notes)


def _replay_name(row: Mapping) -> str:
    name = str(row["policy"])
    if pd.notna(row.get("matched_to")):
        name += f"[{row['matched_to']}]"
    if pd.notna(row.get("draw")):
        name += f" draw {int(row['draw'])}"
    return name


def pipeline_real_runs(params: Params, root: Path) -> RealSelection:
    """The real-only block: per regime of params the real arm planned (plan.json; without one, every regime
    of params with real replays) and its planned seeds (of params' seeds), the primary controller's real
    replays with its span-matched draws and span cadence and the seed's no-sync control
    (`real_block_runs`); no runs (None) without any."""
    index = read_replay_index(root)
    real = index[index["backend"] == layout.VLLM]
    if real.empty:
        return RealSelection(None)
    plan_path = layout.at(root, layout.VLLM_PLAN)
    if plan_path.is_file():
        planned = read_json(plan_path, "real-arm plan").get("regimes", {})
        seeds = {r: [s for s in [*p["fit_seeds"], *p["held_out_seeds"]] if s in params.seeds]
                 for r, p in planned.items() if r in params.regimes}
    else:
        seeds = {r: list(params.seeds) for r in params.regimes if (real["regime"] == r).any()}
    selection = real_block_runs(index, seeds, [params.analysis.primary.policy], RUN_COLUMNS)
    if selection.runs is None:
        return selection
    return RealSelection(selection.runs.merge(eval_losses(root), on=["regime", "policy", "seed"], how="left"),
                         selection.notes)


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


def _real_replay_section(root: Path, alpha: float | None = None) -> str:
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
    plan = _plan_lines(root, alpha)
    invalid = real[~real["valid"].astype(bool)] if "valid" in real.columns else real.iloc[0:0]
    note = (f"\n\n{len(invalid)} of {len(real)} real replays are invalid and license nothing (their seeds are left "
            "out of the gate, the fit and the fidelity check; reasons in the calibration report)." if len(invalid) else "")
    return ("## Real replays (vLLM)\n\n" + (plan + "\n\n" if plan else "")
            + markdown_table(["regime", "policy", "seed", "draw", "SLO violations %", "p95 ms", "requests", "failed",
                              "valid"], rows) + note)


def _plan_lines(root: Path, alpha: float | None = None) -> str:
    """The real arm's plan per regime (load, span, what was replayed, planned power of the gate and of the
    real-only block's tests), from its plan.json."""
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
            + _planned_floor(len(p["fit_seeds"]) + len(p["held_out_seeds"]), int(p["draws"]), alpha)
            + (f"; left out (no span the budget pays for measures them): {', '.join(p['left_out'])}"
               if p.get("left_out") else ""))
    lines += campaign_block_lines(root)
    placement = plan.get("placement") or {}
    if placement:
        lines.append(f"- placement: {placement.get('mode')} (client CPUs {placement.get('client_cpus')}, server and "
                     f"merge work CPUs {placement.get('server_cpus')})")
    return "\n".join(lines)


def campaign_block_lines(root: Path) -> list[str]:
    """Per regime, the campaign blocks its real evidence pools (`realarm.blocks`), and how many an earlier
    run had finished (kept, not replayed)."""
    path = layout.at(root, layout.VLLM_BLOCKS)
    if not path.is_file():
        return []
    by_regime: dict[str, list[dict]] = {}
    for block in read_json(path, "campaign blocks", keys=("blocks",))["blocks"]:
        by_regime.setdefault(str(block["regime"]), []).append(block)
    lines = []
    for regime, blocks in sorted(by_regime.items()):
        kept = sum(bool(b.get("resumed")) for b in blocks)
        lines.append(f"- {regime}: {len(blocks)} campaign block(s) pooled ({', '.join(str(b['label']) for b in blocks)}"
                     f"; {sum(int(b['replays']) for b in blocks)} replays)"
                     + (f", {kept} finished by an earlier run and kept" if kept else ""))
    return lines


def _planned_floor(n_seeds: int, draws: int, alpha: float | None) -> str:
    """The smallest p the real-only block's tests can reach on the plan's seeds and draws (every replay valid)."""
    rank, cadence = smallest_rank_p([draws] * n_seeds), smallest_sign_p(n_seeds)
    text = (f"; real-only tests can reach at best rank p {rank:.3g} ((draws+1)^-seeds) and cadence p "
            f"{cadence:.3g} (2^-seeds)")
    under = [name for name, p in (("rank", rank), ("cadence", cadence)) if alpha is not None and p > alpha]
    return text + (f": {' and '.join(under)} test underpowered at alpha {alpha:g}" if under else "")


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
    sections = [_real_replay_section(root, alpha), _calibration_section(root, judged)]
    sections.append(live_section(root, alpha, judged))  # runs/live/, if any: its tests join the table's family
    sections.append(headroom_section(params, root))  # the headroom stage's split of the gap, if it ran
    sections += [f"## Bursts and merge windows: {Path(name).name.split('_' + TIMELINE_FIGURE)[0]}\n\n![timeline]({name})"
                 for name in figures if name.endswith(TIMELINE_FIGURE)]
    if loss_figure in figures:
        sections.append(f"## Training\n\n![loss curves]({loss_figure})")
    extra_files = {name: (lambda fig: lambda tmp: write_png(fig, tmp))(fig) for name, fig in figures.items()}
    extra_files[layout.LOSS_CURVES_FILE] = lambda tmp: losses.to_csv(tmp, index=False)
    real = pipeline_real_runs(params, root)
    source = f"simulator replays of {layout.REPLAY_INDEX.as_posix()} (the regimes, seeds and policies in params)"
    if real.runs is not None:
        source += (f"; real-only block: its {layout.VLLM} replays of the real arm's planned seeds "
                   f"({settings.primary.policy}, its span-matched draws and span cadence)")
    return analyze_runs(pipeline_runs(params, root), layout.reports_dir(root), mechanism=mechanism, fidelity=fidelity,
                        primary=(settings.primary.policy, settings.primary.regime), loss_margin=settings.loss_margin,
                        alpha=alpha, extra_sections=sections, extra_files=extra_files, extra_tests=live_tests(root),
                        targets=settings.fidelity, gate_ratio_threshold=settings.gate_ratio_threshold,
                        source=source, block=layout.SIMULATOR, real_runs=real.runs, real_notes=real.notes)
