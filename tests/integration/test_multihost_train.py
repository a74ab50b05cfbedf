"""Training across two test hosts for real: torchrun with c10d rendezvous, gloo over the fleet's veth links.

A fleet of two hosts (network namespaces a and b, 10.77.0.1 and .2); each
runs `syncsafe train --nnodes 2 --nproc-per-node 1 --rdzv-endpoint
10.77.0.1:PORT` for one island of the tiny profile (fixed_h, one seed, 120 s
trace, merges at steps 8 and 16). Checks: the run equals the same seed's run
on one machine byte for byte; an island killed on host b, or host b's link
cut, is named with its host by the stage on host a within
`collective_timeout_s`, both stages exit 3, and resuming on both hosts once
the link is back reproduces the uninterrupted run's losses.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from fleet_support import fleet_up

from syncsafe.config import load_params
from syncsafe.diloco.launch import train_regime
from syncsafe.diloco.run import train_dir
from syncsafe.fleet import links, training
from syncsafe.fleet.hosts import Fleet
from syncsafe.traces.stage import build_traces

pytestmark = pytest.mark.slow
COLLECTIVE_TIMEOUT_S = 20
HEARTBEAT_TIMEOUT_S = 8
_ports = itertools.count(29411)  # a fresh rendezvous port per launch


@pytest.fixture(scope="module")
def fleet():
    with fleet_up(Fleet(name="sstr")) as up:
        yield up


def make_project(root: Path, raw: dict) -> Path:
    raw["control"]["policies"] = ["fixed_h"]
    raw["analysis"]["primary"]["policy"] = "fixed_h"
    raw["train"].update({"collective_timeout_s": COLLECTIVE_TIMEOUT_S, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S})
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    build_traces(load_params(path), "bursty", root)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_raw) -> Path:
    """The run trained on one machine (the stage's own launcher, loopback)."""
    root = tmp_path_factory.mktemp("one-host")
    path = make_project(root, tiny_raw())
    train_regime(load_params(path), path, "bursty", root)
    return train_dir(root, "bursty", "fixed_h", 0)


def start_nodes(fleet: Fleet, root: Path, *args: str, fault_on_b: str | None = None,
                mark: Path | None = None) -> dict[str, subprocess.Popen]:
    """Both hosts' train stages, started together; host b's islands get the fault drill."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCSAFE_FAULT")}
    env["SYNCSAFE_TRACKING"] = "off"
    drill = {"b": {"SYNCSAFE_FAULT": fault_on_b, "SYNCSAFE_FAULT_MARK": str(mark)}} if fault_on_b else {}
    return training.start_nodes(fleet, root / "params.yaml", root, next(_ports), env, drill, extra=args)


def finish(procs: dict[str, subprocess.Popen], timeout: float = 300) -> dict[str, tuple[int, str, float]]:
    """host -> (exit code, stderr, monotonic time it was seen to exit)."""
    deadline, done = time.monotonic() + timeout, {}
    while len(done) < len(procs) and time.monotonic() < deadline:
        for host, p in procs.items():
            if host not in done and p.poll() is not None:
                done[host] = (p.returncode, p.stderr.read(), time.monotonic())
        time.sleep(0.1)
    for host, p in procs.items():
        if host not in done:
            p.kill()
            done[host] = (p.wait(), p.stderr.read(), time.monotonic())
    return done


def wait_for(mark: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not mark.exists():
        assert time.monotonic() < deadline, f"the drill never reached its step ({mark} not written)"
        time.sleep(0.1)


def placement(root: Path) -> dict[int, str]:
    """island -> host, from the lines the islands wrote when they joined."""
    found = {}
    for log in (root / "logs" / "train" / "bursty").rglob("stdout.log"):
        for line in log.read_text().splitlines():
            if line.startswith("island ") and ": rank " in line:
                words = line.split()
                found[int(words[1])] = words[4]
    return found


def test_two_hosts_train_the_same_run_as_one_machine(fleet, reference, tmp_path, tiny_raw):
    make_project(tmp_path, tiny_raw())
    result = finish(start_nodes(fleet, tmp_path))
    assert {h: r[0] for h, r in result.items()} == {"a": 0, "b": 0}, result
    assert sorted(placement(tmp_path).values()) == ["a", "b"]  # one island on each host
    run = train_dir(tmp_path, "bursty", "fixed_h", 0)
    files = sorted(p.relative_to(reference) for p in reference.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(run) for p in run.rglob("*") if p.is_file())
    for rel in files:  # merges, decisions, losses, eval loss, exported model: the same bytes
        assert (run / rel).read_bytes() == (reference / rel).read_bytes(), rel


def _exited(proc: psutil.Process) -> bool:
    """Gone, or a zombie: exited and not yet reaped (its parent, the stage, is gone and PID 1 may not reap)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _island_on_b(fleet: Fleet) -> psutil.Process:
    islands = training.islands_on(fleet, "b")
    assert len(islands) == 1, islands  # one island process per host
    return islands[0]


def _lost_then_resumed(fleet: Fleet, root: Path, reference: Path, fault, on_b: str, heal=lambda: None) -> None:
    """Drill: host b's island holds at inner step 10 (after the merge at step 8); `fault()` strikes; both
    stages must exit 3 (host a's naming the island on host b within the collective timeout), then a resume
    on both hosts (after `heal()`) reproduces the reference's losses."""
    mark = root / "fault-ready"
    procs = start_nodes(fleet, root, fault_on_b="any:10:hold", mark=mark)
    wait_for(mark)
    island_b = _island_on_b(fleet)
    lost = next(i for i, h in placement(root).items() if h == "b")
    struck = time.monotonic()
    fault()
    result = finish(procs)
    code_a, err_a, exited_a = result["a"]
    assert code_a == 3, err_a
    assert f"island {lost} on host b (10.77.0.2)" in err_a
    assert exited_a - struck < COLLECTIVE_TIMEOUT_S, exited_a - struck
    code_b, err_b, _ = result["b"]
    assert code_b == 3 and on_b in err_b, err_b
    assert _exited(island_b)
    run = train_dir(root, "bursty", "fixed_h", 0)
    assert not (run / "metrics.json").exists()
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "1"
    heal()
    resumed = finish(start_nodes(fleet, root, "--resume"))
    assert {h: r[0] for h, r in resumed.items()} == {"a": 0, "b": 0}, resumed
    assert (run / "losses.csv").read_bytes() == (reference / "losses.csv").read_bytes()
    assert json.loads((run / "metrics.json").read_text())["resumed"] is True


def test_an_island_killed_on_the_other_host_is_named_and_the_run_resumes(fleet, reference, tmp_path, tiny_raw):
    make_project(tmp_path, tiny_raw())
    _lost_then_resumed(fleet, tmp_path, reference, lambda: _island_on_b(fleet).kill(), on_b="killed by SIGKILL")


def test_a_cut_link_is_named_on_both_hosts_and_the_run_resumes_once_it_is_back(fleet, reference, tmp_path, tiny_raw):
    make_project(tmp_path, tiny_raw())
    try:
        _lost_then_resumed(fleet, tmp_path, reference, lambda: links.cut(fleet, "b"),
                           on_b="lost the rendezvous store at 10.77.0.1", heal=lambda: links.restore(fleet, "b"))
    finally:
        links.restore(fleet, "b")
