"""Merge interference: real worker processes (a gloo group in `merge` mode) that work only inside
the merge windows they are given."""

from __future__ import annotations

import time

import psutil
import pytest

from syncsafe import timebase
from syncsafe.serving.interference import MergeInterference


@pytest.mark.parametrize("mode", ["merge", "stress"])
def test_interference_runs_only_inside_merge_windows(tmp_path, mode):
    with MergeInterference(mode, workers=2, payload_numel=200_000, scratch_dir=tmp_path) as work:
        procs = [psutil.Process(p.pid) for p in work._procs]
        cpu = lambda: sum(p.cpu_times().user + p.cpu_times().system for p in procs)  # noqa: E731
        before = cpu()  # entering returned once every worker had started: from here they only wait
        time.sleep(1.0)
        idle_cpu = cpu() - before
        now = timebase.now()
        windows = [(now + 0.5, now + 2.0), (now + 2.6, now + 3.6)]
        work.submit(windows)
        worked = work.collect(timeout_s=30)
    assert idle_cpu < 0.1, "no work outside merge windows"
    assert len(worked) == 2 and work.received is not None
    for (start, end), (began, finished, iterations) in zip(windows, worked):
        assert began >= start - 0.01  # never early
        # late only by scheduling delay, counted from when the worker could start (window open and received)
        assert began - max(start, work.received) <= 0.5
        assert finished >= end  # works through to the window's end, stopping after the iteration that crosses it
        assert finished <= max(end, work.received) + 1.0  # ... and no longer than one iteration past it
        assert iterations > 0  # started before entering returned, so no window is missed
    assert worked[1][0] >= worked[0][1] - 0.01  # one window after the other
