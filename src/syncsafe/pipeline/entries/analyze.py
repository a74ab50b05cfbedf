"""Stage analyze: the evidence protocol (sync-excess, envelope, rank test, multiplicity, claim tiers) and the
report, from this pipeline's replays, calibration, fidelity and training outputs into the reports."""

from __future__ import annotations

from pathlib import Path

from syncsafe.analysis.stage import analyze_pipeline
from syncsafe.artifacts import layout
from syncsafe.config import Params


def run(params: Params, root: Path, regime: None, params_path: Path, *, alpha: float | None = None) -> str:
    result = analyze_pipeline(params, root, alpha=alpha)
    return summary(result.policy_table, result.files, layout.reports_dir(root))


def summary(policy_table, files: dict, out: Path) -> str:  # noqa: ANN001 - a pandas DataFrame
    """The tier of every (regime, policy) row and the files written."""
    lines = [f"{rec.regime:16s} {rec.policy:18s} {rec.tier}" + (" (real replays only)" if getattr(rec, "block", "") == "vllm" else "")
             for rec in policy_table.itertuples(index=False)]
    lines.append(f"wrote {', '.join(sorted(p.name for p in files.values()))} to {out}")
    return "\n".join(lines)
