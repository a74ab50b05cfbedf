"""`syncsafe study run` for real: two tiny points queued as DVC experiments and run by DVC's queue, the second
reusing the first's cached stages; `study report` reads both from their experiments (nothing reruns), judges
them as one family and tags each point's MLflow run; `compare --study` shows policy x point."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from project_copy import GIT_IDENTITY, study_project

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCSAFE_", "MLFLOW_", "DVC_"))}
    env.update(GIT_IDENTITY, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return env


def _cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "syncsafe.cli", *args, "--root", "."], cwd=project, env=_env(),
                          capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory, tiny_raw) -> tuple[Path, subprocess.CompletedProcess[str]]:
    project = study_project(Path(__file__).resolve().parents[2], tmp_path_factory.mktemp("study"), tiny_raw())
    return project, _cli(project, "study", "run", "tiny")


def test_each_point_is_a_dvc_experiment_and_the_second_reuses_the_cached_stages(ran):
    project, done = ran
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    listed = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=project,
                            capture_output=True, text=True, check=True).stdout
    assert "tiny.SLO-multiplier-1p5" in listed and "tiny.SLO-multiplier-2p0" in listed
    record = json.loads((project / "reports" / "studies" / "tiny" / "run.json").read_text())
    first, second = record["points"]
    assert first["ok"] and second["ok"] and record["wall_s"] > 0
    assert "analyze" in first["ran"] and "analyze" in second["ran"]  # the SLO multiplier changes the verdict
    # ... but not the traces, the (switched off) training or the schedules: DVC restores them from its cache
    assert {"traces@bursty", "train@bursty", "schedules@bursty"} <= set(second["reused"]), second
    assert not {"traces@bursty", "schedules@bursty"} & set(second["ran"])
    assert (project / "logs" / "studies" / "tiny" / "queue.log").stat().st_size > 0


def test_the_report_judges_both_points_as_one_family_from_their_experiments(ran):
    project, done = ran
    assert done.returncode == 0
    out = project / "reports" / "studies" / "tiny"
    table = pd.read_csv(out / "table.csv")
    assert table["point"].tolist() == ["SLO multiplier=1.5", "SLO multiplier=2.0"]
    assert set(table["policy"]) == {"wa_diloco"} and set(table["regime"]) == {"bursty"}
    assert (table["n_seeds"] == 2).all() and (table["p_holm"] >= table["p"]).all()
    assert set(table["tier"]) == {"stress harness only"}  # no real replay in the cheap study: nothing more
    seeds = pd.read_csv(out / "seeds.csv")
    assert len(seeds) == 4 and set(seeds["seed"]) == {0, 1}
    assert (out / "figure.png").read_bytes()[:4] == b"\x89PNG"
    assert "Holm family over all 2" in (out / "report.md").read_text()
    # the workspace itself was never touched: no pipeline output there, params.yaml as committed
    assert not (project / "reports" / "policy_table.csv").exists()
    assert subprocess.run(["git", "status", "--porcelain", "params.yaml"], cwd=project, capture_output=True,
                          text=True).stdout == ""
    # reporting again reads the experiments, reruns nothing, and writes the same table
    again = _cli(project, "study", "report", "tiny")
    assert again.returncode == 0, again.stderr
    pd.testing.assert_frame_equal(pd.read_csv(out / "table.csv"), table)


def test_each_point_is_one_tagged_mlflow_run_holding_its_stage_runs(ran):
    project, done = ran
    assert done.returncode == 0
    with sqlite3.connect(project / "mlflow.db") as db:
        (exp_id,) = db.execute("SELECT experiment_id FROM experiments WHERE name = 'study-tiny'").fetchone()
        points = dict(db.execute("SELECT t.value, r.run_uuid FROM tags t JOIN runs r ON r.run_uuid = t.run_uuid "
                                 "WHERE t.key = 'syncsafe.point' AND r.experiment_id = ?", (exp_id,)))
        assert set(points) == {"SLO multiplier=1.5", "SLO multiplier=2.0"}
        for run_id in points.values():
            children = db.execute("SELECT count(*) FROM tags WHERE key = 'mlflow.parentRunId' AND value = ?",
                                  (run_id,)).fetchone()[0]
            assert children >= 5  # the point's stage runs sit under it
            overrides = db.execute("SELECT value FROM tags WHERE key = 'syncsafe.overrides' AND run_uuid = ?",
                                   (run_id,)).fetchone()[0]
            assert json.loads(overrides)["schedules.source"] == "harness"
    shown = _cli(project, "compare", "--study", "tiny")
    assert shown.returncode == 0, shown.stderr
    header, _, row = shown.stdout.splitlines()[:3]
    assert "SLO multiplier=1.5" in header and "SLO multiplier=2.0" in header
    assert row.startswith("| bursty | wa_diloco |") and row.count("[") == 2


def test_a_study_with_untracked_code_refuses_to_start(ran):
    project, _ = ran
    (project / "src" / "syncsafe" / "untracked_helper.py").write_text("X = 1\n")
    try:
        done = _cli(project, "study", "run", "tiny")
    finally:
        (project / "src" / "syncsafe" / "untracked_helper.py").unlink()
    assert done.returncode == 2 and "untracked_helper.py" in done.stderr and "git add" in done.stderr


def _in_project(project: Path) -> list[psutil.Process]:
    """Processes whose working directory is the project or one of DVC's temporary experiment copies in it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if Path(proc.cwd()).is_relative_to(project):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError):
            pass
    return found


def _running_stage(project: Path) -> bool:
    for proc in _in_project(project):
        try:
            if any(part.startswith("stages/") for part in proc.cmdline()):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return False


def test_sigterm_of_a_running_study_stops_dvc_s_queue_worker_and_exits_143(tmp_path, tiny_raw):
    """DVC's queue worker is its own process: before, a SIGTERM of `study run` left it running the points."""
    project = study_project(Path(__file__).resolve().parents[2], tmp_path / "study", tiny_raw())
    study = subprocess.Popen([sys.executable, "-m", "syncsafe.cli", "study", "run", "tiny", "--root", "."],
                             cwd=project, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        # ready when the queue runs a point: one of its stage scripts is running in the project
        while time.monotonic() < deadline and study.poll() is None and not _running_stage(project):
            time.sleep(0.2)
        assert study.poll() is None, "the study ended before its queue ran: " + study.communicate()[1][-2000:]
        study.send_signal(signal.SIGTERM)
        out, err = study.communicate(timeout=300)
    finally:
        if study.poll() is None:
            study.kill()
    assert study.returncode == 143, out[-2000:] + err[-2000:]
    assert err.strip().splitlines() == ["error: terminated (SIGTERM)"]
    assert "interrupted: stopping DVC's queue worker" in out
    deadline = time.monotonic() + 60  # the killed worker's children may take a moment to be reaped
    while _in_project(project) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _in_project(project) == [], "a DVC process outlived the study"
    queue = subprocess.run([sys.executable, "-m", "dvc", "queue", "status"], cwd=project, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert "Queued" not in queue.stdout and "Running" not in queue.stdout, queue.stdout
