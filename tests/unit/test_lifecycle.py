"""Kills, exits and secrets: what a stage leaves behind, how it exits, what it writes where others can read.

(Killing a real train stage and a real server: tests/integration/test_train.py and test_vllm_identity.py.)
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from syncsafe import timebase
from syncsafe import io
from syncsafe.cli import app
from syncsafe.config import ControlConfig, MergeConfig
from syncsafe.control.serving_model import load_calibration
from syncsafe.control.policies import build_policy
from syncsafe.control.types import ClockState, FleetSignals
from syncsafe.errors import BadInput
from syncsafe.pipeline.failures import fails_cleanly
from syncsafe.procs import listening_socket, loopback_store, reap_scratch, redact, scratch_dir
from syncsafe.realarm.arm import MetricsScraper

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("error, code, words", [
    (KeyError("nope"), 1, "error: KeyError: 'nope'"),
    (TypeError("bad type"), 1, "error: TypeError: bad type"),
    (AssertionError(), 1, "error: AssertionError"),
    (ImportError("no module named x"), 1, "error: ImportError: no module named x"),
    (ValueError("a run failed"), 1, "error: a run failed"),
    (BadInput("params: x"), 2, "error: params: x"),
    (KeyboardInterrupt(), 130, "error: interrupted"),
])
def test_every_exception_ends_in_one_line_and_its_documented_exit_code(capsys, error, code, words):
    def fail():
        raise error

    with pytest.raises(SystemExit) as exit_:
        fails_cleanly(fail)()
    assert exit_.value.code == code
    err = capsys.readouterr().err
    assert err.strip() == words and "Traceback" not in err


def test_compare_refuses_a_stage_that_does_not_exist_before_reading_anything(tmp_path):
    result = CliRunner().invoke(app, ["compare", "--stage", "trian", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "--stage 'trian': not a stage" in result.output
    assert not (tmp_path / "mlflow.db").exists()


def test_a_malformed_max_num_seqs_is_refused_with_the_params(tmp_path, raw_params):
    raw_params["replay"]["vllm"]["server_args"] = ["--max-num-seqs", "eight"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw_params))
    result = CliRunner().invoke(app, ["check", "--params", str(path)])
    assert result.exit_code == 2 and "--max-num-seqs needs a positive whole number" in result.output


@pytest.mark.parametrize("name", ["fixed_h", "random_deferral", "wa_forecast", "wa_seasonal", "wa_lookahead"])
def test_a_policy_resumed_from_its_json_state_decides_as_if_never_stopped(name):
    """The checkpointed policy is JSON (no pickle from runs/): rebuilt from params, then restored."""
    control, merge = ControlConfig(), MergeConfig()
    make = lambda: build_policy(name, control, merge, 3, load_calibration(None), 5.0)  # noqa: E731
    rng = np.random.default_rng(0)
    samples = [FleetSignals(t_s=5.0 * i, busy=bool(i % 7 < 2), arrival_rate=float(rng.uniform(1, 6)),
                            inference_pressure=float(rng.uniform()), network_pressure=0.2, checkpoint_pressure=0.1)
               for i in range(120)]
    clock = lambda i: ClockState(t_s=5.0 * i, step=i, steps_since_merge=6, min_h=4, max_h=16, cycle=i)  # noqa: E731
    original = make()
    for i in range(60):
        original.observe(samples[i:i + 1])
        original.decide([], samples[i], clock(i))
    state = json.loads(json.dumps(original.state()))
    resumed = make()
    resumed.restore(state)
    for i in range(60, 120):
        for p in (original, resumed):
            p.observe(samples[i:i + 1])
        assert resumed.decide([], samples[i], clock(i)) == original.decide([], samples[i], clock(i))


def test_a_handed_over_listener_leaves_no_window_for_another_process():
    listener = listening_socket()
    port = listener.getsockname()[1]
    intruder = socket.socket()
    with pytest.raises(OSError):  # the port is taken the moment it was chosen
        intruder.bind(("127.0.0.1", port))
    intruder.close()
    store = loopback_store(0, 1, port, timedelta(seconds=10), listener)
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_scratch_folders_of_dead_processes_are_reaped(tmp_path):
    mine = scratch_dir(tmp_path, "merge")
    assert mine.parent == tmp_path / "logs" / "scratch" and f"-{os.getpid()}-" in mine.name
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / "logs" / "scratch" / f"vllm-{child.stdout.strip()}-abc"
    dead.mkdir()
    (dead / "socket-leftover").write_text("x")
    assert reap_scratch(tmp_path) == [dead]
    assert mine.is_dir() and not dead.exists()


def test_a_killed_swap_leaves_the_old_or_the_new_output_and_its_leftovers_are_reaped(tmp_path):
    target = tmp_path / "runs" / "calibration"
    io.replace_directory(target, lambda d: (d / "a.json").write_text("old"))
    # a kill between "target renamed aside" and "new renamed in" (the two-step swap where no exchange exists)
    aside = tmp_path / "runs" / ".calibration.x1.old"
    aside.mkdir()
    os.replace(target, aside / "calibration")
    half = tmp_path / "runs" / ".calibration.x2.tmp"
    half.mkdir()
    (half / "a.json").write_text("half")
    inner = target.parent / ".stray.json.x3.tmp"
    inner.write_text("partial")
    assert not target.exists()
    removed = io.reap_leftovers(target)
    assert (target / "a.json").read_text() == "old" and aside in removed and half in removed
    assert not aside.exists() and not half.exists()
    # the atomic exchange: a new directory replaces the old in one step
    io.replace_directory(target, lambda d: (d / "a.json").write_text("new"))
    assert (target / "a.json").read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == [".stray.json.x3.tmp", "calibration"]


def test_a_scraper_that_cannot_reach_the_server_counts_every_failure():
    listener = listening_socket()
    port = listener.getsockname()[1]
    listener.close()  # nothing answers there now
    with MetricsScraper(f"http://127.0.0.1:{port}", 0.05, timebase.now(), 1.0) as scraper:
        deadline = time.monotonic() + 10
        while len(scraper.failures) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(scraper.failures) >= 3 and scraper.failure_rate == 1.0 and scraper.frame().empty


def test_secrets_are_written_owner_only_from_creation_and_redacted_in_logs(tmp_path):
    path = io.write_json(tmp_path / "team.json", {"password": "s3cret"}, mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(io.write_text(tmp_path / "plain.txt", "x").stat().st_mode) == 0o644
    line = "mlflow server --backend-store-uri postgresql+psycopg2://mlflow:s3cret@127.0.0.1:5432/mlflow"
    assert "s3cret" not in redact(line) and "//***@127.0.0.1:5432" in redact(line)


def test_the_compose_file_publishes_on_loopback_only_and_keeps_no_secret():
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    text = (REPO / "docker" / "compose.yaml").read_text()
    assert "POSTGRES_PASSWORD: airflow" not in text and "airflow:airflow@" not in text
    assert "${POSTGRES_PASSWORD:?" in text
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=REPO)
    assert ignored.returncode == 0, "docker/.env (the filled-in secrets) is git-ignored"
