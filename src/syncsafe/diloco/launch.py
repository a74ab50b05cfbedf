"""The train stage's launcher: island processes on one machine, watched to the end.

Starts one `python -m syncsafe.diloco.worker` process per island with the
environment torchrun would give it, logs each to `logs/train/<regime>/`
(outside the stage's outputs: logs carry wall-clock noise), and watches them. When an island dies the others
fail within the collective timeout; the launcher then either fails the stage
naming the lost island and the tail of its log (`on_island_failure: fail`) or
resumes the interrupted run from its last merge checkpoint on the surviving
islands and then carries on with the remaining runs on the full group
(`continue`). Nothing waits forever: stragglers are killed after the
collective timeout plus a grace period.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from tqdm import tqdm

from syncsafe.config import Params
from syncsafe.diloco.hub import check_hub_inputs
from syncsafe.artifacts import layout
from syncsafe.artifacts.train_runs import is_complete
from syncsafe.errors import BAD_INPUT_MARK, EXIT_BAD_INPUT, EXIT_ISLAND_LOST, BadInput
from syncsafe.procs import LOOPBACK_ENV, STORE_FD_ENV, descendants, die_with_parent, listening_socket, log_tail

GRACE_S = 10.0
#: The module every island process runs (here, under torchrun, or any launcher).
ISLAND_MODULE = "syncsafe.diloco.worker"


def is_island_process(proc: psutil.Process) -> bool:
    """Whether `proc` is an island (not a torchrun agent whose command line names the module too)."""
    try:
        cmdline = proc.cmdline()
    except psutil.NoSuchProcess:
        return False
    return ISLAND_MODULE in cmdline and not any(Path(arg).name == "torchrun" for arg in cmdline)


def island_processes(pid: int) -> list[psutil.Process]:
    """The island processes below process `pid` (a stage, a torchrun agent)."""
    return [child for child in descendants(pid) if is_island_process(child)]


class IslandLost(RuntimeError):
    """An island process died and the configuration says fail (the CLI exits 3)."""

    exit_code = EXIT_ISLAND_LOST


@dataclass
class Exit:
    island: int
    returncode: int
    log: Path

    def describe(self) -> str:
        if self.returncode < 0:
            return f"killed by {signal.Signals(-self.returncode).name}"
        return f"exited with code {self.returncode}"


def _launch_label(runs: list[tuple[str, int]]) -> str:
    """Log-name prefix: launches of single runs (e.g. one Airflow task each) must not share logs."""
    return f"{runs[0][0]}-seed-{runs[0][1]}-" if len(runs) == 1 else ""


def _launch(params_path: Path, regime: str, root: Path, island_ids: list[int], runs: list[tuple[str, int]],
            resume: bool, attempt: int, fault: str | None, timeout_s: float,
            progress: tqdm) -> Exit | None:
    """Run one island group to completion; return the first island that failed, if any."""
    log_dir = Path(root) / layout.TRAIN_LOGS / regime
    log_dir.mkdir(parents=True, exist_ok=True)
    listener = listening_socket()  # rank 0's store serves on it: the port is ours from now on
    port = listener.getsockname()[1]
    cmd = [sys.executable, "-m", ISLAND_MODULE, "--params", str(params_path), "--regime", regime,
           "--root", str(root), "--island-ids", ",".join(map(str, island_ids))]
    for policy in dict.fromkeys(p for p, _ in runs):
        cmd += ["--policy", policy]
    for seed in dict.fromkeys(s for _, s in runs):
        cmd += ["--seed", str(seed)]
    if resume:
        cmd.append("--resume")
    procs: list[tuple[int, subprocess.Popen, Path]] = []
    for rank, island in enumerate(island_ids):
        env = {**os.environ, **LOOPBACK_ENV, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(len(island_ids)), "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        env.pop("SYNCSAFE_FAULT", None)
        if fault:
            env["SYNCSAFE_FAULT"] = fault
        handed = (listener.fileno(),) if rank == 0 else ()
        if handed:
            env[STORE_FD_ENV] = str(listener.fileno())
        log = log_dir / f"{_launch_label(runs)}attempt-{attempt}-island-{island}.log"
        with open(log, "w") as fh:
            procs.append((island, subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, pass_fds=handed,
                                                   preexec_fn=functools.partial(die_with_parent, os.getpid())), log))
    listener.close()  # rank 0 holds its own copy
    exits: dict[int, tuple[int, Exit]] = {}  # island -> (poll round it was seen dead, exit)
    deadline: float | None = None
    rounds = 0
    try:
        while len(exits) < len(procs):
            time.sleep(0.2)
            rounds += 1
            for island, p, log in procs:
                if island not in exits and p.poll() is not None:
                    exits[island] = (rounds, Exit(island, p.returncode, log))
                    if p.returncode == EXIT_BAD_INPUT:  # no collective will recover from bad input: stop now
                        deadline = time.monotonic()
                    elif p.returncode != 0 and deadline is None:
                        deadline = time.monotonic() + timeout_s + GRACE_S
            done = sum(is_complete(layout.train_run_dir(root, regime, p, s)) for p, s in runs)
            if done > progress.n:
                progress.update(done - progress.n)
            if deadline is not None and time.monotonic() > deadline:
                break
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return _first_lost(exits)


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit inside the block, so the launcher's cleanup stops every island first."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _first_lost(exits: dict[int, tuple[int, Exit]]) -> Exit | None:
    """The island that failed first; in one poll round, one killed by a signal before one
    that exited with an error (its peers' collectives fail because it is gone)."""
    failed = [(seen, e.returncode >= 0, e.island, e) for seen, e in exits.values() if e.returncode != 0]
    return min(failed)[3] if failed else None


def bad_input_line(log: Path) -> str:
    """What an island that exited on bad input said (`worker.BAD_INPUT_MARK`), else its log's last line."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    marked = [line.split(BAD_INPUT_MARK, 1)[1].strip() for line in lines if BAD_INPUT_MARK in line]
    return marked[0] if marked else (lines[-1] if lines else f"bad input (see {log})")


def preflight(params: Params, root: Path) -> None:
    """Resolve what every island will load, in this process, before any island starts: bad input (a hub id
    not in the cache, a dataset directory without documents, a missing package) is one line and exit 2.

    The builtin corpus and tokenizer are the islands' own to build (the first under the cache's lock, the
    others reuse it): this process imports neither torch nor transformers, so the islands start at once."""
    if params.train.source == "hub":
        check_hub_inputs(params)


def train_regime(params: Params, params_path: Path, regime: str, root: Path = Path("."), resume: bool = False,
                 policies: list[str] | None = None, seeds: list[int] | None = None) -> list[Path]:
    """Train every (policy, seed) run of `regime`; returns the run directories.

    The islands die with this process (the kernel signals them when it dies, `die_with_parent`), and a
    SIGTERM to it stops them before it exits."""
    preflight(params, root)
    runs = [(p, s) for p in (policies or params.control.policies) for s in (seeds or params.seeds)]
    islands = list(range(params.train.islands))
    fault = os.environ.get("SYNCSAFE_FAULT") or None
    timeout = params.train.collective_timeout_s
    attempt = 0
    with tqdm(total=len(runs), desc=f"train {regime}", unit="run", leave=False) as progress, terminated_as_exit():
        while True:
            pending = [r for r in runs if not is_complete(layout.train_run_dir(root, regime, *r))] if (resume or attempt) else runs
            if not pending:
                break
            lost = _launch(params_path, regime, root, islands, pending, resume or attempt > 0, attempt, fault,
                           timeout, progress)
            attempt += 1
            fault = None  # a fault drill fires once
            if lost is None:
                break
            if lost.returncode == EXIT_BAD_INPUT:
                raise BadInput(f"train {regime}: {bad_input_line(lost.log)}")
            message = (f"train {regime}: island {lost.island} {lost.describe()}; "
                       f"log {lost.log}:\n{log_tail(lost.log, 15)}")
            survivors = [i for i in islands if i != lost.island]
            if params.train.on_island_failure == "fail" or not survivors:
                raise IslandLost(message)
            interrupted = next(r for r in pending if not is_complete(layout.train_run_dir(root, regime, *r)))
            print(f"{message}\ncontinuing {regime}/{interrupted[0]}/seed-{interrupted[1]} on islands {survivors}",
                  file=sys.stderr)
            again = _launch(params_path, regime, root, survivors, [interrupted], True, attempt, None, timeout,
                            progress)
            attempt += 1
            if again is not None:
                raise IslandLost(f"train {regime}: island {again.island} {again.describe()} while continuing on "
                                 f"survivors; log {again.log}:\n{log_tail(again.log, 15)}")
    return [layout.train_run_dir(root, regime, p, s) for p, s in runs]
