"""SIGTERM stops a command the way Ctrl-C does: its children stop with it, one line, exit 143."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from syncsafe.errors import EXIT_TERMINATED, Terminated
from syncsafe.pipeline.failures import fails_cleanly
from syncsafe.procs import sigterm_raises, stop_process_groups
from syncsafe.studies.run import _stream, queue_processes


def _sigterm_when(event: threading.Event, to_this_thread: bool = False) -> threading.Thread:
    """Once `event` is set: SIGTERM to the process, or to this helper thread only (as when the kernel hands an
    orchestrator's SIGTERM to one of a library's threads)."""
    def send() -> None:
        if event.wait(60):
            if to_this_thread:
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            else:
                os.kill(os.getpid(), signal.SIGTERM)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("to_this_thread", [False, True], ids=["process", "another-thread"])
def test_a_streamed_command_does_not_outlive_a_sigterm(tmp_path, to_this_thread):
    """The reader used to block in the pipe read until the child printed again (here: when it exits, 60 s later) when the
    signal was caught by another thread."""
    started = threading.Event()
    seen: list[str] = []

    def echo(line: str) -> None:
        seen.append(line)
        if line.startswith("child "):
            started.set()

    _sigterm_when(started, to_this_thread)
    done = tmp_path / "slept"
    code = f"import os, time; print('child', os.getpid(), flush=True); time.sleep(60); open({str(done)!r}, 'w')"
    with pytest.raises(Terminated), sigterm_raises():
        _stream([sys.executable, "-c", code], tmp_path, dict(os.environ), echo)
    assert not done.exists(), "the child ran to its end before the SIGTERM was handled"
    child = int(seen[0].split()[1])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_terminated_command_exits_143_with_one_line(capsys):
    @fails_cleanly
    def command() -> None:
        raise Terminated()

    with pytest.raises(SystemExit) as done:
        command()
    assert done.value.code == EXIT_TERMINATED == 143
    assert capsys.readouterr().err.strip().splitlines() == ["error: terminated (SIGTERM)"]


def test_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_raises():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def _daemon_group(tmp_path) -> tuple[subprocess.Popen, int]:
    """A daemon in its own process group, like DVC's queue worker: a shell whose child ignores SIGTERM."""
    ready = tmp_path / "ready"
    shell = subprocess.Popen(["sh", "-c", f"sh -c 'trap \"\" TERM; touch {ready}; sleep 300' & wait"],
                             cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the daemon's child did not start"
    return shell, shell.pid


def test_a_queue_process_group_is_stopped_whole_even_a_member_that_ignores_sigterm(tmp_path):
    """`dvc queue stop --kill` can miss a task just started; the study then stops the groups of the processes
    DVC's pid files name, and only those whose process works in the project."""
    shell, pid = _daemon_group(tmp_path)
    members = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    pids = tmp_path / ".dvc" / "tmp" / "exps" / "run" / "rev"
    pids.mkdir(parents=True)
    (pids / "rev.pid").write_text(str(pid))
    (pids / "stale.pid").write_text(str(os.getpid()))  # a pid that works elsewhere: never stopped
    (pids / "garbled.pid").write_text("not a pid")
    # an experiment's temporary workspace (which DVC may remove mid-listing) is not searched for pid files
    nested = tmp_path / ".dvc" / "tmp" / "exps" / "tmpws" / ".dvc" / "tmp" / "exps" / "run" / "rev"
    nested.mkdir(parents=True)
    (nested / "rev.pid").write_text(str(pid))
    try:
        assert queue_processes(tmp_path) == [pid]
        stopped = stop_process_groups(queue_processes(tmp_path), grace_s=1.0)
        assert sorted(stopped) == sorted(m.pid for m in members) and len(members) >= 2
        assert shell.wait(10) is not None
        assert not [m for m in members if m.is_running() and m.status() != psutil.STATUS_ZOMBIE]
    finally:
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()


def test_a_pid_in_this_process_group_stops_that_process_tree_not_this_process(tmp_path):
    child = subprocess.Popen(["sh", "-c", "sleep 300 & wait"])
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(child.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = psutil.Process(child.pid).children()[0]
        stopped = stop_process_groups([child.pid], grace_s=5.0)
        assert sorted(stopped) == sorted([child.pid, grandchild.pid])
        assert child.wait(10) is not None
        with contextlib.suppress(psutil.NoSuchProcess):  # gone, or a zombie its new parent has not reaped
            assert grandchild.status() == psutil.STATUS_ZOMBIE
    finally:
        child.kill()
