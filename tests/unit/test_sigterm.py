"""SIGTERM stops a command the way Ctrl-C does: its children stop with it, one line, exit 143."""

from __future__ import annotations

import os
import signal
import sys
import threading

import psutil
import pytest

from syncsafe.errors import EXIT_TERMINATED, Terminated
from syncsafe.pipeline.failures import fails_cleanly
from syncsafe.procs import sigterm_raises
from syncsafe.studies.run import _stream


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
