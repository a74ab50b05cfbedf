"""A run's real-arm result recorded as a reference: the files `real-arm compare` reads, kept in one folder.

`record_real_arm(root, out, provenance)` copies from a finished project root the real plan, its campaign
blocks, the mechanism gate, the held-out fidelity, the policy table, the real replays' index, the params,
the server profile's facts and the reports, at their project-relative paths, into `out` (one atomic step: a failed
record leaves the previous one or none), with `provenance.json` (the commit, the machine, the params
profile, when). The folder is laid out like a project root, so `syncsafe real-arm compare NEW out` holds a
new run against the recorded one with the same checks as two live runs (`analysis.reproduce`). It is small
(tables and JSON, no per-request data) and meant to be committed, under `evidence/`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from syncsafe import io
from syncsafe.analysis.reproduce import load_outputs
from syncsafe.artifacts import layout
from syncsafe.artifacts.layout import PathLike

PROVENANCE_FILE = "provenance.json"
#: What `real-arm compare` reads (required), then what a reader of the record wants beside it (when present).
REQUIRED = (layout.VLLM_PLAN, layout.MECHANISM, layout.FIDELITY_EVIDENCE,
            layout.report_rel(layout.POLICY_TABLE_FILE), layout.VLLM_INDEX)
OPTIONAL = (Path("params.yaml"), layout.VLLM_BLOCKS, layout.VLLM_REPEATS, layout.VLLM_SERVER_FILE, layout.CALIBRATION_REPORT,
            layout.report_rel(layout.REPORT_FILE))


def record_real_arm(root: PathLike, out: PathLike, provenance: dict[str, object]) -> list[Path]:
    """Record `root`'s real-arm result in `out` (module docstring); the recorded files, relative to `out`.
    BadInput naming the first missing or malformed file when `root` has no complete real-arm result."""
    root, out = Path(root), Path(out)
    load_outputs(root)  # every file compare reads is there and well formed, or the error names it
    files = [*REQUIRED, *(rel for rel in OPTIONAL if layout.at(root, rel).is_file())]

    def build(tmp: Path) -> None:
        for rel in files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(layout.at(root, rel), tmp / rel)
        io.write_json(tmp / PROVENANCE_FILE, {**provenance, "files": [rel.as_posix() for rel in files]})

    io.replace_directory(out, build)
    return [*files, Path(PROVENANCE_FILE)]


__all__ = ["PROVENANCE_FILE", "OPTIONAL", "REQUIRED", "record_real_arm"]
