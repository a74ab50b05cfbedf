"""How `make test` spreads test files over its workers: groups that must run alone together, longest work first.

Some test files share a machine-wide resource (network namespaces, their links and their shaping): they may not
run at the same time. Each worker of pytest-xdist takes whole work units; here a unit is a test file, except that
the files of one `EXCLUSIVE_GROUPS` entry form one unit, so one worker runs them one after the other while the
others go on (a lock that made a second worker wait for the first left that worker idle for minutes).

Units are handed out in collection order, which `order_items` sets: the exclusive groups first (the longest chain
of work that cannot be split), then the integration files, then the unit files, whose many short tests fill the
workers' ends evenly. This is list scheduling with the long jobs first, without a table of durations to maintain.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadFileScheduling

#: Test files that share a machine-wide resource and run one after the other, by group: network namespaces,
#: their links and their shaping.
EXCLUSIVE_GROUPS = {"netns": ("test_fleet.py", "test_multihost_train.py", "test_team_hosts.py")}


def exclusive_group(file_name: str) -> str | None:
    """The `EXCLUSIVE_GROUPS` entry a test file belongs to, if any."""
    return next((g for g, files in EXCLUSIVE_GROUPS.items() if file_name in files), None)


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def rank(nodeid: str) -> int:
    """0: an exclusive group's file, 1: an integration test file, 2: any other."""
    path = PurePosixPath(_file(nodeid))
    if exclusive_group(path.name) is not None:
        return 0
    return 1 if "integration" in path.parts else 2


def order_items(items: list) -> None:
    """Reorder collected items in place by `rank`, keeping each file's tests together and in their order."""
    items.sort(key=lambda item: rank(item.nodeid))


class GroupedFileScheduling(LoadFileScheduling):
    """pytest-xdist's file-per-unit scheduling, with each exclusive group's files one unit."""

    def _split_scope(self, nodeid: str) -> str:
        group = exclusive_group(PurePosixPath(_file(nodeid)).name)
        return f"exclusive:{group}" if group is not None else _file(nodeid)
