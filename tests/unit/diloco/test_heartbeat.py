"""Island heartbeats over a real TCPStore on loopback: a silent peer or a lost store is named in time."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from syncsafe.diloco.heartbeat import Heartbeat, Identity
from syncsafe.procs import LOOPBACK

TIMEOUT_S = 1.0


class Verdicts:
    """Collects what `on_lost` is told (in a test it must return; the thread then ends)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.event = threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append((time.monotonic(), line))
        self.event.set()


@pytest.fixture
def server():
    store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    yield store


def wait_until(condition, deadline_s: float = 10 * TIMEOUT_S) -> bool:
    """Poll `condition` until it holds or the deadline (derived from the heartbeat's timeout) passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(TIMEOUT_S / 20)
    return bool(condition())


def has_beaten(server, island: int, times: int = 2) -> bool:
    """`island` has beaten `times` times in the store (so its peers have a beat of it to watch)."""
    return server.add(f"syncsafe/heartbeat/beat/{island}", 0) >= times


def beat(server, island: int, peers: list[int], verdicts: Verdicts, host: str = "h") -> Heartbeat:
    port = server.port

    def connect(timeout: timedelta) -> dist.TCPStore:
        return dist.TCPStore(LOOPBACK, port, is_master=False, timeout=timeout)

    return Heartbeat(connect, Identity(island, host, f"10.0.0.{island + 1}"), peers, TIMEOUT_S,
                     store_address=f"{LOOPBACK}:{port}", on_lost=verdicts).start()


def test_a_peer_that_stops_beating_is_named_with_its_host_within_the_timeout(server):
    seen_by_0, seen_by_1 = Verdicts(), Verdicts()
    zero, one = beat(server, 0, [0, 1], seen_by_0, "a"), beat(server, 1, [0, 1], seen_by_1, "b")
    assert wait_until(lambda: has_beaten(server, 0) and has_beaten(server, 1))
    assert not seen_by_0.event.wait(3 * TIMEOUT_S) and not seen_by_1.lines  # both alive: nobody is named
    stopped = time.monotonic()
    one.stop(done=False)  # as a failed island: no "done"
    assert seen_by_0.event.wait(10 * TIMEOUT_S), "named within a deadline derived from the timeout"
    at, line = seen_by_0.lines[0]
    assert line.startswith("island 1 on host b (10.0.0.2): no heartbeat for")
    assert "seen by island 0 on host a" in line
    # never before its timeout: the last beat came at most one beat interval before the stop
    assert at - stopped >= TIMEOUT_S - TIMEOUT_S / 5
    silent = float(line.split("no heartbeat for ")[1].split(" s")[0])
    assert silent >= TIMEOUT_S
    zero.stop()


def test_a_peer_that_says_it_is_done_is_not_lost(server):
    seen_by_0 = Verdicts()
    zero, one = beat(server, 0, [0, 1], seen_by_0), beat(server, 1, [0, 1], Verdicts())
    assert wait_until(lambda: has_beaten(server, 1))
    one.stop(done=True)
    assert not seen_by_0.event.wait(3 * TIMEOUT_S)
    zero.stop()


def test_a_peer_that_never_beats_is_lost(server):
    seen = Verdicts()
    zero = beat(server, 0, [0, 1], seen)
    assert seen.event.wait(10 * TIMEOUT_S)
    assert seen.lines[0][1].startswith("island 1 (never reported its host): no heartbeat")
    zero.stop()


def test_losing_the_store_is_named_with_its_address():
    server = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    seen = Verdicts()
    one = beat(server, 1, [0, 1], seen)
    zero = beat(server, 0, [0, 1], Verdicts())
    assert wait_until(lambda: has_beaten(server, 0) and has_beaten(server, 1))
    port = server.port
    del server  # the store's server goes away with its last reference
    assert seen.event.wait(10 * TIMEOUT_S)
    assert f"island 1 on host h (10.0.0.2) lost the rendezvous store at {LOOPBACK}:{port}" in seen.lines[0][1]
    one.stop(done=False)
    zero.stop(done=False)
