"""`syncsafe run`: the pipeline of dvc.yaml, its independent stage items side by side where the cores allow.

`dvc repro` runs one stage at a time. This runner reads the same declarations and works in items: one
stage of one regime (`train@bursty`) or a stage that runs once (`analyze`).

- What runs: the items `dvc status` names and every item downstream of them (`force`: all of them).
- When: an item starts once every item it reads from is done and the cores it keeps busy
  (`StageSpec.cores`: train's islands x torch threads; one otherwise) fit under `jobs` beside the
  running ones; an item that needs more than `jobs` runs alone.
- Alone: stages that time a real server (`StageSpec.exclusive`: replay-vllm, live) start on an idle
  machine and nothing starts beside them (their busy-machine check would refuse the replays otherwise).
- Bookkeeping: each finished item is recorded in dvc.lock (`dvc commit`), so `dvc repro` afterwards
  finds nothing to do, and its wall time in logs/run/timings.json, the next run's estimates.
- Tracking: every item's stage run sits under one MLflow pipeline run, this runner's
  (`SYNCSAFE_PIPELINE_RUN_ID`, unless set already).
- Output: each item's output goes to logs/run/<item>.log; the terminal gets a line per started and
  finished item and a status line (`Progress`) with each running item's own progress bar and the time
  left.
- A failed item: nothing new starts, the running items finish (and are recorded), the run fails with
  the failed item's code and the tail of its log. SIGTERM or Ctrl-C stops every item.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from syncsafe.artifacts import layout as L
from syncsafe.config import Params
from syncsafe.errors import BadInput
from syncsafe.io import write_json
from syncsafe.pipeline.declarations import REGIME, STAGES, StageSpec, overlaps, topological_order
from syncsafe.pipeline.progress import Progress
from syncsafe.pipeline.runner import param, switched_on
from syncsafe.procs import die_with_parent, log_tail, sigterm_raises, stop_processes
from syncsafe.tracking.settings import PIPELINE_RUN_ID_ENV, pipeline_run_id

RUN_LOGS = L.LOGS / "run"
TIMINGS = RUN_LOGS / "timings.json"
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Item:
    """One DVC stage entry: a per-regime stage for one regime, or a stage that runs once."""

    spec: StageSpec
    regime: str | None
    after: frozenset[str] = field(default=frozenset(), compare=False)  # names of the items it reads from
    cores: int = 1
    alone: bool = False  # an exclusive stage that does its work (not switched off)
    declared_s: float | None = field(default=None, compare=False)  # the wall its stage declares (its budget)

    @property
    def name(self) -> str:
        return f"{self.spec.name}@{self.regime}" if self.regime else self.spec.name

    def _filled(self, paths: Sequence[str]) -> list[str]:
        return [p.replace(REGIME, self.regime) if self.regime else p for p in paths]

    @property
    def inputs(self) -> list[str]:
        return self._filled(self.spec.inputs)

    @property
    def outputs(self) -> list[str]:
        return self._filled((*self.spec.outputs, *self.spec.metrics))


def plan(params: Params, stages: Sequence[StageSpec] = STAGES) -> list[Item]:
    """Every item of the pipeline in a topological order, each with the items it reads from."""
    by_name = {s.name: s for s in stages}
    bare = [Item(by_name[n], r) for n in topological_order(stages)
            for r in (list(params.regimes) if by_name[n].per_regime else [None])]
    items = []
    for item in bare:
        after = frozenset(o.name for o in bare if o.spec is not item.spec
                          and any(overlaps(i, out) for i in item.inputs for out in o.outputs))
        cores = math.prod(int(param(params, k)) for k in item.spec.cores)
        alone = item.spec.exclusive and switched_on(item.spec, params)
        declared = None
        if item.spec.declared_wall and switched_on(item.spec, params):
            module, _, function = item.spec.declared_wall.partition(":")
            declared = float(getattr(importlib.import_module(module), function)(params))
        items.append(Item(item.spec, item.regime, after, max(1, cores), alone, declared))
    return items


def downstream(items: Sequence[Item], names: set[str]) -> set[str]:
    """`names` and every item that reads, directly or not, from one of them."""
    out = set(names)
    for item in items:  # topological order: an item's upstream items come before it
        if item.after & out:
            out.add(item.name)
    return out


def _dvc(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True)


def stale(items: Sequence[Item], root: Path) -> set[str]:
    """The items `dvc status` finds changed (or never run), and everything downstream of them."""
    done = _dvc("status", "--json", root=root)
    if done.returncode != 0:
        raise BadInput(f"dvc status failed in {root}: {done.stderr.strip() or done.stdout.strip()}")
    try:
        changed = set(json.loads(done.stdout or "{}"))
    except json.JSONDecodeError as err:
        raise BadInput(f"dvc status --json printed something that is not JSON: {done.stdout[:200]!r}") from err
    names = {i.name for i in items}
    unknown = sorted(n for n in changed if "@" in n and n.split("@")[0] in {i.spec.name for i in items}
                     and n not in names)
    if unknown:
        raise BadInput(f"dvc.yaml has stages params.yaml does not ({', '.join(unknown)}): run `syncsafe dvc-yaml`?")
    return downstream(items, changed & names)


def to_run(items: Sequence[Item], root: Path, force: bool = False, redo: Sequence[str] = ()) -> set[str]:
    """The items a run starts: all with `force`; else the stale ones (`stale`) and the stages named in `redo`
    (a stage name, every item of it; or one item, `train@bursty`) with everything downstream of them."""
    if force:
        return {i.name for i in items}
    known = {i.name for i in items} | {i.spec.name for i in items}
    unknown = [name for name in redo if name not in known]
    if unknown:
        raise BadInput(f"--redo {', '.join(unknown)}: no such stage or item (stages: "
                       f"{', '.join(dict.fromkeys(i.spec.name for i in items))})")
    named = {i.name for i in items if i.name in redo or i.spec.name in redo}
    return stale(items, root) | downstream(items, named)


def startable(pending: Sequence[Item], running: Sequence[Item], done: set[str], jobs: int) -> list[Item]:
    """The pending items to start now, in order: upstream done, cores free, exclusive ones alone."""
    used = sum(i.cores for i in running)
    started: list[Item] = []
    if any(i.alone for i in running):
        return started
    for item in pending:
        if not item.after <= done:
            continue
        if item.alone:
            if not running and not started:
                return [item]
            break  # nothing overtakes a ready exclusive item: it waits for the machine to empty
        if used + item.cores <= jobs or (not running and not started):
            started.append(item)
            used += item.cores
    return started


def _read_timings(root: Path) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads((root / TIMINGS).read_text()).items()}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


@dataclass
class Running:
    item: Item
    proc: subprocess.Popen
    log: Path
    started: float


@dataclass
class Outcome:
    """What one `run` did: items run with their wall and dvc-commit seconds, and the first failure."""

    walls: dict[str, float] = field(default_factory=dict)
    commits: dict[str, float] = field(default_factory=dict)
    failed: tuple[str, int, str] | None = None  # item, exit code, log tail
    skipped: list[str] = field(default_factory=list)  # up to date

    @property
    def exit_code(self) -> int:
        return self.failed[1] if self.failed else 0


@contextlib.contextmanager
def _stops_children(running: dict[str, Running]) -> Iterator[None]:
    """SIGTERM raises `Terminated`; leaving the block any other way than normally stops the running items."""
    try:
        with sigterm_raises():
            yield
    except BaseException:
        stop_processes((r.proc for r in running.values()), STOP_GRACE_S)
        raise


def check_jobs(jobs: int | None) -> None:
    """BadInput unless `jobs` is None (every core) or a whole number of cores, at least 1."""
    if jobs is not None and jobs < 1:
        raise BadInput(f"--jobs {jobs}: expected a number of cores, at least 1")


def run(params: Params, root: Path = Path("."), jobs: int | None = None, force: bool = False,
        echo: Callable[[str], None] = print, poll_s: float = 0.5, redo: Sequence[str] = ()) -> Outcome:
    """Run the stale items of the pipeline and those `redo` names (all with `force`: `to_run`), `jobs` cores at
    a time (default: all)."""
    check_jobs(jobs)
    jobs = jobs if jobs is not None else os.cpu_count() or 1
    root = Path(root)
    items = plan(params)
    todo = to_run(items, root, force, redo)
    outcome = Outcome(skipped=[i.name for i in items if i.name not in todo])
    pending = [i for i in items if i.name in todo]
    done = {i.name for i in items if i.name not in todo}
    (root / RUN_LOGS).mkdir(parents=True, exist_ok=True)
    timings = _read_timings(root)
    progress = Progress(jobs, timings)
    running: dict[str, Running] = {}
    env = {**os.environ, PIPELINE_RUN_ID_ENV: pipeline_run_id(), "PYTHONUNBUFFERED": "1"}
    echo(f"{len(pending)} of {len(items)} stage items to run, {jobs} cores"
         + (f"; up to date: {', '.join(outcome.skipped)}" if outcome.skipped else ""))
    with _stops_children(running), progress.shown():
        while pending or running:
            if outcome.failed is None:
                for item in startable(pending, [r.item for r in running.values()], done, jobs):
                    pending.remove(item)
                    running[item.name] = _start(item, root, env)
                    progress.say(f"start {item.name}" + (" (alone)" if item.alone else ""))
            elif not running:
                break
            time.sleep(poll_s)
            for name, r in list(running.items()):
                code = r.proc.poll()
                if code is None:
                    continue
                del running[name]
                wall = time.monotonic() - r.started
                if code != 0:
                    outcome.failed = outcome.failed or (name, code, log_tail(r.log, 20))
                    progress.say(f"FAILED {name} (exit {code}) after {wall:.0f} s; log {r.log}")
                    continue
                t0 = time.monotonic()
                committed = _dvc("commit", "--force", "--quiet", name, root=root)
                if committed.returncode != 0:
                    raise RuntimeError(f"dvc commit {name} failed: {committed.stderr.strip()}")
                outcome.walls[name], outcome.commits[name] = wall, time.monotonic() - t0
                done.add(name)
                timings[name] = round(wall, 1)
                write_json(root / TIMINGS, timings)
                progress.finished(r.item, wall)
                progress.say(f"done {name} in {wall:.0f} s (dvc commit {outcome.commits[name]:.1f} s)")
            progress.update([(r.item, r.log, time.monotonic() - r.started) for r in running.values()], pending)
    return outcome


def _start(item: Item, root: Path, env: dict[str, str]) -> Running:
    log = root / RUN_LOGS / f"{item.name}.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, *item.spec.argv(item.regime or "")], cwd=root, stdout=fh,
                                stderr=subprocess.STDOUT, env=env,
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))
    return Running(item, proc, log, time.monotonic())
