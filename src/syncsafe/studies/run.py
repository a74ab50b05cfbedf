"""`syncsafe study run NAME`: one DVC experiment per point, queued, then run one at a time.

Each point becomes `dvc exp run --queue --name <study>.<point> -S ++key=value ...`; the queue then runs with
one worker (`dvc exp run --run-all --jobs 1`: parallel queue workers are unreliable in current DVC). Every
experiment runs in a temporary copy of the project, so only what git or DVC tracks goes with it: a study
refuses to start while source files it would need are untracked. A stage whose deps and params a point does
not change is restored from DVC's run cache, not rerun; the run records, per point, which stages ran and
which were reused (`reports/studies/<name>/points/<point>.json`; `run.json` adds the queue's wall time; the
queue's own logs in `logs/studies/<name>/`). `run_point` runs one point in the foreground
(`dvc exp run --temp`), for orchestrators that map one task per point.

Stage runs of the points go to the MLflow experiment `study-<name>` of this project's store, one pipeline
run per point (its id is the DVC experiment's name, see tracking.settings.pipeline_run_id).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from syncsafe.artifacts import layout
from syncsafe.artifacts.layout import study_dir, study_log_dir
from syncsafe.errors import BadInput
from syncsafe.io import write_json, write_text
from syncsafe.procs import output_lines, sigterm_raises, stop_process_groups, stop_processes
from syncsafe.studies.replaced import RefError, experiment_ref_names, replacing
from syncsafe.studies.spec import Point, Study
from syncsafe.timebase import now
from syncsafe.tracking.settings import PIPELINE_RUN_ID_ENV, tracking_uri

#: What a point's queue log says about a stage: restored from the run cache, unchanged, or run.
_REUSED = re.compile(r"Stage '([^']+)' (?:is cached - skipping run|didn't change, skipping)")
_RAN = re.compile(r"Running stage '([^']+)'")
#: Paths an experiment's temporary copy must find in git.
_CODE = ("src", "stages", "studies", "dvc.yaml", "params.yaml")
#: Seconds an interrupted command gets to stop before it is killed.
STOP_GRACE_S = 30.0
#: Where DVC's queue keeps a pid file per process it manages (its workers, each running experiment).
_QUEUE_PIDS = (".dvc", "tmp", "exps")


class StudyFailed(RuntimeError):
    """A point's experiment did not finish."""


@dataclass
class PointRun:
    point: str
    experiment: str
    overrides: dict
    ok: bool
    ran: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)


@dataclass
class StudyRun:
    study: str
    full: bool
    wall_s: float
    points: list[PointRun]


def experiment_name(study: str) -> str:
    """The MLflow experiment a study's runs go to."""
    return f"study-{study}"


def dvc(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True, env=env)


def _checked(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        raise StudyFailed(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def experiment_refs(root: Path) -> dict[str, str]:
    """Every DVC experiment of the repository: name -> commit (from the `refs/exps` git refs)."""
    try:
        return {name: sha for name, (_, sha) in experiment_ref_names(root).items()}
    except RefError as err:
        raise StudyFailed(str(err)) from None


def untracked_code(root: Path) -> list[str]:
    """Files a point's experiment needs that git does not track (they would be missing from its copy)."""
    done = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", *_CODE], cwd=root,
                          capture_output=True, text=True)
    return _checked(done, "git ls-files").split()


def study_env(root: Path, study: str) -> dict[str, str]:
    """The queue's environment: this interpreter's tools first on PATH, this project's tracking store."""
    env = {k: v for k, v in os.environ.items() if k != PIPELINE_RUN_ID_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MLFLOW_TRACKING_URI"] = tracking_uri(root)
    env["SYNCSAFE_EXPERIMENT"] = experiment_name(study)
    return env


def queue_commands(study: Study) -> list[list[str]]:
    """The `dvc exp run --queue` command line of every point (what `--dry-run` prints)."""
    return [["dvc", "exp", "run", "--queue", "--name", study.experiment(p), *study.param_args(p)]
            for p in study.distinct()]


def study_overrides(study: Study) -> list[dict]:
    """Each point's overrides as the experiment gets them: the study's shared ones, then the point's."""
    return [study.overrides(p) for p in study.points]


def _refuse_untracked(root: Path) -> None:
    """A study needs every source file in git: an experiment's copy holds only what git or DVC tracks."""
    missing = untracked_code(root)
    if missing:
        raise BadInput(f"untracked files an experiment copy would lack: {', '.join(missing[:8])}"
                       f"{' ...' if len(missing) > 8 else ''}; `git add` them first")


def _record(root: Path, study: Study, point: Point, text: str, ok: bool) -> PointRun:
    """What the point's log says it ran and reused; written to reports/studies/<name>/points/<point>.json."""
    write_text(study_log_dir(root, study.name) / f"{point.slug}.log", text)
    record = PointRun(point=point.name, experiment=study.experiment(point),
                      overrides=study.overrides(point), ok=ok,
                      ran=sorted(set(_RAN.findall(text))), reused=sorted(set(_REUSED.findall(text))))
    write_json(study_dir(root, study.name) / layout.STUDY_POINTS_DIR / f"{point.slug}.json", asdict(record))
    return record


def run_point(root: Path, study: Study, point: Point, *, echo: Callable[[str], None] = print) -> PointRun:
    """One point in the foreground (`dvc exp run --temp`): what the study DAG's mapped tasks run."""
    env = study_env(root, study.name)
    name = study.experiment(point)
    _refuse_untracked(root)
    command = [sys.executable, "-m", "dvc", "exp", "run", "--temp", "--name", name, *study.param_args(point)]
    with replacing(root, [name], echo):  # an earlier run of the point is kept unless this one finishes
        with sigterm_raises():  # an orchestrator stops a task with SIGTERM: the experiment stops with it
            text = _stream(command, root, env, echo)
        record = _record(root, study, point, text, ok=name in experiment_refs(root))
        if not record.ok:
            raise StudyFailed(f"study {study.name}: point {point.name} did not finish; "
                              f"see {study_log_dir(root, study.name)}/")
    return record


def run_study(root: Path, study: Study, *, echo: Callable[[str], None] = print) -> StudyRun:
    """Queue every point of `study`, run the queue one experiment at a time, and record each point."""
    env = study_env(root, study.name)
    names = [study.experiment(p) for p in study.distinct()]
    _refuse_untracked(root)
    dvc(root, "queue", "remove", *names, env=env)  # queued entries of an interrupted run, if any
    try:  # the earlier experiments are removed only once every point is queued (the points were validated)
        with replacing(root, names, echo):
            for command in queue_commands(study):
                _checked(dvc(root, *command[1:], env=env), " ".join(command[:6]))
    except BaseException:
        dvc(root, "queue", "remove", *names, env=env)  # none of this run's points stays queued
        raise
    echo(f"queued {len(names)} point(s) of study {study.name}; running them one at a time")
    started = now()
    try:
        with sigterm_raises():
            _stream([sys.executable, "-m", "dvc", "exp", "run", "--run-all", "--jobs", "1"], root, env, echo,
                    log=study_log_dir(root, study.name) / "queue.log")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: DVC's queue worker is its own process and would go on
        echo(f"study {study.name} interrupted: stopping DVC's queue worker and the point it runs")
        dvc(root, "queue", "stop", "--kill", env=env)
        # `queue stop --kill` kills only the tasks celery reports active, and its shutdown waits for a
        # running task: under load it can miss the one just started. What is left is stopped here.
        stop_process_groups(queue_processes(root), STOP_GRACE_S)
        dvc(root, "queue", "remove", *names, env=env)
        raise
    wall = now() - started
    done = experiment_refs(root)
    logs = {name: dvc(root, "queue", "logs", name, env=env).stdout for name in names}
    # a point that shares another's experiment ran nothing of its own: its log is empty
    runs = [_record(root, study, point, logs[study.experiment(point)] if study.same_as[point.slug] == point.slug
                    else "", ok=study.experiment(point) in done) for point in study.points]
    record = StudyRun(study=study.name, full=study.full, wall_s=round(wall, 1), points=runs)
    write_json(study_dir(root, study.name) / layout.RUN_FILE, asdict(record))
    failed = [r.point for r in runs if not r.ok]
    if failed:
        raise StudyFailed(f"study {study.name}: point(s) {', '.join(failed)} did not finish; "
                          f"see {study_log_dir(root, study.name)}/")
    return record


def queue_processes(root: Path) -> list[int]:
    """The live processes DVC's queue manages for the project at `root`: the pid in each of its pid files
    whose process still works in the project (a stale file's pid, reused by another process, is not)."""
    pids = []
    # DVC writes the worker's at exps/celery/<node>.pid and each experiment's at exps/run/<name>/<name>.pid.
    # glob.glob skips a folder that vanishes while it lists (DVC removes an experiment's as it ends); a walk
    # down the experiments' temporary workspaces would not.
    exps = root.joinpath(*_QUEUE_PIDS)
    for pidfile in (*glob.glob(str(exps / "celery" / "*.pid")), *glob.glob(str(exps / "run" / "*" / "*.pid"))):
        try:
            pid = int(Path(pidfile).read_text().strip())
            if Path(psutil.Process(pid).cwd()).is_relative_to(root.resolve()):
                pids.append(pid)
        except (ValueError, OSError, psutil.Error):
            continue
    return pids


def _stream(command: list[str], root: Path, env: dict[str, str], echo: Callable[[str], None],
            log: Path | None = None) -> str:
    """Run `command`, echoing its output line by line (and into `log`); returns the output."""
    lines = []
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in output_lines(proc):
            lines.append(line)
            echo(line.rstrip("\n"))
        proc.wait()
    finally:  # interrupted: the command does not outlive this one
        stop_processes([proc], STOP_GRACE_S)
    text = "".join(lines)
    if log is not None:
        write_text(log, text)
    return text
