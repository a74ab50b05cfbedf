"""A copy of this checkout's tracked files (what a fresh clone holds), for tests that run DVC in it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def tracked_copy(repo_root: Path, dest: Path) -> Path:
    """Copy every file git tracks in `repo_root` to `dest`, without dvc.lock (nothing has run there)."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo_root, capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        if (repo_root / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo_root / rel, dest / rel)
    (dest / "dvc.lock").unlink(missing_ok=True)
    return dest
