"""Replay against a real vLLM CPU server: the replays of the session's shared `dvc repro` (`real_repro`), read
here, and the server's failure paths, each on its own server with the shared run's server profile.

Needs the vLLM environment (`make vllm-env`, which `make test` runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from real_repro import SERVER_PROFILE, TIME_SCALE, borrow_profile
from vllm_env import VLLM_PYTHON, eager
from syncsafe.config import load_params
from syncsafe.schedules.schedule import read_schedule
from syncsafe.schedules.stage import build_index, build_schedules
from syncsafe.serving.placement import parse_cpu_list
from syncsafe.realarm.design import check_span_budget
from syncsafe.realarm.capacity import CONFIRM_REPEATS
from syncsafe.artifacts.calibration import read_server_profile
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.realarm.engine_profile import ServerProfile
from syncsafe.realarm.arm import server_log_path
from syncsafe.realarm.plan import plan_real_arm
from syncsafe.realarm.server_profile import read_measured_server
from syncsafe.realarm.replays import replay_vllm
from syncsafe.serving.vllm_server import ServerError
from syncsafe.traces.stage import build_traces

pytestmark = [pytest.mark.slow, pytest.mark.real_server]
VLLM_SET = Path("runs") / "replay-sets" / "vllm"


def make_project(root: Path, raw: dict, **vllm) -> Path:
    """The tiny profile's params (`raw`, from the `tiny_raw` fixture): harness schedules, fixed_h replayed (the
    shared run's primary: its profile and model are borrowed)."""
    raw["control"]["policies"] = ["fixed_h", "wa_seasonal"]
    raw["schedules"].update({"random_draws": 1, "source": "harness"})
    raw["analysis"]["primary"]["policy"] = "fixed_h"  # the declared primary test must name a controller of this project
    raw["replay"]["vllm"].update({"python": str(VLLM_PYTHON), "startup_timeout_s": 600, **vllm})
    eager(raw)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    params = load_params(path)
    build_traces(params, "bursty", root)
    build_schedules(params, "bursty", root)
    build_index(params, root)
    return path


@pytest.fixture(scope="module")
def vllm_project(real_repro) -> Path:
    """The shared run's project, once its `dvc repro` succeeded."""
    assert real_repro.first.returncode == 0, real_repro.first.stdout[-3000:] + real_repro.first.stderr[-3000:]
    return real_repro.project


def _replays(root: Path, name: str = "index.csv") -> pd.DataFrame:
    return pd.read_csv(root / VLLM_SET / name)


def _summary(root: Path, rel: str) -> dict:
    return json.loads((root / rel / "summary.json").read_text())


def _plan(root: Path) -> dict:
    return json.loads((root / VLLM_SET / "plan.json").read_text())["regimes"]["bursty"]


def test_real_server_answers_an_open_loop_replay(vllm_project):
    index = _replays(vllm_project)
    controllers = _plan(vllm_project)["controllers"]
    assert sorted(index["policy"]) == sorted(["even_cadence", "matched_random"] * len(controllers)
                                             + controllers + ["no_sync"])
    for rec in pd.concat([index, _replays(vllm_project, "repeats.csv")]).itertuples():
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
        summary = _summary(vllm_project, rec.path)
        assert summary["failure_rate"] == 0.0 and summary["scrape_failures"] == 0 and summary["attempts"] == 1
        assert bool(rec.valid) == summary["valid"]
        if not summary["valid"]:  # only for what the server measured, each reason recomputed from the replays
            _check_invalid_reasons(vllm_project, rec, requests, summary["invalid_reason"])


def _check_invalid_reasons(root: Path, rec, requests: pd.DataFrame, reasons: str) -> None:
    """A replay of a quiet machine is invalid only for what its server measured: a no-sync control whose TTFT p95
    passed the capacity search's bound (overloaded), or its seed's no-sync controls disagreeing beyond their
    sampling noise (the noise floor; a VM whose server pace moves between replays is measured as such)."""
    plan = json.loads((root / VLLM_SET / "plan.json").read_text())
    for reason in reasons.split("; "):
        if reason.startswith("overloaded: "):
            assert rec.policy == "no_sync"
            assert np.percentile(requests["ttft_ms"], 95) > plan["loads"][rec.regime]["ttft_bound_ms"]
            continue
        assert reason.startswith(f"noise floor: seed {rec.seed} left out"), reason
        controls = pd.concat([_replays(root), _replays(root, "repeats.csv")])
        controls = controls[(controls["policy"] == "no_sync") & (controls["regime"] == rec.regime)
                            & (controls["seed"] == rec.seed)]
        tables = [pd.read_parquet(root / c.path / "requests.parquet") for c in controls.itertuples()
                  if "overloaded" not in (_summary(root, c.path).get("invalid_reason") or "")]
        cfg = load_params(root / "params.yaml").replay.vllm
        assert len(tables) >= 2 and _summary(root, rec.path)["control_p"] < cfg.control_alpha  # the p that decided


def test_the_plan_is_the_pure_function_of_params_and_the_profile_the_replay_stage_printed(vllm_project):
    params = load_params(vllm_project / "params.yaml")
    measured = read_measured_server(params, vllm_project)
    written = json.loads((vllm_project / VLLM_SET / "plan.json").read_text())
    again = plan_real_arm(params, vllm_project, read_schedule_index(vllm_project), measured.loads,
                          read_server_profile(vllm_project, ServerProfile), written["placement"])
    assert again.model_dump(mode="json", exclude={"warmup", "notes"}) == \
        {k: v for k, v in written.items() if k not in ("warmup", "notes")}
    assert measured.loads["bursty"].model_dump(mode="json") == written["loads"]["bursty"]
    assert measured.engine_profiled and (vllm_project / SERVER_PROFILE / "profile.json").is_file()
    assert measured.warmup is not None and written["warmup"] is not None, "both server runs were warmed up"


def test_the_profile_checked_the_pinned_load_on_the_real_server(vllm_project):
    """The plan is pinned (time scale and span from params): the profile confirms the rate its busiest window
    needs at the target utilisation instead of searching for the knee, and records it as the capacity's lower
    bound."""
    plan = json.loads((vllm_project / VLLM_SET / "plan.json").read_text())
    load = plan["loads"]["bursty"]
    probes = load["probes"]
    pinned = load_params(vllm_project / "params.yaml").replay.vllm.pinned_time_scale("bursty")
    assert load["time_scale"] == pinned and load["time_scale_fixed"]
    assert probes[0]["sustained"] and probes[0]["rate_rps"] < load["capacity_rps"], "the light probe came first"
    assert load["capacity_rps"] == pytest.approx(load["peak_rate"] * pinned / 0.7)
    at_capacity = [p for p in probes if p["rate_rps"] == load["capacity_rps"]]
    assert sum(p["sustained"] for p in at_capacity) == CONFIRM_REPEATS, "every confirmation repeat held the rate"
    assert max(p["rate_rps"] for p in probes) == load["capacity_rps"], "nothing above the pinned need was probed"
    assert load["ttft_bound_ms"] == pytest.approx(3.0 * probes[0]["ttft_p95_ms"])
    assert load["utilisation"] == pytest.approx(0.7)
    assert len(load["noise_log_ratios"]) > 10
    regime = plan["regimes"]["bursty"]
    assert regime["time_scale"] == load["time_scale"] and 0.0 <= regime["power"] <= 1.0
    for rec in _replays(vllm_project).itertuples():
        assert _summary(vllm_project, rec.path)["time_scale"] == regime["time_scale"]


def test_every_real_draw_is_count_matched_in_the_replayed_span(vllm_project):
    index = _replays(vllm_project)
    plan = _plan(vllm_project)
    primary, span = plan["controllers"][0], plan["span_s"]
    replayed = index[index["policy"] == primary].iloc[0]
    controller = read_schedule(vllm_project / replayed["schedule"])
    draws = index[(index["policy"] == "matched_random") & (index["matched_to"] == primary)]
    assert len(draws) == plan["draws"] >= 1
    for rec in draws.itertuples():
        draw = read_schedule(vllm_project / rec.schedule)
        assert "matched_random_span" in rec.schedule
        check_span_budget(controller, draw, span)
        summary = _summary(vllm_project, rec.path)
        assert summary["span_merges"] == _summary(vllm_project, replayed["path"])["span_merges"] >= 1


def test_replays_ran_in_a_block_of_rounds_each_with_a_no_sync_control_and_the_slo_pooled_from_all_controls(
        vllm_project):
    rows = pd.concat([_replays(vllm_project), _replays(vllm_project, "repeats.csv")])
    summaries = [_summary(vllm_project, p) for p in rows["path"]]
    order = sorted((s["position"], s["round"], s["control"]) for s in summaries)
    assert [p for p, _, _ in order] == list(range(len(order)))
    assert [r for _, r, _ in order] == sorted(r for _, r, _ in order), "rounds one after the other"
    planned = [(r, c) for _, r, c in order if r < 3]
    assert sorted(c for r, c in planned if c is not None) == [0, 1, 2]
    plan = _plan(vllm_project)
    with_merges = len(plan["controllers"]) * (2 + plan["draws"])  # each controller, its draws and its cadence
    per_round = [sum(c is None for r, c in planned if r == k) for k in range(3)]
    for k in range(3):  # every round: its control and its share of the replays with merges, dealt in turn
        assert [c for r, c in planned if r == k].count(k) == 1
        assert per_round[k] in (with_merges // 3, -(-with_merges // 3))
    assert sum(per_round) == with_merges
    blocks = json.loads((vllm_project / VLLM_SET / "blocks.json").read_text())["blocks"]
    assert [(b["regime"], b["label"], b["resumed"]) for b in blocks][:1] == [("bursty", "seed-0", False)]
    assert sum(b["replays"] for b in blocks) == len(summaries), "every replay in one campaign block"
    assert len({json.dumps(s["slo"], sort_keys=True) for s in summaries}) == 1, "one SLO per seed"
    controls = [s for s in summaries if s["control"] is not None]
    assert len(controls) >= 3
    valid_controls = sum(s["valid"] for s in controls)
    assert all(s["slo_controls"] == valid_controls for s in summaries), "the SLO pools every valid control"
    # the noise floor: one control more than planned, then the seed left out whole (an overloaded control is
    # invalid on its own: `_check_invalid_reasons`)
    left_out = [s for s in summaries if "noise floor" in (s["invalid_reason"] or "")]
    if left_out:
        assert len(controls) == 4 and len(left_out) == len(summaries)
        alpha = load_params(vllm_project / "params.yaml").replay.vllm.control_alpha
        assert all(s["control_p"] < alpha for s in summaries), "the noise test that left it out is recorded"
    for s in summaries:
        low, high = s["e2e_p95_ci_ms"]
        assert low <= s["e2e_p95_ms"] <= high
        assert s["no_merge_pace_ms"] > 0


def test_arrival_accuracy(vllm_project):
    limits = load_params(vllm_project / "params.yaml").replay.vllm
    for rec in _replays(vllm_project).itertuples():
        requests = pd.read_parquet(vllm_project / rec.path / "requests.parquet")
        lag = requests["send_lag_ms"]
        assert (lag >= 0).all(), "never sent before its arrival time"
        # a late send is charged to the request: latency runs from the scheduled arrival, so TTFT includes the lag
        ok = requests["error"].fillna("") == ""
        assert (requests.loc[ok, "ttft_ms"] >= lag[ok] - 1e-6).all()
        # the client keeps time beside the server and its merge work (placement split): p99 within the bound
        summary = _summary(vllm_project, rec.path)
        assert summary["placement"]["mode"] == "split"
        assert lag.quantile(0.99) <= limits.max_send_lag_p99_ms
        assert (requests["cap_wait_ms"] == 0).all(), "the in-flight cap never bound"


def test_merge_work_and_merge_flags_only_inside_windows(vllm_project):
    plan = _plan(vllm_project)
    span, scale = plan["span_s"], plan["time_scale"]
    merged = 0
    for rec in _replays(vllm_project).itertuples():
        schedule = json.loads((vllm_project / rec.schedule).read_text())
        windows = pd.read_csv(vllm_project / rec.path / "windows.csv")
        requests = pd.read_parquet(vllm_project / rec.path / "requests.parquet")
        starts = [s for s in schedule["merge_starts_s"] if s < span]
        assert len(windows) == len(starts)
        for (start, end), w in zip([(s, min(s + schedule["window_s"], span)) for s in starts], windows.itertuples()):
            # trace seconds: never early; late by at most half a wall second of scheduling, at this time scale
            assert start - 0.1 <= w.start_s <= start + 0.5 * scale and w.end_s <= end + 0.5 * scale
        # recompute every flag: a request is merge-active when its life on the server (send to completion,
        # latency counted from the scheduled arrival) overlaps a window the merge work actually ran
        end_s = np.maximum(requests["arrival_s"] + requests["e2e_ms"].fillna(0.0) / 1000.0 * scale, requests["send_s"])
        expected = np.zeros(len(requests), dtype=bool)
        for w in windows.itertuples():
            expected |= (requests["send_s"] < w.end_s).to_numpy() & (end_s >= w.start_s).to_numpy()
        assert (requests["merge_active"].to_numpy() == expected).all()
        assert expected.any() == bool(starts)
        if rec.policy != "no_sync":  # every schedule with merges replays one in its span (the request floor)
            assert starts and requests["merge_active"].any()
            merged += 1
    assert merged == 3 * len(plan["controllers"])  # each controller, its draw and its cadence


def test_server_merge_work_and_client_each_ran_on_their_own_cpus(vllm_project):
    """The split as /proc showed it when each replay started (its summary records it): every process of the
    server's tree and every merge worker on server CPUs only, the client on the others."""
    workers = load_params(vllm_project / "params.yaml").replay.vllm.interference_workers
    rows = pd.concat([_replays(vllm_project), _replays(vllm_project, "repeats.csv")])
    for rec in rows.itertuples():
        placement = _summary(vllm_project, rec.path)["placement"]
        assert placement["mode"] == "split", "CI machines have at least two CPUs"
        server, client = parse_cpu_list(placement["server_cpus"]), parse_cpu_list(placement["client_cpus"])
        assert server and client and server.isdisjoint(client)
        enacted = placement["enacted"]
        assert len(enacted["server"]) >= 2, "the API server and its engine core"
        assert len(enacted["merge"]) == workers
        for cpus in [*enacted["server"].values(), *enacted["merge"].values()]:
            assert parse_cpu_list(cpus) and parse_cpu_list(cpus) <= server
        assert parse_cpu_list(enacted["client"]) == client
    server_cpus = _summary(vllm_project, rows.iloc[0]["path"])["placement"]["server_cpus"]
    log = server_log_path(vllm_project).read_text()
    assert f"VLLM_CPU_OMP_THREADS_BIND='{server_cpus}'" in log


def test_a_replay_beside_a_cpu_hog_is_retried_then_marked_machine_busy(tmp_path, tiny_raw, vllm_project):
    # an 8 s span below the tiny floor, declared: this test measures nothing but the busy verdict
    params = load_params(make_project(tmp_path, tiny_raw(), budget_s=120, span_s=8, busy_retry_pause_s=1,
                                      warmup_s=0, min_requests=5, min_merge_active=0,
                                      time_scale={"bursty": TIME_SCALE}))  # the borrowed profile's
    borrow_profile(vllm_project, tmp_path)
    # a foreign process, not a child of this one (the stage's own tree never counts): started through a shell
    # that exits at once, so it is adopted elsewhere
    started = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
    hog = psutil.Process(int(started.stdout.strip()))
    assert hog.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        replay_vllm(params, tmp_path)
    finally:
        hog.kill()
        hog.wait(10)
    rows = pd.concat([_replays(tmp_path), _replays(tmp_path, "repeats.csv")])
    assert len(rows) >= 4 and not rows["valid"].any()
    for path in rows["path"]:
        summary = _summary(tmp_path, path)
        assert summary["attempts"] == 2 and summary["foreign_cpu_cores"] > 0.5
        assert summary["invalid_reason"].startswith("machine busy: foreign processes used")
        assert any(name.startswith("python") for name, _, _ in summary["foreign_top"])


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


def test_a_server_that_dies_mid_campaign_fails_loudly_and_the_rerun_replays_only_the_unfinished_block(
        tmp_path, tiny_raw, vllm_project):
    raw = tiny_raw()
    raw["seeds"] = [0, 1]  # two campaign blocks: the server dies in the second
    params = load_params(make_project(tmp_path, raw, warmup_s=0, span_s=15, min_requests=5, min_merge_active=0,
                                      time_scale={"bursty": TIME_SCALE}))
    borrow_profile(vllm_project, tmp_path)
    out = tmp_path / "runs" / "replay-sets" / "vllm"
    cache = tmp_path / "runs" / "real-blocks" / "bursty"

    groups: list[int] = []

    def kill_once_a_block_is_finished() -> None:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if any(cache.glob("seed-*/block.json")):  # the first block is kept; the second has begun
                time.sleep(2.0)
                for proc in _server_processes(tmp_path):  # the API server only: its engine and worker live on
                    groups.append(os.getpgid(proc.pid))
                    proc.kill()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_once_a_block_is_finished, daemon=True)
    killer.start()
    with pytest.raises(ServerError, match=r"vLLM server exited") as err:
        replay_vllm(params, tmp_path)
    killer.join()
    assert "log" in str(err.value)
    assert not list(out.rglob("summary.json")), "no replay is written without its seed's pooled SLO"
    assert not (out / "index.csv").exists()
    assert groups and not any(_group_members(g) for g in groups), "no server process outlives the stage"
    finished = [p.parent for p in cache.glob("seed-*/block.json")]
    assert len(finished) == 1 and not list(cache.glob(".*")), "one block kept; the stopped one left nothing"
    kept_at = {p: p.stat().st_mtime_ns for p in finished[0].rglob("*")}

    replay_vllm(params, tmp_path)  # the campaign again: a new server, the finished block taken as it was
    blocks = {b["label"]: b for b in json.loads((out / "blocks.json").read_text())["blocks"]}
    kept_label = finished[0].name.rsplit("-", 1)[0]
    assert set(blocks) == {"seed-0", "seed-1"} and blocks[kept_label]["resumed"] is True
    (other,) = set(blocks) - {kept_label}
    assert blocks[other]["resumed"] is False, "the block stopped mid-way is replayed whole"
    assert {p: p.stat().st_mtime_ns for p in finished[0].rglob("*")} == kept_at, "the kept block is untouched"
    rows = pd.concat([_replays(tmp_path), _replays(tmp_path, "repeats.csv")])
    per_seed = rows.groupby("seed").size()
    assert per_seed.to_dict() == {0: blocks["seed-0"]["replays"], 1: blocks["seed-1"]["replays"]}
    seed = int(kept_label.split("-")[1])
    kept_results = sorted(finished[0].glob("*/results.parquet"))
    written = [pd.read_parquet(tmp_path / p / "requests.parquet") for p in rows[rows["seed"] == seed]["path"]]
    assert len(kept_results) == len(written)
    for table in written:  # the kept block's replays are its measurements, not new ones
        assert any(pd.read_parquet(k)["e2e_ms"].equals(table["e2e_ms"]) for k in kept_results)
