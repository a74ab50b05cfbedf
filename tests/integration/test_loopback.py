"""On one machine nothing the pipeline starts listens beyond loopback.

While a small island group trains and while the merge-interference workers
are up, every listening TCP socket of those processes (torch.distributed's
store, gloo's pairs) is bound to 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from syncsafe import timebase
from syncsafe.serving.interference import MergeInterference



def _listening(pids: list[int]) -> list[tuple[int, str, int]]:
    found = []
    for pid in pids:
        try:
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((pid, conn.laddr.ip, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_interference_workers_listen_on_loopback_only():
    with MergeInterference("merge", workers=2, payload_numel=10_000) as work:
        pids = [p.pid for p in work._procs]
        now = timebase.now()
        work.submit([(now + 0.2, now + 0.6)])  # the group is joined once a window has run
        work.collect(timeout_s=120)
        sockets = _listening(pids)
        scratch = work.scratch
    assert sockets, "the merge group listens somewhere (store and gloo pairs)"
    assert {ip for _, ip, _ in sockets} == {"127.0.0.1"}, sockets
    assert not scratch.exists(), "the merge scratch directory is removed with the workers"


@pytest.mark.slow
def test_island_group_listens_on_loopback_only(tmp_path, tiny_raw):
    raw = tiny_raw()
    raw["regimes"]["bursty"]["duration_s"] = 240  # long enough to watch the group's sockets
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    run = lambda *a: subprocess.Popen([sys.executable, "-m", "syncsafe.cli", *a, "--params", str(params),  # noqa: E731
                                       "--root", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert run("traces").wait(timeout=120) == 0
    stage = run("train", "--policy", "fixed_h")
    seen: list[tuple[int, str, int]] = []
    islands: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while stage.poll() is None and time.monotonic() < deadline:
            children = [c.pid for c in psutil.Process(stage.pid).children(recursive=True)]
            islands.update(children)
            seen += _listening(children)
            time.sleep(0.2)
    finally:
        if stage.poll() is None:
            stage.kill()
    assert stage.wait(timeout=60) == 0, stage.stderr.read().decode()[-2000:]
    assert len(islands) >= 2 and seen, "the island group was seen listening"
    assert {ip for _, ip, _ in seen} == {"127.0.0.1"}, sorted(set(seen))
