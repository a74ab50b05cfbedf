"""Replay against a real vLLM CPU server (slow: the server starts in about a minute).

Needs the vLLM environment (`make vllm-env`, which `make test` runs).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from vllm_env import VLLM_PYTHON, require_vllm_python
from syncsafe.config import VllmReplay, load_params
from syncsafe.schedules.stage import build_index, build_schedules
from syncsafe.serving.vllm_replay import replay_vllm
from syncsafe.serving.vllm_server import ServerError
from syncsafe.traces.stage import build_traces

pytestmark = pytest.mark.slow


def make_project(root: Path, raw: dict) -> Path:
    """The tiny profile's params (`raw`, from the `tiny_raw` fixture): harness schedules, fixed_h replayed."""
    raw["control"]["policies"] = ["fixed_h", "wa_seasonal"]
    raw["schedules"].update({"random_draws": 1, "source": "harness"})
    raw["analysis"]["primary"]["policy"] = "fixed_h"  # the declared primary test must name a controller of this project
    raw["replay"]["vllm"].update({"python": str(VLLM_PYTHON), "policies": ["fixed_h"], "draws": 1, "time_scale": 4.0,
                                  "max_trace_s": 60, "startup_timeout_s": 600})
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    params = load_params(path)
    build_traces(params, "bursty", root)
    build_schedules(params, "bursty", root)
    build_index(params, root)
    return path


@pytest.fixture(scope="module")
def vllm_project(tmp_path_factory, tiny_raw) -> Path:
    require_vllm_python()
    root = tmp_path_factory.mktemp("vllm")
    replay_vllm(load_params(make_project(root, tiny_raw())), root)
    return root


def _replays(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "runs" / "replay-sets" / "vllm" / "index.csv")


def test_real_server_answers_an_open_loop_replay(vllm_project):
    index = _replays(vllm_project)
    assert sorted(index["policy"]) == ["fixed_h", "matched_random", "no_sync"]
    for rec in index.itertuples():
        requests = pd.read_parquet(vllm_project / rec.path / "requests.parquet")
        assert len(requests) > 20 and (requests["error"] == "").all()
        assert (requests["ttft_ms"] > 0).all() and (requests["ttft_ms"] <= requests["e2e_ms"]).all()
        assert (requests["output_tokens_received"] == requests["output_tokens"]).all()
        signals = pd.read_parquet(vllm_project / rec.path / "signals.parquet")
        assert {"running", "waiting", "kv_cache_usage"} <= set(signals.columns) and len(signals) > 5
        gauges = signals[["running", "waiting", "kv_cache_usage"]]
        assert gauges.notna().all().all(), "every scrape read every gauge"
        assert (gauges >= 0).all().all() and (signals["kv_cache_usage"] <= 1).all()
        assert (signals["running"] >= 1).any(), "the server was seen running requests during the replay"
        summary = json.loads((vllm_project / rec.path / "summary.json").read_text())
        assert summary["valid"] is True and summary["failure_rate"] == 0.0 and rec.valid


def test_arrival_accuracy(vllm_project):
    no_sync = _replays(vllm_project).query("policy == 'no_sync'").iloc[0]
    requests = pd.read_parquet(vllm_project / no_sync["path"] / "requests.parquet")
    lag = requests["send_lag_ms"]
    assert (lag >= 0).all(), "never sent before its arrival time"
    # a late send is charged to the request: latency runs from the scheduled arrival, so TTFT includes the lag
    ok = requests["error"].fillna("") == ""
    assert (requests.loc[ok, "ttft_ms"] >= lag[ok] - 1e-6).all()
    # and a replay whose load generator ran late is not valid (the speed itself is benchmarks/bench_loadgen.py's)
    summary = json.loads((vllm_project / no_sync["path"] / "summary.json").read_text())
    limits = VllmReplay()  # the fixture keeps the default thresholds
    assert summary["valid"] == (summary["send_lag_p99_ms"] <= limits.max_send_lag_p99_ms
                                and summary["failure_rate"] <= limits.max_failure_rate)
    assert (requests["cap_wait_ms"] < 1).all(), "the in-flight cap did not bind"


def test_merge_work_and_merge_flags_only_inside_windows(vllm_project):
    index = _replays(vllm_project)
    for rec in index.itertuples():
        schedule = json.loads((vllm_project / rec.schedule).read_text())
        windows = pd.read_csv(vllm_project / rec.path / "windows.csv")
        requests = pd.read_parquet(vllm_project / rec.path / "requests.parquet")
        starts = [s for s in schedule["merge_starts_s"] if s < 60]
        assert len(windows) == len(starts)
        for (start, end), w in zip([(s, min(s + schedule["window_s"], 60)) for s in starts], windows.itertuples()):
            assert start - 0.1 <= w.start_s and w.end_s <= end + 4.0 * 0.5  # trace seconds; time_scale 4
        # recompute every flag: a request is merge-active when its life on the server (send to completion,
        # latency counted from the scheduled arrival) overlaps a window the merge work actually ran
        end_s = np.maximum(requests["arrival_s"] + requests["e2e_ms"].fillna(0.0) / 1000.0 * 4.0, requests["send_s"])
        expected = np.zeros(len(requests), dtype=bool)
        for w in windows.itertuples():
            expected |= (requests["send_s"] < w.end_s).to_numpy() & (end_s >= w.start_s).to_numpy()
        assert (requests["merge_active"].to_numpy() == expected).all()
        assert expected.any() == bool(starts)


def _server_processes(root: Path) -> list[psutil.Process]:
    """This project's API servers (the model they serve lives under `root`)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmd and any(str(root) in part for part in cmd):
            found.append(proc)
    return found


def _group_members(pgid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def test_a_server_that_dies_mid_run_fails_loudly_and_writes_no_summary(tmp_path, tiny_raw):
    params = load_params(make_project(tmp_path, tiny_raw()))
    out = tmp_path / "runs" / "replay-sets" / "vllm" / "bursty" / "seed-0"

    groups: list[int] = []

    def kill_after_first_summary() -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if (out / "no_sync" / "summary.json").exists():
                for proc in _server_processes(tmp_path):  # the API server only: its engine and worker live on
                    groups.append(os.getpgid(proc.pid))
                    proc.kill()
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_after_first_summary, daemon=True)
    killer.start()
    with pytest.raises(ServerError, match=r"vLLM server exited") as err:
        replay_vllm(params, tmp_path)
    killer.join()
    assert "log" in str(err.value)
    assert (out / "no_sync" / "summary.json").exists()
    assert not (out / "fixed_h" / "summary.json").exists()
    assert not (tmp_path / "runs" / "replay-sets" / "vllm" / "index.csv").exists()
    assert groups and not any(_group_members(g) for g in groups), "no server process outlives the stage"
