"""`syncsafe run` on a fresh copy: the outputs `dvc repro` writes, byte for byte, recorded so that `dvc repro`
afterwards has nothing to do; a failed item stops what depends on it and names itself. The `dvc repro` copy
then switches the real vLLM arm on: `dvc repro` runs only what reads it, then has nothing to do."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from project_copy import tracked_copy
from vllm_env import VLLM_PYTHON, require_vllm_python

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


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory, repo_root, raw_params_factory) -> tuple[Path, dict[str, dict[str, str]]]:
    """A fresh copy after `dvc repro` (no real server), and its outputs' hashes as that first repro left them."""
    theirs = _project(repo_root, tmp_path_factory.mktemp("repro"), raw_params_factory())
    repro = _run(theirs, "dvc", "repro")
    assert repro.returncode == 0, repro.stdout + repro.stderr
    assert "Running stage 'train@steady'" in repro.stdout and "Running stage 'schedules@steady'" in repro.stdout
    return theirs, _outs(theirs)


def test_the_runner_writes_what_dvc_repro_writes_and_leaves_it_nothing_to_do(tmp_path, repo_root, raw_params,
                                                                             reproduced):
    ours = _project(repo_root, tmp_path / "runner", raw_params)
    done = _run(ours, sys.executable, "-m", "syncsafe.cli", "run", "--jobs", "2",
                env={"SYNCSAFE_TRACKING": "on", "MLFLOW_TRACKING_URI": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "15 of 15 stage items to run" in done.stdout and "ran 15 items" in done.stdout
    assert (ours / "logs" / "run" / "train@steady.log").stat().st_size > 0
    timings = yaml.safe_load((ours / "logs" / "run" / "timings.json").read_text())
    assert len(timings) == 15 and all(v > 0 for v in timings.values())
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
    assert "0 of 15 stage items to run" in _run(ours, sys.executable, "-m", "syncsafe.cli", "run").stdout
    assert _outs(ours) == reproduced[1]  # every output of `dvc repro` in a fresh copy, report included, byte for byte


def test_dvc_repro_with_the_real_vllm_arm_reruns_what_reads_it_then_has_nothing_to_do(reproduced, repo_root):
    """The whole dvc.yaml has run (the fixture, real training included); the real arm switched on, `dvc repro`
    serves the trained export on the real vLLM server and recomputes what reads its replays, nothing upstream."""
    require_vllm_python()
    project = reproduced[0]
    raw = yaml.safe_load((project / "params.yaml").read_text())
    # the real vLLM server, briefly: a plan of about a minute of replays, the primary and fixed_h, one draw each;
    # the shipped server_args (graph capture included)
    raw["replay"]["vllm"].update({"enabled": True, "python": str(VLLM_PYTHON), "regimes": ["bursty"],
                                  "policies": ["fixed_h"], "draws": 1, "budget_s": 60, "capacity_probe_s": 2})
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    first = _run(project, "dvc", "repro")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Running stage 'replay-vllm'" in first.stdout
    assert "Running stage 'train@" not in first.stdout and "Running stage 'schedules@" not in first.stdout
    index = pd.read_csv(project / "runs" / "schedules" / "index.csv")
    assert set(index.loc[index["matched_to"].isna() & (index["policy"] != "no_sync"), "source"]) == {"train"}
    replays = pd.read_csv(project / "runs" / "replay" / "index.csv")
    assert set(replays["backend"]) == {"simulator", "vllm"}
    # the first no-sync control and every planned controller with its span-matched draws; the later
    # no-sync controls are listed in runs/replay-sets/vllm/repeats.csv
    plan = json.loads((project / "runs" / "replay-sets" / "vllm" / "plan.json").read_text())["regimes"]["bursty"]
    assert plan["controllers"][0] == "wa_diloco"
    assert len(replays[replays["backend"] == "vllm"]) == 1 + len(plan["controllers"]) * (1 + plan["draws"])
    assert len(pd.read_csv(project / "runs" / "replay-sets" / "vllm" / "repeats.csv")) == plan["controls"] - 1
    assert (project / "runs" / "calibration" / "mechanism.json").is_file()
    table = pd.read_csv(project / "reports" / "policy_table.csv")
    assert set(table["policy"]) == {"fixed_h", "wa_diloco", "no_sync"}  # references are columns of their controller
    assert "## Real replays (vLLM)" in (project / "reports" / "report.md").read_text()
    second = _run(project, "dvc", "repro")
    assert second.returncode == 0
    assert "Running stage" not in second.stdout
    assert "up to date" in second.stdout


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
