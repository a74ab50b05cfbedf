"""The analyze stage: runs table in, evidence report out.

:func:`analyze_runs` validates the runs table, runs the protocol, assigns
claim tiers and writes, into ``out_dir``:

* ``policy_table.csv``: one row per regime x policy; the contract columns
  ``regime, policy, n_seeds, slo_pct_mean, sync_excess_pct_mean,
  p_vs_matched_random, seeds_won, tier, p_rank, p_adjusted, gap_closed_mean,
  gap_closed_ci_low, gap_closed_ci_high, calibration`` first, then
  ``block`` (the runs table's label, or ``vllm`` for the real-only block),
  ``reason`` and the supporting numbers; the runs table's rows first, then
  the real-only block's (`real_runs`: real replays judged on their own, in
  the same test family).
* ``envelope.csv``: one row per controller run (regime x policy x seed) of
  the runs table: sync-excess, the matched-random envelope (min/mean/max),
  rank, references and gap closed (the real-only block's per-seed rows are
  in the report).
* ``metrics.json``: the headline DVC metrics (see :mod:`syncsafe.analysis.metrics`).
* ``report.md`` and the figure it references.

Everything is computed in memory first; the files are then written to
temporary files beside their destinations and renamed into place only once
all of them are complete, so a failure leaves no partial output.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
from syncsafe.analysis.figures import ENVELOPE_FIGURE, envelope_figure, write_png
from syncsafe.analysis.metrics import headline_metrics
from syncsafe.analysis.protocol import DEFAULT_LOSS_MARGIN, run_protocol
from syncsafe.analysis.report import ReportContext, render_report
from syncsafe.analysis.runs_table import MAIN_BLOCK, REAL_BLOCK, load_runs_table
from syncsafe.analysis.verdicts import DEFAULT_ALPHA, assign_tiers
from syncsafe.artifacts import layout
from syncsafe.artifacts.reports import CONTRACT_COLUMNS
from syncsafe.config import FidelityTargets
from syncsafe.io import atomic_path

POLICY_TABLE = layout.POLICY_TABLE_FILE
ENVELOPE_TABLE = layout.ENVELOPE_FILE
METRICS = layout.REPORT_METRICS_FILE
REPORT = layout.REPORT_FILE

ENVELOPE_COLUMNS = (
    "regime",
    "policy",
    "seed",
    "slo_pct",
    "no_sync_slo_pct",
    "sync_excess_pct",
    "n_draws",
    "mr_sync_excess_pct_min",
    "mr_sync_excess_pct_mean",
    "mr_sync_excess_pct_max",
    "mr_slo_pct_min",
    "mr_slo_pct_mean",
    "mr_slo_pct_max",
    "delta_vs_mr_pct",
    "rank",
    "won",
    "mrf_sync_excess_pct_mean",
    "even_sync_excess_pct",
    "oracle_sync_excess_pct",
    "bound_sync_excess_pct",
    "gap_closed",
    "loss_rel_vs_fixed_h",
)

Writer = Callable[[Path], None]
#: A report section written once the family's adjusted p-values are known.
Section = Callable[[Mapping[Hashable, float]], str]


@dataclass(frozen=True)
class AnalysisResult:
    """What :func:`analyze_runs` computed and where it wrote it."""

    policy_table: pd.DataFrame
    envelope: pd.DataFrame
    seeds: pd.DataFrame
    metrics: dict[str, object]
    report: str
    files: Mapping[str, Path] = field(default_factory=dict)
    #: Per-seed scores of the real-only block (empty without one).
    real_seeds: pd.DataFrame = field(default_factory=pd.DataFrame)


def analyze_runs(
    runs: str | os.PathLike[str] | pd.DataFrame,
    out_dir: str | os.PathLike[str],
    mechanism: MechanismEvidence | None = None,
    alpha: float = DEFAULT_ALPHA,
    *,
    fidelity: FidelityEvidence | None = None,
    primary: tuple[str, str] | None = None,
    loss_margin: float = DEFAULT_LOSS_MARGIN,
    confidence: float = 0.95,
    source: str | None = None,
    extra_sections: list[str | Section] | None = None,
    extra_files: Mapping[str, Writer] | None = None,
    extra_tests: Mapping[Hashable, float] | None = None,
    targets: FidelityTargets | None = None,
    gate_ratio_threshold: float | None = None,
    real_runs: str | os.PathLike[str] | pd.DataFrame | None = None,
    block: str = MAIN_BLOCK,
    real_notes: list[str] | None = None,
) -> AnalysisResult:
    """Run the evidence protocol on a runs table and write the report files.

    `extra_sections` (Markdown, or functions of the adjusted p of `extra_tests`, the tests that join the
    table's family) are appended to the report and `extra_files` (name -> writer of a temporary path) are
    written with the rest, all or nothing. `primary` is the declared ``(policy, regime)`` tested first
    (None: one Holm family); `fidelity` licenses (or not) the rows replayed on the simulator; `targets` and
    `gate_ratio_threshold` (params) are what the evidence is judged against, whatever the evidence files
    recorded; `source` names the runs in the report (default: the file, or ``<DataFrame>``).
    `real_runs` (a runs table of real vLLM replays only) is judged on its own as the real-only block, in the
    same family; `block` labels `runs`' rows and `real_notes` (what the real block left out, and why) go
    into the report's section on it.
    """
    if targets is not None and fidelity is not None:
        fidelity = fidelity.model_copy(update={"targets": targets})
    if gate_ratio_threshold is not None and mechanism is not None:
        mechanism = mechanism.model_copy(update={"gate_ratio_threshold": gate_ratio_threshold})
    table = load_runs_table(runs if isinstance(runs, pd.DataFrame) else Path(runs))
    real = None if real_runs is None else load_runs_table(
        real_runs if isinstance(real_runs, pd.DataFrame) else Path(real_runs))
    protocol = run_protocol(table, primary=primary, loss_margin=loss_margin, confidence=confidence,
                            extra_tests=extra_tests, real=real, block=block)
    policy_table = _ordered(assign_tiers(protocol.policies, mechanism, fidelity=fidelity, alpha=alpha))
    envelope = protocol.seeds.loc[protocol.seeds["n_draws"].notna(), list(ENVELOPE_COLUMNS)]
    envelope = envelope.astype({"n_draws": int}).reset_index(drop=True)
    metrics = headline_metrics(policy_table, alpha=alpha, fidelity=fidelity)
    context = ReportContext(source=source or table.source, alpha=alpha, mechanism=mechanism, fidelity=fidelity,
                            primary=primary, loss_margin=loss_margin, seeds=sorted(table.frame["seed"].unique()),
                            real_notes=list(real_notes or []))
    report = render_report(policy_table, protocol.seeds, context, figure=ENVELOPE_FIGURE,
                           real_seeds=protocol.real_seeds)
    if extra_sections:
        texts = [part if isinstance(part, str) else part(protocol.extra_adjusted) for part in extra_sections]
        texts = [text for text in texts if text]  # a section with nothing to say says nothing
        report = report.rstrip("\n") + "\n\n" + "\n\n".join(texts) + "\n"
    figure = envelope_figure(protocol.seeds)
    writers: dict[str, Writer] = {
        POLICY_TABLE: lambda tmp: policy_table.to_csv(tmp, index=False),
        ENVELOPE_TABLE: lambda tmp: envelope.to_csv(tmp, index=False),
        METRICS: lambda tmp: tmp.write_text(_json(metrics), encoding="utf-8"),
        REPORT: lambda tmp: tmp.write_text(report, encoding="utf-8"),
        ENVELOPE_FIGURE: lambda tmp: write_png(figure, tmp),
        **(extra_files or {}),
    }
    files = write_all_or_nothing(Path(out_dir), writers)
    return AnalysisResult(policy_table, envelope, protocol.seeds, metrics, report, files, protocol.real_seeds)


def write_all_or_nothing(out_dir: Path, writers: Mapping[str, Writer]) -> dict[str, Path]:
    """Write every file to a temporary sibling; rename them all only if all succeed.

    On failure no destination is touched and no temporary file remains; an
    ``out_dir`` created by this call is removed again if it is left empty.
    """
    created = not out_dir.exists()
    try:
        with contextlib.ExitStack() as stack:
            for name, write in writers.items():
                write(stack.enter_context(atomic_path(out_dir / name)))
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
        raise
    return {name: out_dir / name for name in writers}


def _ordered(policy_table: pd.DataFrame) -> pd.DataFrame:
    """Contract columns first, then ``block`` and ``reason``; the runs table's rows, then the real-only block's."""
    leading = [*CONTRACT_COLUMNS, "block", "reason"]
    rest = [c for c in policy_table.columns if c not in leading]
    ordered = policy_table[leading + rest].assign(_real=policy_table["block"] == REAL_BLOCK)
    return ordered.sort_values(["_real", "regime", "policy"], ignore_index=True).drop(columns="_real")


def _json(metrics: Mapping[str, object]) -> str:
    return json.dumps(metrics, indent=2, sort_keys=True, allow_nan=False) + "\n"
