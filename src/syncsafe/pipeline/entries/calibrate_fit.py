"""Stage calibrate-fit: fit the iteration-level simulator to the server profile and the fit seeds' vLLM replays.

Writes runs/calibration/ (calibration.json, fit.json, mechanism.json, transfer.csv, report.md); with no
possible fit, calibration.json holds the shipped defaults (fitted: false) and fit.json says why.
"""

from __future__ import annotations

from pathlib import Path

from syncsafe.analysis.calibration import calibrate_fit_stage
from syncsafe.config import Params


def run(params: Params, root: Path, regime: None, params_path: Path) -> str:
    result = calibrate_fit_stage(params, root)
    c = result.calibration
    state = "fitted" if c.fitted else f"default ({result.fit.get('reason')})"
    lines = [f"calibrate-fit: {state}; merge share {c.merge_compute_share:.3g}, iteration {c.iter_base_ms:.3g} ms "
             f"+ {c.decode_ms_per_seq:.3g} ms/seq + {c.prefill_ms_per_token:.3g} ms/prompt token"]
    lines += [f"{regime:16s} {result.mechanism.describe(regime)}" for regime in sorted(result.mechanism.regimes)]
    return "\n".join(lines)
