"""Real DiLoCo training: island processes over gloo, policy-gated merges, faults and resume.

Slow: each test launches groups of 2 island processes on a 120 s trace
(inner steps of 5 trace seconds, control cycle 4 steps = 20 s, max_h 16, 8 s
merge windows: fixed_h with h=8 trains 5 cycles, 20 steps, merging at steps 8
and 16, trace times 40 s and 88 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
import yaml
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import load_params
from syncsafe.diloco.checkpoint import load_checkpoint
from syncsafe.diloco.launch import GRACE_S, IslandLost, island_processes, train_regime
from syncsafe.diloco.run import train_dir
from syncsafe.schedules.schedule import read_schedule
from syncsafe.traces.stage import build_traces

pytestmark = pytest.mark.slow


def make_project(root: Path, raw: dict, **train) -> Path:
    """The tiny profile's params (`raw`, from the `tiny_raw` fixture) with fixed_h and a never-opening gate."""
    raw["control"]["policies"] = ["fixed_h", "pressure_gate"]
    raw["control"]["pressure_gate"] = {"max_pressure": 0.0}  # never opens: merges only when forced at max_h
    raw["analysis"]["primary"]["policy"] = "fixed_h"  # the declared primary test must name a trained policy
    raw["train"].update({"collective_timeout_s": 20, **train})
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    build_traces(load_params(path), "bursty", root)
    return path


def train(params_path: Path, root: Path, **kw) -> list[Path]:
    return train_regime(load_params(params_path), params_path, "bursty", root, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_raw) -> Path:
    """Both policies trained to the end without faults."""
    root = tmp_path_factory.mktemp("reference")
    train(make_project(root, tiny_raw()), root)
    return root


def test_fixed_h_merges_every_h_steps_and_a_deferring_policy_less_often(reference):
    fixed = pd.read_csv(train_dir(reference, "bursty", "fixed_h", 0) / "merges.csv")
    assert fixed["step"].tolist() == [8, 16]
    gated = pd.read_csv(train_dir(reference, "bursty", "pressure_gate", 0) / "merges.csv")
    assert gated["step"].tolist() == [16]  # forced at max_h only
    assert len(gated) < len(fixed)


def test_run_outputs(reference):
    run = train_dir(reference, "bursty", "fixed_h", 0)
    schedule = read_schedule(run / "schedule.json")
    assert (schedule.source, schedule.policy, schedule.n_merges) == ("train", "fixed_h", 2)
    assert schedule.merge_starts_s == [40.0, 88.0]  # 8 steps x 5 s, then + 8 s merge window + 40 s
    metrics = json.loads((run / "metrics.json").read_text())
    n_bytes = 4 * sum(p.numel() for p in _exported(run).parameters())
    assert metrics["bytes_per_merge"] == pytest.approx(2 * (n_bytes + 4) * (2 - 1) / 2, abs=1)
    assert metrics["tokens_processed"] == 2 * 20 * 4 * 64 and metrics["inner_steps"] == 20
    assert metrics["n_merges"] == 2 and metrics["islands"] == 2
    losses = pd.read_csv(run / "losses.csv")
    assert set(losses["island"]) == {0, 1} and losses["step"].max() == 20
    first, last = losses[losses.step <= 4]["loss"].mean(), losses[losses.step > 16]["loss"].mean()
    assert last < first, "training lowers the loss"
    decisions = [json.loads(line) for line in (run / "decisions.jsonl").read_text().splitlines()]
    assert len(decisions) == 5 and all(len(d["reports"]) == 2 and d["reason"] for d in decisions)
    assert not (run / "checkpoints").exists()


def test_a_run_trained_alone_is_byte_identical_to_the_same_run_trained_after_another(reference, tmp_path, tiny_raw):
    # the reference trains fixed_h then pressure_gate in the same island processes (one launch per regime);
    # each run resets model, optimisers, data and RNG from its seed, so what ran before leaves no trace
    alone = tmp_path / "alone"
    train(make_project(alone, tiny_raw()), alone, policies=["pressure_gate"])
    ours, theirs = train_dir(alone, "bursty", "pressure_gate", 0), train_dir(reference, "bursty", "pressure_gate", 0)
    files = sorted(p.relative_to(theirs) for p in theirs.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file())
    assert [f for f in files if (ours / f).read_bytes() != (theirs / f).read_bytes()] == []


def _exported(run: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(run / "model")


def test_export_reloads_as_the_trained_global_model(reference):
    from transformers import AutoTokenizer

    from syncsafe.diloco.corpus import eval_batches
    from syncsafe.diloco.model import eval_loss
    from syncsafe.diloco.resources import prepare_tokenizer

    run = train_dir(reference, "bursty", "fixed_h", 0)
    params = load_params(reference / "params.yaml")
    corpus, tokenizer = prepare_tokenizer(params, reference)
    batches = eval_batches(corpus, tokenizer, params.train.seq_len, params.train.batch_size, max_batches=2)
    reloaded = _exported(run)
    assert eval_loss(reloaded, batches) == pytest.approx(json.loads((run / "metrics.json").read_text())["final_eval_loss"], rel=1e-5)
    assert AutoTokenizer.from_pretrained(run / "model")("def f(x):")["input_ids"] == tokenizer("def f(x):")["input_ids"]


def test_killed_island_fails_fast_then_resume_reproduces_the_losses(reference, tmp_path, monkeypatch, tiny_raw):
    params_path = make_project(tmp_path, tiny_raw())
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:10")  # island 1 SIGKILLs itself at step 10, after the merge at step 8
    mark = tmp_path / "fault-fired"
    monkeypatch.setenv("SYNCSAFE_FAULT_MARK", str(mark))  # the island writes the time of its death there
    with pytest.raises(IslandLost, match=r"island 1 killed by SIGKILL"):
        train(params_path, tmp_path, policies=["fixed_h"])
    failed_after = time.time() - float(mark.read_text())
    # from the island's death (not the stage start: torch imports are no part of it), within the collective
    # timeout (20 s) plus the launcher's grace (10 s) plus one poll of its loop
    assert failed_after < 20 + GRACE_S + 1, failed_after
    run = train_dir(tmp_path, "bursty", "fixed_h", 0)
    assert not (run / "metrics.json").exists()
    # the merge checkpoint is complete and every island holds the same weights
    merge = run / "checkpoints" / "merge-0001"
    a, b = load_checkpoint(merge / "island-0.pt"), load_checkpoint(merge / "island-1.pt")
    assert (a.inner_step, b.inner_step) == (8, 8)
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in a.model_state)
    assert torch.equal(a.outer_optimizer_state["global_flat"], b.outer_optimizer_state["global_flat"])
    monkeypatch.delenv("SYNCSAFE_FAULT")
    train(params_path, tmp_path, policies=["fixed_h"], resume=True)
    resumed = pd.read_csv(run / "losses.csv")
    original = pd.read_csv(train_dir(reference, "bursty", "fixed_h", 0) / "losses.csv")
    pd.testing.assert_frame_equal(resumed, original)
    assert json.loads((run / "metrics.json").read_text())["resumed"] is True


def test_streaming_syncs_each_fragment_in_turn_and_a_killed_island_resumes_byte_identical(reference, tmp_path,
                                                                                         monkeypatch, tiny_raw):
    from syncsafe.diloco.fragments import cut_fragments
    from syncsafe.diloco.outer import ParameterLayout, ring_all_reduce_bytes

    one = tmp_path / "one-fragment"  # streaming with one fragment and alpha 0 is the full merge, byte for byte
    train(make_project(one, tiny_raw(), sync={"mode": "streaming", "fragments": 1}), one, policies=["fixed_h"])
    ours, full = train_dir(one, "bursty", "fixed_h", 0), train_dir(reference, "bursty", "fixed_h", 0)
    files = sorted(p.relative_to(full) for p in full.rglob("*") if p.is_file())
    assert files and [f for f in files if (ours / f).read_bytes() != (full / f).read_bytes()] == []

    two = tmp_path / "two-fragments"
    params_path = make_project(two, tiny_raw(), sync={"mode": "streaming", "fragments": 2})
    train(params_path, two, policies=["fixed_h"])
    run = train_dir(two, "bursty", "fixed_h", 0)
    merges = pd.read_csv(run / "merges.csv")
    assert merges["step"].tolist() == [8, 16] and merges["fragment"].tolist() == [0, 1]  # each fragment once
    layout = ParameterLayout.of(_exported(run))
    fragments = cut_fragments(layout.names, layout.numels, 2)
    assert fragments[0].end < layout.total
    assert merges["bytes_communicated"].tolist() == [ring_all_reduce_bytes(4 * (f.numel + 1), 2) for f in fragments]
    # each sync event in the decision log: its window, the fragment it synced and that fragment's bytes
    events = [json.loads(line)["sync"] for line in (run / "decisions.jsonl").read_text().splitlines()]
    synced = [e for e in events if e is not None]
    assert [(e["fragment"], e["payload_bytes"], e["bytes_communicated"]) for e in synced] == \
        list(zip(merges["fragment"], merges["payload_bytes"], merges["bytes_communicated"]))
    assert [e["start_s"] for e in synced] == merges["t_s"].tolist()
    assert all(e["end_s"] - e["start_s"] == pytest.approx(tiny_raw()["merge"]["window_s"]) for e in synced)
    streamed, whole = pd.read_csv(run / "losses.csv"), pd.read_csv(full / "losses.csv")
    before = streamed["step"] <= 8  # identical up to the first merge; a half-model merge then differs
    pd.testing.assert_frame_equal(streamed[before], whole[before])
    assert not streamed[~before].equals(whole[~before])

    again = tmp_path / "killed"
    params_path = make_project(again, tiny_raw(), sync={"mode": "streaming", "fragments": 2})
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:10")  # after the merge of fragment 0 at step 8
    with pytest.raises(IslandLost, match=r"island 1 killed by SIGKILL"):
        train(params_path, again, policies=["fixed_h"])
    monkeypatch.delenv("SYNCSAFE_FAULT")
    train(params_path, again, policies=["fixed_h"], resume=True)
    resumed = train_dir(again, "bursty", "fixed_h", 0)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "losses.csv"), streamed)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "merges.csv"), merges)


def _killed_and_resumed(root: Path, raw: dict, monkeypatch, fault: str, **train_kw) -> Path:
    """A run whose island 1 SIGKILLs itself at `fault` (ISLAND:STEP), then resumed from its last checkpoint."""
    params_path = make_project(root, raw, **train_kw)
    monkeypatch.setenv("SYNCSAFE_FAULT", fault)
    with pytest.raises(IslandLost, match=r"island 1 killed by SIGKILL"):
        train(params_path, root, policies=["fixed_h"])
    monkeypatch.delenv("SYNCSAFE_FAULT")
    train(params_path, root, policies=["fixed_h"], resume=True)
    return train_dir(root, "bursty", "fixed_h", 0)


def _sync_events(run: Path) -> list[dict]:
    return [e for e in (json.loads(line)["sync"] for line in (run / "decisions.jsonl").read_text().splitlines())
            if e is not None]


def test_a_fragment_sync_delayed_by_tau_steps_is_applied_then_and_resumes_byte_identical(reference, tmp_path,
                                                                                        monkeypatch, tiny_raw):
    sync = {"mode": "streaming", "fragments": 2, "fragment_sync_delay": 2}
    delayed = tmp_path / "delayed"
    train(make_project(delayed, tiny_raw(), sync=sync), delayed, policies=["fixed_h"])
    run = train_dir(delayed, "bursty", "fixed_h", 0)
    merges = pd.read_csv(run / "merges.csv")
    # launched at the merges (steps 8 and 16), each fragment once, its outer step applied 2 inner steps later
    assert merges["step"].tolist() == [8, 16] and merges["fragment"].tolist() == [0, 1]
    assert merges["applied_step"].tolist() == [10, 18]
    assert merges["averaged_pseudo_gradient_norm"].gt(0).all()
    assert [(e["fragment"], e["applied_step"]) for e in _sync_events(run)] == [(0, 10), (1, 18)]
    # the islands train on unmerged parameters for the 2 steps the all-reduce is in flight
    ours, full = pd.read_csv(run / "losses.csv"), pd.read_csv(train_dir(reference, "bursty", "fixed_h", 0) / "losses.csv")
    before = ours["step"] <= 8
    pd.testing.assert_frame_equal(ours[before], full[before])
    assert not ours[~before].equals(full[~before])
    # killed at step 9, with fragment 0's all-reduce launched and not applied: the checkpoint keeps what was sent
    resumed = _killed_and_resumed(tmp_path / "killed", tiny_raw(), monkeypatch, "1:9", sync=sync)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "losses.csv"), ours)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "merges.csv"), merges)
    assert json.loads((resumed / "metrics.json").read_text())["final_eval_loss"] == \
        json.loads((run / "metrics.json").read_text())["final_eval_loss"]


def test_overlapped_merges_apply_one_round_later_and_with_no_delay_are_the_full_merge(reference, tmp_path,
                                                                                     monkeypatch, tiny_raw):
    full = train_dir(reference, "bursty", "fixed_h", 0)
    now = tmp_path / "no-delay"  # overlapped with overlap_rounds 0 is the full merge, byte for byte
    train(make_project(now, tiny_raw(), sync={"mode": "overlapped", "overlap_rounds": 0}), now, policies=["fixed_h"])
    ours = train_dir(now, "bursty", "fixed_h", 0)
    files = sorted(p.relative_to(full) for p in full.rglob("*") if p.is_file())
    assert files and [f for f in files if (ours / f).read_bytes() != (full / f).read_bytes()] == []

    sync = {"mode": "overlapped", "overlap_rounds": 1}
    later = tmp_path / "one-round"
    train(make_project(later, tiny_raw(), sync=sync), later, policies=["fixed_h"])
    run = train_dir(later, "bursty", "fixed_h", 0)
    merges = pd.read_csv(run / "merges.csv")
    # round 1's outer step is applied at the second merge (step 16), round 2's when training ends (step 20)
    assert merges["step"].tolist() == [8, 16] and merges["applied_step"].tolist() == [16, 20]
    assert merges["bytes_communicated"].tolist() == pd.read_csv(full / "merges.csv")["bytes_communicated"].tolist()
    assert [e["applied_step"] for e in _sync_events(run)] == [-1, -1]  # at the next merge, unknown at launch
    losses, whole = pd.read_csv(run / "losses.csv"), pd.read_csv(full / "losses.csv")
    before = losses["step"] <= 8
    pd.testing.assert_frame_equal(losses[before], whole[before])
    assert not losses[~before].equals(whole[~before])
    assert losses[losses.step > 16]["loss"].mean() < losses[losses.step <= 4]["loss"].mean()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_merges"] == 2
    # killed at step 10, round 1's all-reduce in flight across the checkpoint: resumed, byte-identical
    resumed = _killed_and_resumed(tmp_path / "killed", tiny_raw(), monkeypatch, "1:10", sync=sync)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "losses.csv"), losses)
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "merges.csv"), merges)
    assert json.loads((resumed / "metrics.json").read_text())["final_eval_loss"] == metrics["final_eval_loss"]


def test_killed_island_continues_on_the_survivors(tmp_path, monkeypatch, tiny_raw):
    params_path = make_project(tmp_path, tiny_raw(), on_island_failure="continue")
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:10")
    train(params_path, tmp_path, policies=["fixed_h"])
    metrics = json.loads((train_dir(tmp_path, "bursty", "fixed_h", 0) / "metrics.json").read_text())
    assert (metrics["islands"], metrics["island_ids"], metrics["islands_configured"]) == (1, [0], 2)
    assert metrics["n_merges"] == 2
    logs = sorted(p.name for p in (tmp_path / "logs" / "train" / "bursty").glob("*.log"))
    assert logs == ["fixed_h-seed-0-attempt-0-island-0.log", "fixed_h-seed-0-attempt-0-island-1.log",
                    "fixed_h-seed-0-attempt-1-island-0.log"]


def test_lost_island_exits_3(tmp_path, monkeypatch, tiny_raw):
    """An island killed mid-run: the train command exits 3 with one line naming it, no traceback."""
    raw = tiny_raw()
    raw["train"]["collective_timeout_s"] = 20
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    run = lambda *args: CliRunner().invoke(app, [str(a) for a in args])  # noqa: E731
    assert run("traces", "--params", path, "--root", tmp_path).exit_code == 0
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:10")
    result = run("train", "--policy", "fixed_h", "--params", path, "--root", tmp_path)
    assert result.exit_code == 3, result.output
    assert "island 1 killed by SIGKILL" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_train_stage_leaves_no_island_training(tmp_path, tiny_raw, sig):
    """SIGKILL (as an OOM kill) or SIGTERM of the stage: its islands die with it, none keeps writing runs/."""
    params_path = make_project(tmp_path, tiny_raw())
    env = {**os.environ, "SYNCSAFE_TRACKING": "off"}
    stage = subprocess.Popen([sys.executable, "-m", "syncsafe.cli", "train", "--params", str(params_path),
                              "--root", str(tmp_path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    islands: list[psutil.Process] = []
    log_dir = tmp_path / "logs" / "train" / "bursty"
    while time.monotonic() < deadline and stage.poll() is None:  # running islands that are past their start-up
        islands = island_processes(stage.pid)
        logs = list(log_dir.glob("*.log")) if log_dir.is_dir() else []
        if len(islands) == 2 and any("trained" in p.read_text(errors="replace") for p in logs):
            break
        time.sleep(0.2)
    assert len(islands) == 2 and stage.poll() is None, "the islands were training when the stage was killed"
    stage.send_signal(sig)
    stage.wait(timeout=60)
    gone, alive = psutil.wait_procs(islands, timeout=30)
    assert not alive, f"islands outlived their stage: {[p.pid for p in alive]}"
    if sig == signal.SIGTERM:
        assert stage.returncode == 128 + signal.SIGTERM
