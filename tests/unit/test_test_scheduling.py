"""How `make test` hands test files to its workers (`tests/support/scheduling.py`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scheduling import EXCLUSIVE_GROUPS, GroupedFileScheduling, order_items, rank


def test_an_exclusive_groups_files_are_one_work_unit_and_every_other_file_its_own():
    split = GroupedFileScheduling._split_scope
    scheduler = object.__new__(GroupedFileScheduling)  # _split_scope reads nothing of the scheduler
    group = [f"tests/integration/{name}::test_x" for name in EXCLUSIVE_GROUPS["netns"]]
    assert {split(scheduler, nodeid) for nodeid in group} == {"exclusive:netns"}
    assert split(scheduler, "tests/integration/test_dags.py::test_a[1]") == "tests/integration/test_dags.py"
    assert split(scheduler, "tests/unit/test_span.py::test_b") == "tests/unit/test_span.py"


def test_groups_come_first_then_integration_then_unit_files_each_kept_whole_and_in_order():
    ids = ["tests/unit/test_span.py::a", "tests/integration/test_dags.py::b", "tests/unit/test_span.py::c",
           "tests/integration/test_fleet.py::d", "tests/integration/test_dags.py::e",
           "tests/integration/test_fleet.py::f"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order_items(items)
    assert [i.nodeid.rsplit("::", 1)[1] for i in items] == ["d", "f", "b", "e", "a", "c"]
    assert [rank(i) for i in ids] == [2, 1, 2, 0, 1, 0]


def test_this_run_was_collected_in_that_order(request: pytest.FixtureRequest):
    ranks = [rank(item.nodeid) for item in request.session.items]
    assert ranks == sorted(ranks)
