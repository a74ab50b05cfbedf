"""The train stage as one node of a run across hosts: `torchrun` with c10d rendezvous, watched.

`syncsafe train --nnodes 2 --nproc-per-node N --rdzv-endpoint HOST_A:PORT
--local-addr THIS_HOST [--ifname eth0]` on every host runs
:func:`torchrun_command`: N island processes here, ranked among all nodes by
torchrun's rendezvous on `HOST_A:PORT`, gloo over the interface `--ifname`
(NCCL on GPU nodes). Every node must see the same project folder (a shared
file system): each island writes its own merge checkpoints there and the
island of rank 0 writes the run's outputs.

A lost island is found by the islands' heartbeats over the rendezvous store
(:mod:`syncsafe.diloco.heartbeat`), not by this node's process handles: a
peer on another host that dies or whose link is cut is named, with its host,
by the islands here within `train.heartbeat_timeout_s`; this node then exits
3 with that line. Bad input on an island exits 2 as on one machine. Resume
(`--resume` on every node) continues from the last merge checkpoint.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from syncsafe.config import Params
from syncsafe.diloco.heartbeat import ISLAND_LOST_MARK
from syncsafe.diloco.launch import GRACE_S, ISLAND_MODULE, IslandLost, island_processes, preflight, terminated_as_exit
from syncsafe.artifacts import layout
from syncsafe.errors import BAD_INPUT_MARK, BadInput
from syncsafe.procs import die_with_parent, host_label, log_tail

#: The port torchrun's c10d rendezvous store listens on when `--rdzv-endpoint` names none.
DEFAULT_RDZV_PORT = 29400


class NodeFailed(RuntimeError):
    """This node's islands failed for another reason than a lost peer (exit 1, naming the log)."""


@dataclass(frozen=True)
class NodeLaunch:
    """One node's part of a multi-node run."""

    nnodes: int
    nproc_per_node: int
    rdzv_endpoint: str
    local_addr: str | None = None
    ifname: str | None = None
    rdzv_id: str = "syncsafe-train"

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.nproc_per_node < 1:
            raise BadInput(f"--nnodes {self.nnodes} / --nproc-per-node {self.nproc_per_node}: expected >= 1")
        host, colon, port = self.rdzv_endpoint.rpartition(":")
        if not self.rdzv_endpoint or (colon and (not host or not port.isdigit())):
            raise BadInput(f"--rdzv-endpoint {self.rdzv_endpoint!r}: expected HOST or HOST:PORT")

    @property
    def endpoint(self) -> str:
        """HOST:PORT (the default port added when none is given)."""
        return self.rdzv_endpoint if ":" in self.rdzv_endpoint else f"{self.rdzv_endpoint}:{DEFAULT_RDZV_PORT}"

    @property
    def hosts_store(self) -> bool:
        """Whether this node's `local_addr` is the rendezvous endpoint's host."""
        return self.endpoint.rpartition(":")[0] == self.local_addr

    def check_islands(self, params: Params) -> None:
        if self.nnodes * self.nproc_per_node != params.train.islands:
            raise BadInput(f"--nnodes {self.nnodes} x --nproc-per-node {self.nproc_per_node} = "
                           f"{self.nnodes * self.nproc_per_node} islands, but train.islands is {params.train.islands}")


def torchrun_command(launch: NodeLaunch, params_path: Path, regime: str, root: Path, log_dir: Path,
                     policies: list[str] | None = None, seeds: list[int] | None = None,
                     resume: bool = False) -> list[str]:
    """The torchrun command line of this node (the README's multi-node command)."""
    cmd = [str(Path(sys.executable).with_name("torchrun")),
           "--nnodes", str(launch.nnodes), "--nproc-per-node", str(launch.nproc_per_node),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", launch.endpoint, "--rdzv-id", launch.rdzv_id,
           "--max-restarts", "0", "--log-dir", str(log_dir), "--redirects", "3"]
    if launch.local_addr:  # and whether this node hosts the rendezvous store (torch guesses from the
        # machine's name, which test hosts on one machine share)
        cmd += ["--local-addr", launch.local_addr, "--rdzv-conf", f"is_host={int(launch.hosts_store)}"]
    cmd += ["-m", ISLAND_MODULE, "--params", str(params_path), "--regime", regime, "--root", str(root)]
    for policy in policies or []:
        cmd += ["--policy", policy]
    for seed in seeds or []:
        cmd += ["--seed", str(seed)]
    if resume:
        cmd.append("--resume")
    return cmd


def node_env(launch: NodeLaunch, base: dict[str, str]) -> dict[str, str]:
    """The environment torchrun and its islands get: gloo on `--ifname`, one intra-op thread per island."""
    env = {**base, "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1")}
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GLOO_SOCKET_IFNAME"):
        env.pop(key, None)  # a one-machine launch's values must not leak into torchrun's
    if launch.ifname:
        env["GLOO_SOCKET_IFNAME"] = launch.ifname
    return env


def marked_line(log_dir: Path, mark: str) -> str | None:
    """The first island log line under `log_dir` that carries `mark`, the text after it."""
    for log in sorted(log_dir.rglob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if mark in line:
                return line.split(mark, 1)[1].strip()
    return None


_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)", re.M)
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


def root_cause(agent_log: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the first island torchrun saw fail (its "Root Cause" summary), if it printed one."""
    text = agent_log.read_text(errors="replace") if agent_log.is_file() else ""
    summary = text[text.rfind("Root Cause"):] if "Root Cause" in text else ""
    rank, code = _ROOT_RANK.search(summary), _ROOT_EXIT.search(summary)
    return (int(rank.group(1)), int(code.group(1))) if rank and code else None


def _wait(proc: subprocess.Popen, log_dir: Path, islands: int) -> int:
    """torchrun's exit code. Once an island here has written that a peer or the store is lost (and
    exited 3), torchrun gets `GRACE_S` to finish, none once it has no island left: its agent can hang on a
    store it cannot reach any more."""
    deadline: float | None = None
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            running = len(island_processes(proc.pid))
            # the islands' logs are read only while fewer than `islands` run (one is gone, or not up yet)
            if deadline is None and running < islands and marked_line(log_dir, ISLAND_LOST_MARK) is not None:
                deadline = time.monotonic() + GRACE_S
            if deadline is not None and not running:  # every island here is gone: stop waiting
                deadline = time.monotonic()
            if deadline is not None and time.monotonic() > deadline:
                proc.terminate()  # its islands are gone: nothing of ours is left for its agent to clean up
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def train_node(params: Params, params_path: Path, regime: str, root: Path, launch: NodeLaunch,
               policies: list[str] | None = None, seeds: list[int] | None = None,
               resume: bool = False) -> list[Path]:
    """This node's islands of every (policy, seed) run of `regime`, to the end or to a clear failure."""
    launch.check_islands(params)
    preflight(params, root)  # the same checks, and the same tokenizer cache, as on one machine
    host = host_label()
    log_dir = Path(root) / layout.TRAIN_LOGS / regime / f"node-{host}"
    attempt = len(list(log_dir.glob("attempt-*"))) if log_dir.is_dir() else 0
    log_dir = log_dir / f"attempt-{attempt}"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(launch, params_path, regime, root, log_dir, policies, seeds, resume)
    agent_log = log_dir / "torchrun.log"
    with open(agent_log, "w") as fh, terminated_as_exit():
        proc = subprocess.Popen(cmd, env=node_env(launch, dict(os.environ)), stdout=fh, stderr=subprocess.STDOUT,
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))
        returncode = _wait(proc, log_dir, launch.nproc_per_node)
    if returncode != 0:
        lost = marked_line(log_dir, ISLAND_LOST_MARK)
        if lost:
            raise IslandLost(f"train {regime} on host {host}: {lost}")
        bad = marked_line(log_dir, BAD_INPUT_MARK)
        if bad:
            raise BadInput(f"train {regime}: {bad}")
        cause = root_cause(agent_log)
        if cause is not None and cause[1] < 0:  # an island here was killed (torchrun ranks islands 0..n-1)
            raise IslandLost(f"train {regime} on host {host}: island {cause[0]} killed by "
                             f"{signal.Signals(-cause[1]).name}; log {agent_log}")
        raise NodeFailed(f"train {regime} on host {host}: torchrun exited with code {returncode}; "
                         f"log {agent_log}:\n{log_tail(agent_log, 15)}")
    runs = [(p, s) for p in (policies or params.control.policies) for s in (seeds or params.seeds)]
    return [layout.train_run_dir(root, regime, p, s) for p, s in runs]
