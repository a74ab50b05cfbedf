"""Where the real arm's processes run: the server and its merge work on one CPU set, the client on another.

A real replay has three parties on one machine: the vLLM server (API
process, engine core and its OpenMP threads), the merge work beside it
(`syncsafe.serving.interference`), and the client (this stage's process: the
open-loop load generator, the /metrics scraper, the machine-busy monitor).
If they share cores, the merge work and the server starve the client, the
client sends late, and a late send looks like a slow server. So the CPUs
this process may use are split (`CpuPlacement.split`):

- the last `client_cpus` of them go to the client (this process, pinned
  with `os.sched_setaffinity` inside `pinned_client`, restored after);
- the rest go to the server and the merge work: the server's process group
  is started on them (`preexec`) and vLLM's CPU thread binding is told the
  same list (`VLLM_CPU_OMP_THREADS_BIND`), because vLLM would otherwise bind
  its OpenMP threads to cores of its own choosing; merge workers pin
  themselves to them.

With fewer CPUs than `client_cpus + 1` nothing can be split; the server and
merge work then run at a lower priority (`nice` +`BACKGROUND_NICE`) and the
placement says so (`mode: "priority"`). Every replay records its placement,
both as planned (`record`) and as /proc shows it when the replay starts
(`enacted`: the CPUs of every server process, merge worker and of the client);
a process found elsewhere fails the stage before that replay is measured.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

#: Niceness added to the server and merge work when no CPU can be set apart for the client.
BACKGROUND_NICE = 10


def cpu_list(cpus: Sequence[int]) -> str:
    """`[0, 1, 2, 5]` -> `"0-2,5"` (the form of /proc/<pid>/status `Cpus_allowed_list` and of vLLM's binding)."""
    out: list[str] = []
    ordered = sorted(set(int(c) for c in cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True)
class CpuPlacement:
    """The CPU sets of the client and of the server with its merge work (see the module docstring)."""

    mode: Literal["split", "priority"]
    client: tuple[int, ...]
    server: tuple[int, ...]

    @classmethod
    def split(cls, client_cpus: int = 1, available: Sequence[int] | None = None) -> CpuPlacement:
        """The last `client_cpus` of the CPUs this process may use for the client, the rest for the server."""
        if client_cpus < 1:
            raise ValueError(f"client_cpus must be >= 1 (got {client_cpus})")
        cpus = tuple(sorted(os.sched_getaffinity(0) if available is None else available))
        if len(cpus) <= client_cpus:
            return cls("priority", cpus, cpus)
        return cls("split", cpus[-client_cpus:], cpus[:-client_cpus])

    def record(self) -> dict[str, object]:
        """What a replay summary and the plan record of the placement."""
        return {"mode": self.mode, "client_cpus": cpu_list(self.client), "server_cpus": cpu_list(self.server)}

    def enacted(self, server: Sequence[int], merge: Sequence[int]) -> tuple[dict[str, object], list[str]]:
        """The placement as /proc shows it now, and what is not where this placement puts it (empty when all is).

        `server`: the server's processes, `merge`: the merge workers. Each must run on server CPUs only (a
        subset: vLLM's OpenMP binding may pin a worker's main thread to one of them) and, in priority mode, at a
        niceness of `BACKGROUND_NICE` or more (a lower priority); this process (the client) on exactly its CPUs. The
        record holds every process's CPU list (and niceness in priority mode); a process that exited since it
        was listed is left out (a dead server fails the stage on its own).
        """
        record: dict[str, object] = {}
        misplaced: list[str] = []
        for role, pids in (("server", server), ("merge", merge)):
            seen: dict[str, object] = {}
            for pid in pids:
                try:
                    cpus = allowed_cpus(pid)
                    nice = os.getpriority(os.PRIO_PROCESS, pid)
                except (FileNotFoundError, ProcessLookupError):
                    continue
                seen[str(pid)] = cpus if self.mode == "split" else {"cpus": cpus, "nice": nice}
                if not parse_cpu_list(cpus) <= set(self.server):
                    misplaced.append(f"{role} process {pid} may run on CPUs {cpus}, beyond the server's "
                                     f"{cpu_list(self.server)}")
                if self.mode == "priority" and nice < BACKGROUND_NICE:
                    misplaced.append(f"{role} process {pid} runs at nice {nice}, below {BACKGROUND_NICE}: it would "
                                     "not yield to the client")
            record[role] = seen
        record["client"] = client = allowed_cpus(os.getpid())
        if client != cpu_list(self.client):
            misplaced.append(f"the client may run on CPUs {client}, not its own {cpu_list(self.client)}")
        return record, misplaced

    # ------------------------------------------------------------------ the server and merge work

    def server_env(self) -> dict[str, str]:
        """Environment of the vLLM server: its CPU thread binding on the server CPUs."""
        return {"VLLM_CPU_OMP_THREADS_BIND": cpu_list(self.server), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}

    def pin_background(self) -> None:
        """In a server or merge-work process: run on the server CPUs (split) or at low priority."""
        os.sched_setaffinity(0, self.server)
        if self.mode == "priority":
            os.nice(BACKGROUND_NICE)

    def preexec(self, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """A Popen `preexec_fn` that places the child (and so its whole process tree) as background."""

        def run() -> None:
            self.pin_background()
            if then is not None:
                then()

        return run

    # ------------------------------------------------------------------ the client

    @contextmanager
    def pinned_client(self) -> Iterator[CpuPlacement]:
        """This process (the client) on its CPUs inside the block, where it was before after it."""
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.client)
        try:
            yield self
        finally:
            os.sched_setaffinity(0, before)


def parse_cpu_list(text: str) -> set[int]:
    """`"0-2,5"` -> `{0, 1, 2, 5}` (the inverse of `cpu_list`)."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def allowed_cpus(pid: int) -> str:
    """`Cpus_allowed_list` of a process, from /proc/<pid>/status (what the placement test reads)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise RuntimeError(f"/proc/{pid}/status has no Cpus_allowed_list")
