"""One node of a training run across hosts: the torchrun command line, its environment, its failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncsafe.diloco.islands import Fault
from syncsafe.diloco.nodes import NodeLaunch, marked_line, node_env, root_cause, torchrun_command
from syncsafe.errors import BadInput


def test_the_torchrun_command_is_the_readme_s_multi_node_command(tmp_path):
    launch = NodeLaunch(2, 1, "10.77.0.1:29400", local_addr="10.77.0.2", ifname="eth0")
    cmd = torchrun_command(launch, Path("params.yaml"), "bursty", Path("."), tmp_path, ["fixed_h"], [0, 1], True)
    assert Path(cmd[0]).name == "torchrun"
    flags = " ".join(cmd[1:])
    assert ("--nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 10.77.0.1:29400 "
            "--rdzv-id syncsafe-train --max-restarts 0") in flags
    # this node is not the endpoint's host: torch must not guess it from the machine's name
    assert "--local-addr 10.77.0.2 --rdzv-conf is_host=0" in flags
    assert flags.endswith("-m syncsafe.diloco.worker --params params.yaml --regime bursty --root . "
                          "--policy fixed_h --seed 0 --seed 1 --resume")
    host_a = NodeLaunch(2, 1, "10.77.0.1:29400", local_addr="10.77.0.1")
    assert "is_host=1" in " ".join(torchrun_command(host_a, Path("p"), "r", Path("."), tmp_path))


def test_an_endpoint_without_a_port_gets_torchrun_s_default():
    assert NodeLaunch(2, 2, "hostA").endpoint == "hostA:29400"


@pytest.mark.parametrize("args, field", [((0, 1, "h:1"), "--nnodes"), ((2, 0, "h:1"), "--nproc-per-node"),
                                         ((2, 1, ""), "--rdzv-endpoint"), ((2, 1, "h:port"), "--rdzv-endpoint")])
def test_bad_node_launches_name_the_option(args, field):
    with pytest.raises(BadInput, match=field):
        NodeLaunch(*args)


def test_nodes_times_islands_per_node_must_be_the_configured_islands(tiny_params):
    from syncsafe.config import load_params

    params = load_params(tiny_params)
    NodeLaunch(2, 1, "h:1").check_islands(params)  # the tiny profile: 2 islands
    with pytest.raises(BadInput, match=r"--nnodes 2 x --nproc-per-node 2 = 4 islands, but train.islands is 2"):
        NodeLaunch(2, 2, "h:1").check_islands(params)


def test_a_one_machine_launch_s_rendezvous_does_not_leak_into_torchrun():
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/bin"}
    env = node_env(NodeLaunch(2, 1, "h:1", ifname="eth0"), base)
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0"}


def test_torchrun_s_root_cause_names_the_killed_island(tmp_path):
    log = tmp_path / "torchrun.log"
    log.write_text("noise\nRoot Cause (first observed failure):\n[0]:\n  time      : 2026-12-01_23:03:37\n"
                   "  host      : localhost\n  rank      : 1 (local_rank: 0)\n"
                   "  exitcode  : -9 (pid: 3645)  (SIGKILL)\n")
    assert root_cause(log) == (1, -9)
    log.write_text("no summary")
    assert root_cause(log) is None


def test_a_marked_line_is_found_in_any_island_log(tmp_path):
    (tmp_path / "x" / "0").mkdir(parents=True)
    (tmp_path / "x" / "0" / "stderr.log").write_text("warn\nisland lost: island 1 on host b (10.77.0.2): gone\n")
    assert marked_line(tmp_path, "island lost:") == "island 1 on host b (10.77.0.2): gone"
    assert marked_line(tmp_path, "bad input:") is None


def test_fault_drills_name_an_island_or_any_and_kill_or_hold(monkeypatch):
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:10")
    assert Fault.from_env() == Fault(1, 10, "kill")
    monkeypatch.setenv("SYNCSAFE_FAULT", "any:4:hold")
    fault = Fault.from_env()
    assert fault == Fault(None, 4, "hold") and fault.fires_on(0, 4) and fault.fires_on(7, 4) and not fault.fires_on(0, 5)
    monkeypatch.setenv("SYNCSAFE_FAULT", "1:4:explode")
    with pytest.raises(ValueError, match="ISLAND:STEP"):
        Fault.from_env()
