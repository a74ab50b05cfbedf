"""Role passwords never reach psql's command line, and a failing cluster command never echoes one."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from syncsafe.team import postgres
from syncsafe.team.daemons import TeamError


@pytest.fixture
def recording_psql(tmp_path: Path, monkeypatch) -> Path:
    """A `psql` in a bin folder of its own that records its argv and stdin (what `ps` and a pipe would see)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "psql"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\ncat > {tmp_path}/stdin\necho 1\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(postgres, "bindir", lambda: bin_dir)
    return tmp_path


def cluster(base: Path) -> postgres.Cluster:
    (base / "pg").mkdir(exist_ok=True)
    return postgres.Cluster(base=base / "pg", uid=os.getuid(), gid=os.getgid())


def test_a_role_password_goes_on_stdin_never_on_argv(recording_psql: Path):
    secret = "s3cret-'quote-0123456789"
    postgres.psql(cluster(recording_psql), 5432, f"ALTER ROLE x PASSWORD '{secret}'", secrets=(secret,))
    argv = (recording_psql / "argv").read_text()
    assert "PASSWORD" not in argv and secret not in argv
    assert (recording_psql / "stdin").read_text() == f"ALTER ROLE x PASSWORD '{secret}'\n"
    assert argv.splitlines()[-2:] == ["-f", "-"]


def test_a_failing_command_blanks_every_secret_out_of_its_error(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(postgres, "bindir", lambda: Path("/usr/bin"))
    secret = "pw-0123456789abcdef"
    with pytest.raises(TeamError) as err:
        postgres.run(cluster(tmp_path), ["sh", "-c", f"cat >/dev/null; echo 'ERROR near {secret}' >&2; exit 3"],
                     stdin="ALTER ROLE ...", secrets=(secret,))
    assert secret not in str(err.value) and "ERROR near ***" in str(err.value) and "exit 3" in str(err.value)
