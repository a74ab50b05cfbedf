"""`team up --dir` owns only what it made: a new or empty folder becomes its 0700 state folder; any other is refused."""

from __future__ import annotations

import os
import stat

import pytest

from syncsafe.team.daemons import TeamError
from syncsafe.team.stack import MARKER, own_state_folder


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_folder_is_made_0700_and_marked(tmp_path):
    root = tmp_path / "a" / "team"
    own_state_folder(root, os.getgid())
    assert _mode(root) == 0o700 and (root / MARKER).is_file()
    os.chmod(root, 0o700)
    own_state_folder(root, os.getgid())  # its own folder again: reused as it is
    assert _mode(root) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another group needs root")
def test_the_database_users_group_may_enter_and_nobody_else(tmp_path):
    root = tmp_path / "team"
    own_state_folder(root, os.getgid() + 4242)
    assert _mode(root) == 0o750 and root.stat().st_gid == os.getgid() + 4242


def test_an_empty_private_folder_is_taken_over(tmp_path):
    root = tmp_path / "empty"
    root.mkdir(mode=0o700)  # what mktemp -d makes
    own_state_folder(root, os.getgid())
    assert _mode(root) == 0o700 and (root / MARKER).is_file()


@pytest.mark.parametrize("mode", [0o1777, 0o755, 0o2770])
def test_an_empty_folder_others_may_use_is_refused_and_keeps_its_mode(tmp_path, mode):
    shared = tmp_path / "drop"
    shared.mkdir()
    os.chmod(shared, mode)
    with pytest.raises(TeamError, match=rf"drop is an empty folder others may use \(mode {mode:04o}.*name a new folder"):
        own_state_folder(shared, os.getgid())
    assert _mode(shared) == mode and not list(shared.iterdir())


@pytest.mark.parametrize("mode", [0o1777, 0o700])
def test_a_folder_it_did_not_make_is_refused_and_left_as_it_was(tmp_path, mode):
    shared = tmp_path / "shared"  # /tmp's mode, or a private home
    shared.mkdir()
    os.chmod(shared, mode)
    (shared / "someone-elses").write_text("x")
    with pytest.raises(TeamError, match=r"shared exists and was not made by `team up`.*new or empty folder"):
        own_state_folder(shared, os.getgid())
    assert _mode(shared) == mode and sorted(p.name for p in shared.iterdir()) == ["someone-elses"]
