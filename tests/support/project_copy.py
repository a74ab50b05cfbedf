"""A copy of this checkout's tracked files (what a fresh clone holds), for tests that run DVC in it; a committed
project with a tiny study for the study tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml


def tracked_copy(repo_root: Path, dest: Path) -> Path:
    """Copy every file git tracks in `repo_root` to `dest`, without dvc.lock (nothing has run there)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo_root, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (repo_root / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / rel, dest / rel)
    (dest / "dvc.lock").unlink(missing_ok=True)
    return dest


#: A study of two tiny points that differ only in the SLO multiplier: the second reuses the first's traces,
#: training and schedules from DVC's cache.
TINY_STUDY = {
    "description": "two tiny points, the SLO multiplier moved",
    "question": "sensitivity",
    "cheap": {"schedules.source": "harness", "replay.vllm.enabled": False},
    "axes": [{"name": "SLO multiplier", "keys": ["replay.slo.multiplier"], "values": [1.5, 2.0]}],
}
#: Who commits in a test project (CI's root has no git identity; DVC commits each experiment).
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "syncsafe test", "GIT_AUTHOR_EMAIL": "test@syncsafe.invalid",
                "GIT_COMMITTER_NAME": "syncsafe test", "GIT_COMMITTER_EMAIL": "test@syncsafe.invalid"}


def study_project(repo_root: Path, dest: Path, raw_params: dict) -> Path:
    """A committed git + DVC project of this checkout's tracked files with `raw_params` (two seeds) and the
    study `tiny` (TINY_STUDY): what `syncsafe study run tiny` needs."""
    project = tracked_copy(repo_root, dest)
    raw = {**raw_params, "seeds": [0, 1]}
    (project / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    (project / "studies" / "tiny.yaml").write_text(yaml.safe_dump(TINY_STUDY), encoding="utf-8")
    env = {**os.environ, **GIT_IDENTITY}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "tiny study project"]):
        subprocess.run(cmd, cwd=project, check=True, env=env)
    return project
