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


def _sigterm_when(event: threading.Event) -> threading.Thread:
    def send() -> None:
        if event.wait(60):
            os.kill(os.getpid(), signal.SIGTERM)
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_a_streamed_command_does_not_outlive_a_sigterm(tmp_path):
    started = threading.Event()
    seen: list[str] = []

    def echo(line: str) -> None:
        seen.append(line)
        if line.startswith("child "):
            started.set()

    _sigterm_when(started)
    code = "import os, time; print('child', os.getpid(), flush=True); time.sleep(120)"
    with pytest.raises(Terminated), sigterm_raises():
        _stream([sys.executable, "-c", code], tmp_path, dict(os.environ), echo)
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
