"""Test helpers of the team setup's integration tests (one machine and across fleet hosts).

What is missing to run it, skipping or failing (under CI) on that, ``scripts/team.sh`` with a clean
environment, one tiny nightly run through the REST API (timed from the trigger to the run's end), and
the checks both tests make: the run's stage processes each logged their runs to the MLflow server, no
secret is on a command line or in a log, and a process session's members.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import psutil
import pytest
from parallel_writers import item_runs

from syncsafe.team import stack

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "team.sh"
DAG_ID = "syncsafe_nightly"
#: The Makefile's airflow-nightly-tiny conf: the tiny profile (one regime and seed, two policies), vLLM off.
TINY_CONF = {"profile": "tiny", "vllm": False}
#: DAG task -> the ``stage`` tag of the MLflow run its stage process logs.
STAGE_OF_TASK = {"traces": "traces", "train": "train", "schedules": "schedules",
                 "replay_simulator": "replay-simulator", "analyze": "analyze"}


def missing_installs() -> list[str]:
    """What ``make team-env`` installs and this machine lacks."""
    missing = [str(p) for p in (REPO / ".venv-airflow" / "bin" / "airflow",) if not p.exists()]
    if not shutil.which("redis-server") and not Path("/usr/bin/redis-server").exists():
        missing.append("redis-server")
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")) and not shutil.which("initdb"):
        missing.append("PostgreSQL (initdb)")
    try:
        import psycopg2  # noqa: F401 - the MLflow server's Postgres driver
    except ImportError:
        missing.append("psycopg2 in .venv")
    return missing


def cannot_run(reason: str) -> NoReturn:
    """Skip, except under CI, where a skip would hide a missing install step: fail there."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def require_installs() -> None:
    missing = missing_installs()
    if missing:
        cannot_run(f"missing {missing}: `make team-env` installs them (`make test` runs it)")


def team_script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``scripts/team.sh ARGS`` without the caller's Airflow, SyncSafe or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SYNCSAFE_", "MLFLOW_"))}
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Nightly:
    """One finished DAG run: its id, final state, task instances, and seconds from trigger to its end."""

    run_id: str
    state: str
    tis: list[dict]
    wall_s: float

    def summary(self) -> list[tuple]:
        return [(t["task_id"], t["map_index"], t["state"], t["hostname"]) for t in self.tis]


@contextlib.contextmanager
def team_up(prefix: str, *up_args: str) -> Iterator[stack.Layout]:
    """The team setup up (`team.sh up --dir <folder> *up_args`) in a temporary state folder (PostgreSQL's user
    must reach it: under /tmp, not pytest's 0700 tmp folder); brought down at the end whatever happened (a
    no-op after a test that took it down itself)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    layout = stack.Layout.at(root, REPO)
    try:
        done = team_script("up", "--dir", str(root), *up_args, "--env", "SYNCSAFE_RETRIES=0")
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        admin = stack.load(layout)["secrets"]["admin"]
        assert admin not in done.stdout + done.stderr, "`team up` printed the admin password"
        assert str(layout.airflow_home / "passwords.json") in done.stdout, "it prints where the password is"
        with pytest.MonkeyPatch.context() as env:  # this process's MLflow clients log in as the stages do
            for key, value in stage_login_env(layout).items():
                env.setenv(key, value)
            yield layout
    finally:
        stack.down(layout)
        shutil.rmtree(root, ignore_errors=True)


def stage_login_env(layout: stack.Layout) -> dict[str, str]:
    """The MLflow server login the setup gives its stage processes (its basic-auth app refuses anyone else)."""
    secrets = stack.load(layout)["secrets"]
    return {"MLFLOW_TRACKING_USERNAME": stack.MLFLOW_STAGE_USER, "MLFLOW_TRACKING_PASSWORD": secrets["mlflow_stage"]}


def successful_nightly(layout: stack.Layout, label: str) -> Nightly:
    """One tiny nightly run of the setup at `layout`, triggered and awaited through the REST API; it must succeed."""
    run = run_tiny_nightly(stack.client(layout), label)
    assert run.state == "success", f"{run.run_id}: {run.state}; {run.summary()}\n{_failed_logs(layout, run)}"
    return run


def _failed_logs(layout: stack.Layout, run: Nightly, lines: int = 40) -> str:
    """What each failed task's stage process printed, its last `lines` lines (the state folder is removed when the
    test ends). Airflow 3 writes its task logs as JSON lines; the stage's own output is the events of the bash
    operator's subprocess logger, which Airflow's traceback at the end of the log would otherwise push out of view."""
    out = []
    for t in run.tis:
        if t["state"] == "failed":
            for log in sorted((layout.airflow_home / "logs").rglob(f"task_id={t['task_id']}/**/*.log")):
                printed = _stage_output(log.read_text(errors="replace"))
                out.append(f"--- {log.relative_to(layout.airflow_home)}\n" + "\n".join(printed[-lines:]))
    return "\n".join(out) or f"(no failed task's log under {layout.airflow_home / 'logs'})"


def _stage_output(text: str) -> list[str]:
    """The subprocess's lines of one Airflow task log (every line as it is where the log is not JSON)."""
    events: list[tuple[str, str]] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            events.append((str(event.get("logger", "")), str(event.get("event", ""))))
        else:
            events.append(("subprocess", line))
    printed = [e for logger, e in events if "subprocess" in logger.lower()]
    return printed or [e for _, e in events]


def run_tiny_nightly(client, label: str, timeout_s: float = 1500) -> Nightly:
    """Trigger the tiny nightly DAG through ``client`` (an ``AirflowClient``) once it is parsed, wait for it,
    and print the wall time from the trigger to the end the poll saw (+- its 3 s period)."""
    client.wait_for_dag(DAG_ID)
    client.unpause(DAG_ID)
    start = time.monotonic()
    run_id = client.trigger(DAG_ID, TINY_CONF)
    state = client.wait_run(DAG_ID, run_id, timeout_s=timeout_s)
    wall = time.monotonic() - start
    print(f"\ntiny nightly ({label}): {state} {wall:.0f} s from trigger to end; load average {os.getloadavg()}")
    return Nightly(run_id, state, client.task_instances(DAG_ID, run_id), wall)


def check_stage_runs(uri: str, nightly: Nightly) -> None:
    """Every stage process of the run logged its stage run (and items, with served artifacts) to ``uri``."""
    from mlflow import MlflowClient

    runs = item_runs(uri, f"airflow-{DAG_ID}-{nightly.run_id}")
    assert len(runs["pipeline"]) == 1
    stages = runs["stage"]
    assert {r.info.status for r in stages} == {"FINISHED"}
    for task, stage in STAGE_OF_TASK.items():
        expected = sum(1 for t in nightly.tis if t["task_id"] == task and t["state"] == "success")
        got = [r for r in stages if r.data.tags["stage"] == stage]
        assert expected >= 1 and len(got) == expected, (task, expected, [r.data.tags["stage"] for r in stages])
    trained = {(r.data.tags["policy"], r.data.tags["seed"]) for r in runs["item"] if r.data.tags["stage"] == "train"}
    assert trained == {("fixed_h", "0"), ("wa_diloco", "0")}
    # the runs' artifacts went through the server too (served artifacts, not the worker's disk)
    client = MlflowClient(tracking_uri=uri)
    train_stage = next(r for r in stages if r.data.tags["stage"] == "train")
    assert train_stage.info.artifact_uri.startswith("mlflow-artifacts:")
    item = next(r for r in runs["item"] if r.data.tags["stage"] == "train")
    assert client.list_artifacts(item.info.run_id), "train item run without artifacts"


def check_no_secret_leaks(root: Path, state: dict, private: list[Path]) -> None:
    """No secret of ``state`` on a running process's command line or in a log under ``root``; each
    of ``private`` readable by its owner only."""
    secrets = [v for v in state["secrets"].values() if len(v) >= 16]
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for name, record in state["processes"].items():
        proc = psutil.Process(int(record["pid"]))
        for member in [proc, *proc.children(recursive=True)]:
            try:
                cmdline = " ".join(member.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess):  # a child that just ended: no command line
                continue
            assert not any(secret in cmdline for secret in secrets), f"{name}: a secret in its command line"
    for log in root.rglob("*.log"):
        text = log.read_text(errors="replace")
        assert not any(secret in text for secret in secrets), f"{log}: a secret in the log"


def session(sid: int) -> list[psutil.Process]:
    """The processes of session ``sid``."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                out.append(proc)
        except (ProcessLookupError, PermissionError):
            continue
    return out
