"""`syncsafe run` on a fresh copy: the outputs `dvc repro` writes, byte for byte, recorded so that `dvc repro`
afterwards has nothing to do; a failed item stops what depends on it and names itself."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from project_copy import tracked_copy

pytestmark = pytest.mark.slow


def _project(repo_root: Path, dest: Path, raw_params: dict) -> Path:
    """A fresh copy with a small pipeline: 1 seed, two 120 s regimes, two controllers; no real server."""
    project = tracked_copy(repo_root, dest)
    raw = dict(raw_params)
    raw["seeds"] = [0]
    raw["regimes"] = {k: {**v, "duration_s": 120} for k, v in raw["regimes"].items() if k in ("bursty", "steady")}
    raw["control"]["policies"] = ["fixed_h", "wa_diloco"]
    raw["schedules"]["source"] = "train"
    raw["train"].update({"corpus_bytes": 300_000, "eval_batches": 2})
    raw["replay"]["vllm"].update({"enabled": False, "regimes": ["bursty"], "policies": ["fixed_h"]})
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"]):
        subprocess.run(cmd, cwd=project, check=True)
    return project


def _run(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    return subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=1200)


def _outs(project: Path) -> dict[str, dict[str, str]]:
    stages = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    return {name: {o["path"]: o["md5"] for o in body.get("outs", [])} for name, body in stages.items()}


def test_the_runner_writes_what_dvc_repro_writes_and_leaves_it_nothing_to_do(tmp_path, repo_root, raw_params):
    ours = _project(repo_root, tmp_path / "runner", raw_params)
    done = _run(ours, sys.executable, "-m", "syncsafe.cli", "run", "--jobs", "2",
                env={"SYNCSAFE_TRACKING": "on", "MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 of 18 stage items to run" in done.stdout and "ran 18 items" in done.stdout
    assert (ours / "logs" / "run" / "train@steady.log").stat().st_size > 0
    timings = yaml.safe_load((ours / "logs" / "run" / "timings.json").read_text())
    assert len(timings) == 18 and all(v > 0 for v in timings.values())
    with sqlite3.connect(ours / "mlflow.db") as db:  # every stage run under the runner's one pipeline run
        kinds = dict(db.execute("SELECT value, count(*) FROM tags WHERE key = 'syncsafe.run_kind' GROUP BY value"))
        pipelines = db.execute("SELECT count(DISTINCT value) FROM tags WHERE key = 'syncsafe.pipeline_run_id'").fetchone()
        stage_runs = sorted(name for (name,) in db.execute(
            "SELECT r.name FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid "
            "WHERE t.key = 'syncsafe.run_kind' AND t.value = 'stage'"))
    # one stage run per item that did work; `live` is switched off (live.enabled: false) and tracks nothing
    assert kinds["pipeline"] == 1 and pipelines == (1,)
    assert stage_runs == sorted(set(timings) - {"live"})
    assert "up to date" in _run(ours, "dvc", "status").stdout
    again = _run(ours, "dvc", "repro")
    assert again.returncode == 0 and "Running stage" not in again.stdout
    assert "0 of 18 stage items to run" in _run(ours, sys.executable, "-m", "syncsafe.cli", "run").stdout

    theirs = _project(repo_root, tmp_path / "repro", raw_params)
    repro = _run(theirs, "dvc", "repro")
    assert repro.returncode == 0, repro.stdout + repro.stderr
    assert _outs(ours) == _outs(theirs)  # every output, report included, byte for byte


def test_a_failed_item_names_itself_and_nothing_that_reads_it_starts(tmp_path, repo_root, raw_params):
    project = _project(repo_root, tmp_path / "fails", raw_params)
    failed = _run(project, sys.executable, "-m", "syncsafe.cli", "run", "--jobs", "2",
                  env={"SYNCSAFE_FAULT": "1:3"})  # island 1 dies at inner step 3: the stage exits 3
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "stage train@bursty failed (exit 3)" in failed.stderr and "island 1" in failed.stderr
    logs = {p.stem for p in (project / "logs" / "run").glob("*.log")}
    assert logs == {"traces@bursty", "traces@steady", "train@bursty"}
    status = _run(project, "dvc", "status").stdout
    assert "traces@" not in status and "train@bursty" in status  # what finished is recorded, the rest is not
