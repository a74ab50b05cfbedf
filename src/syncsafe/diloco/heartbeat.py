"""Island liveness over the rendezvous store: every island beats, every island watches the others.

A process handle only tells a launcher about islands on its own machine. So
each island process runs a thread that, every `timeout_s / 5`, adds one to
its counter in the store the process group was made with (a client
connection of its own) and reads every peer's. A peer whose counter has not
moved for `timeout_s`, and that has not said it is done, is lost; so is the
store itself when it cannot be reached for `timeout_s` (the link to its host
is cut, or its host is gone). Either way the watching island writes one line
(`ISLAND_LOST_MARK`, naming the lost island, its host and address, or the
store's address) and exits 3 at once, well before a collective would time
out. Its launcher (the stage on one machine, or the node's torchrun) repeats
that line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from syncsafe.errors import EXIT_ISLAND_LOST

#: The line an island writes before exiting 3 because a peer (or the store) is gone.
ISLAND_LOST_MARK = "island lost:"
_PREFIX = "syncsafe/heartbeat"


@dataclass(frozen=True)
class Identity:
    """Where an island runs: the host's name and the address it reaches the store from."""

    island: int
    host: str
    address: str

    def describe(self) -> str:
        return f"island {self.island} on host {self.host} ({self.address})"


def _exit_lost(line: str) -> None:
    print(f"{ISLAND_LOST_MARK} {line}", file=sys.stderr, flush=True)
    os._exit(EXIT_ISLAND_LOST)


class Heartbeat:
    """Beat for `me` and watch `peers` (island ids) over a store made by `connect(timeout)`.

    `on_lost` gets one line and must not return (default: write it and exit 3)."""

    def __init__(self, connect: Callable[[timedelta], Any], me: Identity, peers: list[int], timeout_s: float,
                 store_address: str, on_lost: Callable[[str], None] = _exit_lost) -> None:
        self._connect, self.me, self.peers, self.timeout_s = connect, me, [p for p in peers if p != me.island], timeout_s
        self.store_address, self.on_lost = store_address, on_lost
        self.interval_s = timeout_s / 5
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._beat, name=f"heartbeat-island-{me.island}", daemon=True),
                         threading.Thread(target=self._watch, name=f"watch-island-{me.island}", daemon=True)]
        self._store: Any = None
        now = time.monotonic()
        self._store_ok = now
        self._store_error = ""
        self._seen = {p: (-1, now) for p in self.peers}  # island -> (last count, when it last moved)
        self._hosts: dict[int, Identity] = {}

    def start(self) -> Heartbeat:
        self._store = self._connect(timedelta(seconds=self.interval_s * 2))
        self._store.set(f"{_PREFIX}/host/{self.me.island}", json.dumps(self.me.__dict__))
        self._store_ok = time.monotonic()
        self._seen = {p: (-1, self._store_ok) for p in self.peers}
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, done: bool = True) -> None:
        """Stop beating; with `done`, first say so (peers stop watching this island). An island that
        fails stops without `done`: its peers name it lost once its beats stop."""
        self._stop.set()
        for thread in self._threads:  # a beat stuck on an unreachable store gives up within its connect timeout
            thread.join(timeout=self.timeout_s)
        if not done:
            return
        try:
            self._store.add(f"{_PREFIX}/done/{self.me.island}", 1)
        except Exception:  # noqa: BLE001 - the store may be gone at shutdown: nobody watches any more
            pass

    def wait_for_verdict(self) -> None:
        """After a collective failed: give the watcher the time it needs to name a lost peer (it exits
        the process when it does); returns when no peer was found lost."""
        deadline = time.monotonic() + self.timeout_s + 2 * self.interval_s
        while self._threads[1].is_alive() and time.monotonic() < deadline:
            time.sleep(self.interval_s / 4)

    def _peer(self, island: int) -> str:
        known = self._hosts.get(island)
        return known.describe() if known else f"island {island} (never reported its host)"

    def _beat(self) -> None:
        """Beat and read the peers' beats; a store call that fails or hangs leaves `_store_ok` behind."""
        while not self._stop.wait(self.interval_s):
            try:
                self._store.add(f"{_PREFIX}/beat/{self.me.island}", 1)
                counts = {p: self._store.add(f"{_PREFIX}/beat/{p}", 0) for p in self.peers}
                done = {p for p in self.peers if self._store.add(f"{_PREFIX}/done/{p}", 0)}
                for p in self.peers:  # where each peer runs, read once (the watcher names it from this)
                    key = f"{_PREFIX}/host/{p}"
                    if p not in self._hosts and self._store.check([key]):
                        self._hosts[p] = Identity(**json.loads(self._store.get(key)))
            except Exception as err:  # noqa: BLE001 - any store error: reconnect and try again next beat
                self._store_error = f"{type(err).__name__}: {err}"
                try:
                    self._store = self._connect(timedelta(seconds=self.interval_s * 2))
                except Exception:  # noqa: BLE001 - still unreachable
                    pass
                continue
            now = time.monotonic()
            self._store_ok = now
            for peer, count in counts.items():
                if peer in done:
                    self._seen.pop(peer, None)
                elif peer in self._seen and count != self._seen[peer][0]:
                    self._seen[peer] = (count, now)

    def _watch(self) -> None:
        """Judge from what `_beat` last saw (no store call here, so a hung connection cannot stall it)."""
        while not self._stop.wait(self.interval_s / 2):
            now = time.monotonic()
            if now - self._store_ok > self.timeout_s:
                self.on_lost(f"{self.me.describe()} lost the rendezvous store at {self.store_address} for "
                             f"{now - self._store_ok:.1f} s ({self._store_error or 'no answer'})")
                return
            for peer, (_, moved) in list(self._seen.items()):
                if now - moved > self.timeout_s:
                    self.on_lost(f"{self._peer(peer)}: no heartbeat for {now - moved:.1f} s "
                                 f"(seen by {self.me.describe()})")
                    return
