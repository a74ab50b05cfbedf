"""CPU placement of the real arm: the split, the client pinned and given back, and the placement /proc shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from syncsafe.serving.placement import BACKGROUND_NICE, CpuPlacement, allowed_cpus, cpu_list, parse_cpu_list

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def _two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2 and os.environ.get("CI") != "true":
        pytest.skip("a split placement needs two CPUs (CI machines have them)")


def test_cpu_lists_read_like_proc_and_back():
    assert cpu_list([5, 0, 1, 2]) == "0-2,5" and cpu_list([3]) == "3" and cpu_list([1, 3, 4]) == "1,3-4"
    for cpus in ([5, 0, 1, 2], [3], [1, 3, 4], [0, 2, 4, 5, 6, 9]):
        assert parse_cpu_list(cpu_list(cpus)) == set(cpus)
    assert parse_cpu_list("") == set()


def test_the_last_cpus_go_to_the_client_and_one_cpu_cannot_be_split():
    split = CpuPlacement.split(1, available=[0, 1, 2, 3])
    assert (split.mode, split.client, split.server) == ("split", (3,), (0, 1, 2))
    alone = CpuPlacement.split(1, available=[7])
    assert (alone.mode, alone.client, alone.server) == ("priority", (7,), (7,))
    with pytest.raises(ValueError, match="client_cpus must be >= 1"):
        CpuPlacement.split(0)


def test_the_client_is_pinned_inside_the_block_and_given_back_after():
    placement = CpuPlacement.split(1)
    before = allowed_cpus(os.getpid())
    with placement.pinned_client():
        assert allowed_cpus(os.getpid()) == cpu_list(placement.client)
    assert allowed_cpus(os.getpid()) == before


def test_the_enacted_placement_names_a_process_that_is_not_where_it_belongs():
    _two_cpus()
    placement = CpuPlacement.split(1)
    with placement.pinned_client():
        placed = subprocess.Popen(SLEEPER, preexec_fn=placement.preexec())
        stray = subprocess.Popen(SLEEPER)  # inherits the client's CPUs
        # pinned to one of the server's CPUs (as vLLM's OpenMP binding pins a worker's main thread): still placed
        narrow = subprocess.Popen(SLEEPER, preexec_fn=lambda: os.sched_setaffinity(0, placement.server[:1]))
    try:
        with placement.pinned_client():
            seen, misplaced = placement.enacted([placed.pid, narrow.pid], [])
            assert misplaced == [] and seen == {
                "server": {str(placed.pid): cpu_list(placement.server),
                           str(narrow.pid): cpu_list(placement.server[:1])},
                "merge": {}, "client": cpu_list(placement.client)}
            _, misplaced = placement.enacted([placed.pid], [stray.pid])
            assert misplaced == [f"merge process {stray.pid} may run on CPUs {cpu_list(placement.client)}, "
                                 f"beyond the server's {cpu_list(placement.server)}"]
        _, misplaced = placement.enacted([placed.pid], [])  # outside the block: the client is not on its CPUs
        assert len(misplaced) == 1 and misplaced[0].startswith("the client may run on CPUs")
        placed.kill()
        placed.wait()
        with placement.pinned_client():  # a process gone since it was listed is not read
            assert placement.enacted([placed.pid], []) == ({"server": {}, "merge": {},
                                                             "client": cpu_list(placement.client)}, [])
    finally:
        for proc in (placed, stray, narrow):
            proc.kill()
            proc.wait()


def test_on_one_cpu_the_background_must_run_at_lower_priority():
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    placement = CpuPlacement.split(1, available=cpus[:1])
    assert placement.mode == "priority"
    with placement.pinned_client():
        niced = subprocess.Popen(SLEEPER, preexec_fn=placement.preexec())
        plain = subprocess.Popen(SLEEPER)
    try:
        with placement.pinned_client():
            seen, misplaced = placement.enacted([niced.pid], [plain.pid])
    finally:
        for proc in (niced, plain):
            proc.kill()
            proc.wait()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen["server"] == {str(niced.pid): {"cpus": cpu_list(cpus[:1]), "nice": min(base + BACKGROUND_NICE, 19)}}
    why = f"merge process {plain.pid} runs at nice {base}, below {BACKGROUND_NICE}: it would not yield to the client"
    assert misplaced == ([why] if base < BACKGROUND_NICE else [])
