"""Is anything else using the machine while a real replay runs?

A real replay measures a server's latency on a machine assumed quiet: a test
suite, a compile or another pipeline on the same cores makes the server
slower in ways no schedule caused, so a replay taken then is not evidence.
`ForeignCpuMonitor` samples, every `interval_s` on a background thread, the
CPU time (user + system, from `/proc` through psutil) of every process that
is *not* this stage's own: not this process and not any of its descendants
(the vLLM server's whole tree, the merge workers). Kernel threads are left
out (their work is mostly the replay's own loopback traffic).

CPU time a foreign process spent during the replay counts: for a process
that existed when the watch began (seen at the first sample, or first seen
later but created before the watch: psutil's `create_time` is an epoch
instant, so it is compared with the epoch the watch began at, never with the
monotonic clock), what it gained since it was first seen; for one created
during the watch, all of its CPU time. A process that lives
and dies between two samples is missed, so a long `interval_s` undercounts
short jobs. `ForeignCpu.cores` is foreign CPU seconds per wall second (0.5 =
half a core busy on average); the replay stage marks a replay invalid
("machine busy") above `replay.vllm.max_foreign_cpu`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil

from syncsafe import timebase
from syncsafe.procs import descendants

#: kthreadd: the parent of every kernel thread.
KTHREADD_PID = 2


@dataclass(frozen=True)
class ForeignCpu:
    """What foreign processes used during a watched interval."""

    cores: float
    cpu_s: float
    wall_s: float
    #: The busiest foreign processes: (name, pid, CPU seconds), most first.
    top: list[tuple[str, int, float]] = field(default_factory=list)

    def describe(self) -> str:
        who = ", ".join(f"{name}[{pid}] {cpu:.1f} s" for name, pid, cpu in self.top[:3])
        return f"foreign processes used {self.cores:.2f} cores over {self.wall_s:.0f} s" + (f" ({who})" if who else "")


class ForeignCpuMonitor:
    """`with ForeignCpuMonitor() as m: ...; m.result()` (see the module docstring)."""

    def __init__(self, interval_s: float = 1.0, pid: int | None = None) -> None:
        self.interval_s = interval_s
        self.own_pid = os.getpid() if pid is None else pid
        self._base: dict[tuple[int, float], float] = {}
        self._last: dict[tuple[int, float], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="foreign-cpu-monitor", daemon=True)
        self._started = 0.0  # monotonic (syncsafe.timebase): the watch's wall time
        self._started_epoch = 0.0  # epoch: what a process's create_time is compared with
        self._ended: float | None = None

    def _own(self) -> set[int]:
        return {self.own_pid, *(p.pid for p in descendants(self.own_pid))}

    def _sample(self, first: bool = False) -> None:
        own = self._own()
        for proc in psutil.process_iter(["cpu_times", "create_time", "name", "ppid"]):
            info = proc.info
            times = info.get("cpu_times")
            if proc.pid in own or times is None or proc.pid == KTHREADD_PID or info.get("ppid") == KTHREADD_PID:
                continue
            key = (proc.pid, float(info.get("create_time") or 0.0))
            cpu = float(times.user + times.system)
            if key not in self._base:
                # seen at the start: only what it gains from now on; created during the watch: all of it
                self._base[key] = cpu if first or key[1] < self._started_epoch else 0.0
            self._last[key] = (str(info.get("name") or "?"), cpu)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ForeignCpuMonitor:
        self._started = timebase.now()
        self._started_epoch = time.time()
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        self._ended = timebase.now()

    def result(self) -> ForeignCpu:
        """Foreign CPU over the watched interval (call after exit)."""
        wall = max((self._ended or timebase.now()) - self._started, 1e-9)
        used = {key: max(cpu - self._base[key], 0.0) for key, (_, cpu) in self._last.items()}
        top = sorted(((self._last[k][0], k[0], v) for k, v in used.items() if v > 0), key=lambda t: -t[2])
        total = float(sum(used.values()))
        return ForeignCpu(cores=total / wall, cpu_s=total, wall_s=wall, top=top[:5])
