"""The foreign-CPU monitor charges a process only the CPU it used during the watch."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from syncsafe.serving import busy
from syncsafe.serving.busy import ForeignCpuMonitor


class FakeProcess:
    def __init__(self, pid: int, created_epoch: float, cpu_s: float, name: str = "idle") -> None:
        self.pid, self.created, self.cpu_s, self.name = pid, created_epoch, cpu_s, name

    @property
    def info(self) -> dict:
        return {"cpu_times": SimpleNamespace(user=self.cpu_s, system=0.0), "create_time": self.created,
                "name": self.name, "ppid": 1}


def test_a_pre_existing_idle_process_first_seen_mid_watch_is_charged_nothing(monkeypatch):
    """It existed before the watch (created an hour ago, 1.5 s of CPU then) but the first sample missed it:
    it used no CPU during the watch, so the machine stays quiet. A process created during the watch is
    charged all of its CPU."""
    table: list[FakeProcess] = []
    monkeypatch.setattr(busy.psutil, "process_iter", lambda attrs=None: list(table))
    monkeypatch.setattr(busy, "descendants", lambda pid: [])
    monitor = ForeignCpuMonitor(interval_s=3600.0, pid=-1)
    with monitor:
        table.append(FakeProcess(101, time.time() - 3600.0, 1.5, "old-idle"))  # first seen mid-watch
        monitor._sample()
        table.append(FakeProcess(102, time.time() + 0.001, 0.4, "new-busy"))  # created during the watch
        monitor._sample()
    result = monitor.result()
    assert result.cpu_s == pytest.approx(0.4)
    assert [(name, pid) for name, pid, _ in result.top] == [("new-busy", 102)]
