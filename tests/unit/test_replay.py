"""Replay stage: simulator backend over every schedule, index contract (merge interference: tests/integration)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS

CONTRACT = ["regime", "policy", "seed", "draw", "backend", "slo_violation_rate", "p95_ms", "p99_ms", "n_requests",
            "n_failed", "path"]


@pytest.fixture
def replayed(tmp_path, params_file, cli):
    root = tmp_path / "project"
    common = ["--params", str(params_file), "--root", str(root)]
    cli("traces", "--regime", "bursty", *common)
    cli("schedules", "build", "--regime", "bursty", *common)
    cli("replay", "run", "--backend", "simulator", "--regime", "bursty", *common)
    cli("replay", "index", "--root", str(root))
    return root


def test_simulator_replays_every_schedule_with_the_contract(replayed, params):
    index = pd.read_csv(replayed / "runs" / "replay" / "index.csv")
    schedules = pd.read_csv(replayed / "runs" / "schedule-sets" / "bursty" / "index.csv")
    assert list(index.columns[: len(CONTRACT)]) == CONTRACT
    controllers = schedules[schedules["source"].isin(["train", "harness"])]
    # every schedule, plus one SLO oracle per controller schedule
    assert len(index) == len(schedules) + len(controllers) and set(index["backend"]) == {"simulator"}
    oracles = index[index["source"] == "slo_oracle"]
    assert sorted(zip(oracles["seed"], oracles["matched_to"])) == sorted(zip(controllers["seed"], controllers["policy"]))
    assert index["slo_violation_rate"].between(0, 1).all() and (index["n_failed"] == 0).all()
    for rec in index.sample(10, random_state=1).itertuples():
        requests = pd.read_parquet(replayed / rec.path / "requests.parquet")
        assert list(requests.columns[: len(REQUEST_RESULT_COLUMNS)]) == list(REQUEST_RESULT_COLUMNS)
        assert (requests["ttft_ms"] <= requests["e2e_ms"]).all()
        summary = json.loads((replayed / rec.path / "summary.json").read_text())
        assert summary["n_requests"] == len(requests) == rec.n_requests


def test_slo_comes_from_the_same_seeds_no_sync(replayed, params):
    index = pd.read_csv(replayed / "runs" / "replay" / "index.csv")
    for seed in params.seeds:
        rows = index[index["seed"] == seed]
        slos = {json.dumps(json.loads((replayed / p / "summary.json").read_text())["slo"]) for p in rows["path"]}
        assert len(slos) == 1, "every schedule of a seed is judged by one SLO"
        no_sync = rows[rows["policy"] == "no_sync"].iloc[0]
        requests = pd.read_parquet(replayed / no_sync["path"] / "requests.parquet")
        slo = json.loads(slos.pop())
        assert slo["e2e_ms"] == pytest.approx(requests["e2e_ms"].quantile(0.95) * params.replay.slo.multiplier)
        # merges only add latency: no schedule beats its seed's no-sync replay
        assert (rows["slo_violation_rate"] >= no_sync["slo_violation_rate"] - 1e-12).all()


def test_replay_view(replayed, cli):
    out = cli("replay", "--root", str(replayed))
    assert "simulator · regime bursty" in out and "no_sync" in out and "matched_random[fixed_h]" in out


def test_vllm_python_keeps_its_virtual_environment(tmp_path, monkeypatch):
    from syncsafe.serving.vllm_server import ServerError, resolve_python

    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to("/usr/bin/env")  # a venv's python is a symlink to the base interpreter
    monkeypatch.chdir(tmp_path)
    assert resolve_python("venv/bin/python") == str(venv_python)  # the link itself, not its target
    assert resolve_python("sh").endswith("/sh")
    with pytest.raises(ServerError, match="not found on PATH"):
        resolve_python("no-such-python-here")
