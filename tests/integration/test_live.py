"""`syncsafe live` against the real vLLM CPU server with real DiLoCo islands (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

from vllm_env import VLLM_PYTHON, eager, require_vllm_python
from syncsafe import timebase
from syncsafe.config import load_params
from syncsafe.schedules.schedule import read_schedule
from syncsafe.live.sidecar import condition_order, live_action_space, live_dir
from syncsafe.traces.stage import build_traces

pytestmark = [pytest.mark.slow, pytest.mark.real_server]


def make_project(root: Path, raw: dict) -> Path:
    """The tiny profile (`raw`, from the `tiny_raw` fixture: one seed, fixed_h and wa_diloco), 60 trace s per
    live run (15 wall s); fixed_h at min_h merges at every decision it can."""
    raw["control"]["fixed_h"]["h"] = raw["control"]["min_h"]
    eager(raw)["replay"]["vllm"].update({"python": str(VLLM_PYTHON), "startup_timeout_s": 600})
    raw["live"] = {"enabled": True, "policy": "fixed_h", "duration_s": 60, "warmup_s": 4}
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    build_traces(load_params(path), "bursty", root)
    return path


def _ours(root: Path) -> list[psutil.Process]:
    """Processes still running whose command line names the project (server, islands, sidecar)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != os.getpid() and any(str(root) in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def live_project(tmp_path_factory, tiny_raw) -> Path:
    require_vllm_python()
    root = tmp_path_factory.mktemp("live")
    params = make_project(root, tiny_raw())
    done = subprocess.run([sys.executable, "-m", "syncsafe.cli", "live", "--params", str(params), "--root", str(root)],
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "SYNCSAFE_TRACKING": "off"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


def test_four_runs_on_the_same_arrivals_in_the_seeds_order(live_project):
    index = pd.read_csv(live_project / "runs" / "live" / "index.csv")
    assert list(index["condition"]) == condition_order(0)
    assert list(index.sort_values("order")["condition"]) == condition_order(0)
    assert index["n_requests"].nunique() == 1 and index["n_requests"].iloc[0] > 0
    assert (index["n_failed"] == 0).all()
    for row in index.itertuples():
        run = live_project / row.path
        assert (run / "summary.json").is_file() and (run / "signals.parquet").is_file()
        signals = pd.read_parquet(run / "signals.parquet")
        assert len(signals) >= 20 and signals["ok"].mean() > 0.8  # 15 wall s at 4 scrapes/s
        assert row.scrape_failures == (~signals["ok"]).sum()
        # degraded exactly when the safe action replaced the policy in some decision
        lines = (run / "decisions.jsonl").read_text().splitlines()
        assert row.degraded == any(json.loads(line)["degraded"] for line in lines)
    assert not _ours(live_project), "a server, island or worker outlived the live command"


def test_policy_merges_only_at_decision_times_on_a_feasible_schedule(live_project):
    params = load_params(live_project / "params.yaml")
    space = live_action_space(params)
    run = live_dir(live_project, "bursty", 0) / "policy"
    schedule = read_schedule(run / "schedule.json")
    assert schedule.source == "live" and schedule.policy == "fixed_h"
    decisions = [json.loads(line) for line in (run / "decisions.jsonl").read_text().splitlines()]
    assert schedule.merge_starts_s == [d["t_s"] for d in decisions if d["merge"]]
    # fixed_h at min_h merges at every decision it may (20 s cycles, 8 s windows, 60 s run: 20 and 48) unless a
    # stale or failed /metrics scrape put the safe action in its place (a loaded machine): that cycle defers
    # until max_h, and the next one merges in its place
    control = params.control
    for d in decisions:
        rule = d["steps_since_merge"] >= (control.max_h if d["degraded"] else control.fixed_h.h)
        fits = d["t_s"] + params.merge.window_s <= params.live.duration_s  # a window past the run's end is dropped
        assert d["merge"] == (rule and fits), d
    if not any(d["degraded"] for d in decisions):
        assert schedule.merge_starts_s == [20.0, 48.0]
    assert space.contains(schedule.merge_starts_s)
    merges = pd.read_csv(run / "merges.csv")
    assert merges["t_s"].tolist() == schedule.merge_starts_s  # one worked merge per decision: the loop checks each
    walls = {d["t_s"]: d["wall_epoch"] for d in decisions}
    for m in merges.itertuples():
        assert 0 <= m.start_epoch - walls[m.t_s] < 0.5  # the merge starts at its decision, on the wall clock
        assert m.start_epoch < m.merge_end_epoch <= m.window_end_epoch
        assert m.bytes_communicated > 0
    requests = pd.read_parquet(run / "requests.parquet")
    assert requests["merge_active"].any()


def test_matched_random_copies_the_count_in_the_same_action_space(live_project):
    params = load_params(live_project / "params.yaml")
    space = live_action_space(params)
    base = live_dir(live_project, "bursty", 0)
    policy = read_schedule(base / "policy" / "schedule.json")
    drawn = read_schedule(base / "matched_random" / "schedule.json")
    assert drawn.matched_to == "fixed_h" and drawn.n_merges == policy.n_merges
    assert space.contains(drawn.merge_starts_s)
    for quiet in ("train_no_merge", "no_train"):
        assert read_schedule(base / quiet / "schedule.json").n_merges == 0
        assert not pd.read_parquet(base / quiet / "requests.parquet")["merge_active"].any()


def test_killing_the_sidecar_takes_the_server_and_islands_down(live_project, tmp_path):
    """SIGKILL leaves the sidecar no chance to clean up: its children must follow it on their own."""
    params = live_project / "params.yaml"
    root = tmp_path / "killed"
    root.mkdir()
    for sub in ("data", "models"):
        os.symlink(live_project / sub, root / sub)
    proc = subprocess.Popen([sys.executable, "-m", "syncsafe.cli", "live", "--params", str(params), "--root", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "SYNCSAFE_TRACKING": "off"})
    deadline = time.monotonic() + 600
    island_log = None
    while time.monotonic() < deadline and island_log is None:
        island_log = next(iter((root / "runs" / "live").glob("bursty/seed-0/*/logs/island-1.log")), None)
        assert proc.poll() is None, "live exited before its islands started"
        time.sleep(1.0)
    assert island_log is not None
    family: list[psutil.Process] = []
    started_by = time.monotonic() + 120  # until the server, its engine, the islands and the workers are all up
    while time.monotonic() < started_by and not (len(family) >= 4 and _ours(root)):
        family = psutil.Process(proc.pid).children(recursive=True)
        time.sleep(0.2)
    assert len(family) >= 4 and _ours(root)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone_by = time.monotonic() + 30
    while time.monotonic() < gone_by and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family):
        time.sleep(0.5)
    left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline()[:4] for p in left]
    assert not _ours(root)


def server_stop_drill(root: Path, params_path: Path):
    """A real vLLM server killed mid-run (a crash: its whole process group, SIGKILL) under a wall-clock
    controller reading its /metrics; returns the run and the plan."""
    from syncsafe.config import HarnessConfig
    from syncsafe.control.clock import WallClock
    from syncsafe.control.controller import ControlPlan, run_controller
    from syncsafe.control.fallback import SafeFallback
    from syncsafe.control.harness import ProgressModelLearners
    from syncsafe.control.live_signals import LiveSignals, SignalSettings, http_fetch
    from syncsafe.control.policies import PressureGate
    from syncsafe.realarm.arm import served_model
    from syncsafe.serving.vllm_server import VllmServer

    params = load_params(params_path)
    cfg = params.replay.vllm
    server = VllmServer(VLLM_PYTHON, served_model(params, root), root / "logs" / "stop-drill.log", cfg.server_args,
                        cfg.startup_timeout_s, cache_dir=root / "models" / "vllm-cache")
    plan = ControlPlan(step_s=0.25, min_h=1, max_h=4, window_s=0.25, min_gap_s=0.0, duration_s=12.0)

    def crash() -> None:
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "vllm.entrypoints.openai.api_server" in cmd and str(server.port) in cmd:
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)

    with server:
        start = timebase.now() + 0.5
        with LiveSignals(http_fetch(server.base_url, 1.0), start, SignalSettings(), 0.25, 1.0) as signals:
            gate = SafeFallback(PressureGate(0.5), signals.problem)
            crasher = threading.Timer(4.0, crash)
            crasher.start()
            result = run_controller(gate, ProgressModelLearners(HarnessConfig(), 0), signals, plan,
                                    timebase=WallClock(start, 1.0))
            crasher.join()
    return result, plan


def test_real_server_that_stops_answering_turns_the_policy_into_the_safe_action(live_project):
    """Decisions before the crash follow the policy; after it they defer until max_h, then merge."""
    result, plan = server_stop_drill(live_project, live_project / "params.yaml")
    before = [d for d in result.decisions if d.t_s < 3.0]
    after = [d for d in result.decisions if d.t_s > 6.0]
    assert before and not any(d.reason.startswith("degraded") for d in before)
    assert after and all(d.reason.startswith("degraded") for d in after)
    fits = lambda d: d.t_s + plan.window_s <= plan.duration_s  # noqa: E731 - no merge past the end
    assert all(d.merge == (d.steps_since_merge >= plan.max_h and fits(d)) for d in after)
    assert any(d.merge and d.forced for d in after)
