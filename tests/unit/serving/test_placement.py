"""CPU placement of the real arm: the split, the client pinned and given back, and the placement /proc shows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from syncsafe.serving.placement import CpuPlacement, allowed_cpus, cpu_list

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def test_cpu_lists_read_like_proc():
    assert cpu_list([5, 0, 1, 2]) == "0-2,5" and cpu_list([3]) == "3" and cpu_list([1, 3, 4]) == "1,3-4"


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
    placement = CpuPlacement.split(1)
    assert placement.mode == "split", "CI machines have at least two CPUs"
    with placement.pinned_client():
        placed = subprocess.Popen(SLEEPER, preexec_fn=placement.preexec())
        stray = subprocess.Popen(SLEEPER)  # inherits the client's CPUs
    try:
        with placement.pinned_client():
            seen, misplaced = placement.enacted([placed.pid])
            assert seen == {"background": {str(placed.pid): cpu_list(placement.server)},
                            "client": cpu_list(placement.client)} and misplaced == []
            _, misplaced = placement.enacted([placed.pid, stray.pid])
            assert misplaced == [f"process {stray.pid} may run on CPUs {cpu_list(placement.client)}, "
                                 f"not the server's {cpu_list(placement.server)}"]
        _, misplaced = placement.enacted([placed.pid])  # outside the block: the client is not on its CPUs
        assert len(misplaced) == 1 and misplaced[0].startswith("the client may run on CPUs")
        placed.kill()
        placed.wait()
        assert placement.enacted([placed.pid]) == ({"background": {}, "client": allowed_cpus(os.getpid())},
                                                   misplaced)  # a process gone since is not read
    finally:
        for proc in (placed, stray):
            proc.kill()
            proc.wait()
