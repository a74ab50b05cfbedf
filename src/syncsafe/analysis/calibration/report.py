"""Markdown reports of the calibrate-fit and fidelity stages, and the calibration's pace figure.

`render_fit_report` writes the fitted parameters, the fit diagnostics, the
residuals of every fit replay (p95 E2E and SLO rate, simulated vs real) and
the mechanism gate. `pace_figure` (`runs/calibration/pace.png`) plots each
real replay's no-merge decode pace (median of (E2E - TTFT) / (tokens - 1)
over its requests with `merge_active` false, `realarm.warmup.decode_pace_ms`)
against its position in its seed's replay order, coloured by seed, one panel
per regime: warm-up drift shows as a trend along the order, a seed whose
controls disagree as a spread in one colour.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from syncsafe.analysis.calibration.records import ReplayRecord
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.analysis.figures import write_png
from syncsafe.analysis.report import markdown_table
from syncsafe.control.serving_model import Calibration
from syncsafe.io import atomic_path
from syncsafe.realarm.warmup import decode_pace_ms

#: The pace figure's file in runs/calibration/.
PACE_FIGURE_FILE = "pace.png"

PARAMETERS = ("iter_base_ms", "prefill_ms_per_token", "decode_ms_per_seq", "request_overhead_ms", "token_overhead_ms",
              "max_batch", "merge_compute_share",
              "merge_share_skew", "pressure_slowdown", "residual_sigma", "capacity_rps")


def fmt(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render_fit_report(calibration: Calibration, diagnostics: Mapping[str, object], transfer: pd.DataFrame,
                      mechanism: MechanismEvidence, skipped: Sequence[str], fit_replays: Sequence[str],
                      reason: str | None) -> str:
    """runs/calibration/report.md."""
    head = ("## Fitted parameters (iteration-level model)" if calibration.fitted
            else "## Not fitted: the shipped defaults stand")
    parts = [
        "# Calibration: the iteration-level simulator fitted to the real vLLM server",
        "",
        "Wall time throughout (trace time / `time_scale`); latencies in real ms. Fitted on the server profile "
        "(`runs/server-profile/profile.json`) and the fit seeds' replays: "
        + (", ".join(f"`{n}`" for n in fit_replays) or "none") + ".",
        "",
        head,
        "",
        *([] if calibration.fitted else [f"Why: {reason}.", ""]),
        markdown_table(["parameter", "value"], [(k, fmt(float(getattr(calibration, k)), 4)) for k in PARAMETERS]),
        "",
        f"A merge takes {calibration.merge_compute_share:.0%} of the server's compute while its window is open "
        + ("(a full stall: for at least half of the window the server makes no progress)." if calibration.full_stall
           else f"(mean work stretch x{calibration.merge_slowdown:.3g})."),
        "",
        "Fit diagnostics: " + (", ".join(f"{k} {fmt(v)}" for k, v in diagnostics.items() if k != "residuals")
                               or "none") + ".",
        "",
        *_residual_section(diagnostics.get("residuals") or []),
        "Figure: `pace.png`, each real replay's no-merge decode pace (median (E2E - TTFT) / (tokens - 1) of its "
        "requests outside merges) against its position in its seed's replay order, coloured by seed, per regime.",
        "",
        "## Mechanism transfer on the fit seeds (real vs simulator, same inputs)",
        "",
        markdown_table(list(transfer.columns), [[fmt(v) for v in row] for row in transfer.itertuples(index=False)])
        if len(transfer) else "_Nothing measured._",
        "",
        "## Mechanism gate (all real replays)",
        "",
        "Merge-active: the request's arrival plus one nominal lifetime (the seed's first no-sync control's median "
        "E2E) overlaps a merge window. Each replay with merges is paired with its nearest no-sync control and "
        "the next-nearest (drift). Gate: the block-bootstrap 95 % bounds of paired sync ratio / drift (each "
        "resample's replays shocked by the replay-to-replay wander of the no-sync controls' p95, so two runs of "
        "one plan can agree within them) against "
        f"{mechanism.gate_ratio_threshold:g}: passed when the lower bound is above it, failed (decisively) when "
        "the upper bound is below it, else inconclusive (underpowered when the plan's power missed its target).",
        "",
    ]
    for regime in sorted(mechanism.regimes):
        verdict = "shows" if mechanism.shows(regime) else "does not show"
        parts.append(f"- {regime}: the mechanism {verdict} on vLLM: {mechanism.describe(regime)}.")
    for regime in skipped:
        parts.append(f"- {regime}: not measured ({mechanism.unmeasured.get(regime, 'no merge-active request')}).")
    spread = [(regime, s.seed, ", ".join(fmt(v, 4) for v in s.p95_ms), fmt(s.p95_spread),
               ", ".join(fmt(v) for v in s.slo_pct), fmt(s.slo_range_pp))
              for regime, m in sorted(mechanism.regimes.items()) for s in m.no_sync_spread]
    if spread:
        parts += ["", "### Noise floor: the no-sync controls of each seed", "",
                  markdown_table(["regime", "seed", "p95 ms per control", "p95 spread", "SLO % per control",
                                  "SLO range pp"], spread)]
    if mechanism.invalid_replays:
        parts += ["", "### Invalid real replays (their seeds license nothing)", "",
                  markdown_table(["regime", "seed", "replay", "why"],
                                 [(r["regime"], r["seed"], r["path"], r["reason"]) for r in mechanism.invalid_replays])]
    return "\n".join(parts) + "\n"


def _residual_section(residuals: Sequence[Mapping[str, object]]) -> list[str]:
    """The per-fit-replay residuals table (simulated vs real p95 E2E and SLO rate)."""
    if not residuals:
        return []
    rows = [(r["replay"], fmt(r.get("position")), fmt(r.get("p95_ms_real"), 4), fmt(r.get("p95_ms_sim"), 4),
             fmt(r.get("p95_rel_error")), fmt(r.get("slo_pct_real")), fmt(r.get("slo_pct_sim")),
             fmt(r.get("slo_error_pp"))) for r in residuals]
    return ["## Fit residuals per fit replay (the fitted simulator on the same inputs)", "",
            markdown_table(["replay", "position", "p95 real ms", "p95 sim ms", "p95 rel err", "SLO % real",
                            "SLO % sim", "SLO err pp"], rows), ""]


def replay_paces(records: Sequence[ReplayRecord]) -> pd.DataFrame:
    """Per real replay with a known position: regime, seed, position, label, no-sync or not, no-merge pace (ms)."""
    rows = []
    for rec in records:
        if rec.position is None:
            continue
        outside = rec.results[~rec.results["merge_active"].to_numpy(dtype=bool)]
        rows.append({"regime": rec.regime, "seed": rec.seed, "position": int(rec.position), "label": rec.label,
                     "no_sync": rec.is_no_sync, "pace_ms": decode_pace_ms(outside)})
    return pd.DataFrame(rows, columns=["regime", "seed", "position", "label", "no_sync", "pace_ms"])


def pace_figure(records: Sequence[ReplayRecord]) -> Figure:
    """No-merge decode pace against replay order, coloured by seed (circles: no-sync controls), per regime."""
    paces = replay_paces(records).dropna(subset=["pace_ms"])
    regimes = sorted(paces["regime"].unique()) or ["(no real replay with a position)"]
    figure = Figure(figsize=(max(6.5, 4.5 * len(regimes)), 3.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(regimes), squeeze=False)[0]
    seeds = sorted(paces["seed"].unique())
    for ax, regime in zip(axes, regimes):
        for seed in seeds:
            rows = paces[(paces["regime"] == regime) & (paces["seed"] == seed)].sort_values("position")
            if rows.empty:
                continue
            color = f"C{seeds.index(seed) % 10}"
            ax.plot(rows["position"], rows["pace_ms"], "-", color=color, alpha=0.4, linewidth=0.8)
            for no_sync, marker in ((True, "o"), (False, "s")):
                part = rows[rows["no_sync"] == no_sync]
                ax.scatter(part["position"], part["pace_ms"], marker=marker, s=22, color=color,
                           label=f"seed {seed}" + (" no-sync" if no_sync else " merges"))
        ax.set_title(f"regime: {regime}", fontsize="small")
        ax.set_xlabel("position in the regime's replay order (one block per seed, in rounds)")
        ax.set_ylabel("no-merge decode pace (ms / token)")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside lower center", ncols=min(len(handles), 4), fontsize="small")
    return figure


def save_pace_figure(records: Sequence[ReplayRecord], path: str | os.PathLike[str]) -> Path:
    """Atomically write `pace_figure` as PNG to `path`."""
    with atomic_path(path) as tmp:
        write_png(pace_figure(records), tmp)
    return Path(path)


def _bounds(evidence: FidelityEvidence, field: str) -> str:
    bounds = evidence.bounds.get(field)
    return "-" if bounds is None else f"[{fmt(bounds[0])}, {fmt(bounds[1])}]"


def _wander_line(evidence: FidelityEvidence) -> str:
    if evidence.replay_sd is None:
        return ("No estimate of the server's replay-to-replay wander (no seed with two no-sync controls): the "
                "figures are judged as measured.")
    return (f"Bounds: the server's replay-to-replay wander (sd {evidence.replay_sd:.3g} of a whole replay's log p95 "
            f"E2E, pooled over the no-sync controls, {evidence.replay_sd_df} df) applied to every held-out real "
            "replay (`syncsafe.analysis.calibration.fidelity_bounds`)"
            + (f", and the fit's own variation: the predictions of {evidence.refits} refits of the calibration on the "
               "fit replays shocked at that wander (`syncsafe.analysis.calibration.refits`)" if evidence.refits
               else "; the fitted side is taken as exact (no refits)")
            + ". A target is met when the whole 95 % range meets it, missed when none of it does, undecided "
            "otherwise (which licenses nothing).")


def render_fidelity_report(evidence: FidelityEvidence, table: pd.DataFrame) -> str:
    """runs/fidelity/report.md."""
    t = evidence.targets
    verdict = ("licensed: " if evidence.licenses() else "not licensed: ") + evidence.describe()
    checked = sorted({(a.policy, a.regime) for a in evidence.sign_agreement})
    licences = [(policy, regime, "licensed" if evidence.licenses(policy, regime) else
                 "not licensed: " + "; ".join(evidence.failures(policy, regime))) for policy, regime in checked]
    rows = [(r.regime, r.seed, r.label, fmt(r.slo_pct_real), fmt(r.slo_pct_sim), fmt(r.slo_abs_error_pp),
             fmt(r.p95_ms_real, 4), fmt(r.p95_ms_sim, 4), fmt(r.p95_rel_error)) for r in table.itertuples(index=False)]
    signs = [(a.regime, a.policy, a.seed, a.n_draws, fmt(a.real_delta_pct), fmt(a.sim_delta_pct),
              "tie (no information)" if a.tie else "yes" if a.agree else "no") for a in evidence.sign_agreement]
    return "\n".join([
        "# Held-out fidelity of the simulator",
        "",
        f"Calibration: **{evidence.calibration}**; fit seeds {evidence.fit_seeds}, held-out seeds "
        f"{evidence.held_out_seeds} ({evidence.n_held_out_replays} real replays). Targets: p95 error <= "
        f"{t.p95_rel_error_max:.0%}, SLO-rate error <= {t.slo_abs_error_pp_max:g} pp, paired sync ratio sim/real in "
        f"[{t.sync_ratio_paired_low:g}, {t.sync_ratio_paired_high:g}], per regime; and per (policy, regime) checked on "
        "the real server, the same sign of controller-minus-random on every held-out seed, at least one of them a "
        "non-zero real difference (zero against zero is a tie: no information).",
        "",
        f"Simulator-wide: {verdict}.",
        "",
        *[f"- {policy} in {regime}: {text}" for policy, regime, text in licences],
        *(["- every other (policy, regime): not checked on the real server, so its simulator rows stop at "
           "*mechanism transfers*"] if checked else []),
        "",
        "| measure | max | 95 % bounds of max | mean |", "|---|---|---|---|",
        f"| p95 relative error | {fmt(evidence.p95_rel_error_max)} | {_bounds(evidence, 'p95_rel_error_max')} | "
        f"{fmt(evidence.p95_rel_error_mean)} |",
        f"| SLO-rate error (pp) | {fmt(evidence.slo_abs_error_pp_max)} | {_bounds(evidence, 'slo_abs_error_pp_max')} | "
        f"{fmt(evidence.slo_abs_error_pp_mean)} |",
        "",
        f"Paired sync ratio: real {fmt(evidence.sync_ratio_paired_real)}, simulated "
        f"{fmt(evidence.sync_ratio_paired_sim)}, sim/real {fmt(evidence.sync_ratio_paired_sim_over_real)} "
        f"(95 % bounds {_bounds(evidence, 'sync_ratio_paired_sim_over_real')}).",
        "",
        _wander_line(evidence),
        "",
        "## Per held-out replay",
        "",
        markdown_table(["regime", "seed", "replay", "SLO % real", "SLO % sim", "abs err pp", "p95 real ms",
                        "p95 sim ms", "rel err"], rows) if rows else "_No held-out replays._",
        "",
        "## Controller minus matched random (SLO %), real vs simulated",
        "",
        markdown_table(["regime", "policy", "seed", "draws", "real", "sim", "same sign"], signs)
        if signs else "_No held-out controller with draws._",
        "",
        *[f"- {note}" for note in evidence.notes],
        "",
        "Figure: `cdf.png`, real (solid) vs simulated (dashed) E2E CDFs of merge-active and inactive requests per "
        "held-out replay with merges.",
    ]) + "\n"
