"""Shared fixtures: small params for fast pipeline runs; one lock per group of test files that share a machine-wide
resource (network namespaces); the order and units in which `make test`'s workers take the files (`scheduling`)."""

from __future__ import annotations

import copy
import fcntl
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from syncsafe.config import Params, parse_params
from syncsafe.profiles import compose_file
from scheduling import GroupedFileScheduling, exclusive_group, order_items
from small_params import small_raw_params

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_raw():
    """A factory of fresh copies of params.yaml composed with the tiny profile (`syncsafe profile tiny`);
    session-scoped so that module-scoped fixtures can build on it."""
    composed = compose_file(REPO / "params.yaml", ["tiny"])
    return lambda: copy.deepcopy(composed)


@pytest.fixture
def tiny_params(tmp_path: Path, tiny_raw) -> Path:
    """The tiny profile's params written to tmp_path/params.yaml."""
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_raw(), sort_keys=False))
    return path


@pytest.fixture
def cli():
    """Run a `syncsafe` command in-process; fail the test with its output unless it exits 0."""
    from typer.testing import CliRunner

    from syncsafe.cli import app

    def invoke(*args: str) -> str:
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        return result.output

    return invoke


@pytest.fixture(autouse=True)
def _no_tracking(monkeypatch, request):
    """Stages track to MLflow by default; tests other than the tracking tests keep it off."""
    if request.node.fspath.basename != "test_tracking.py":
        monkeypatch.setenv("SYNCSAFE_TRACKING", "off")


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def raw_params() -> dict:
    return copy.deepcopy(small_raw_params())


@pytest.fixture
def params(raw_params: dict) -> Params:
    return parse_params(raw_params)


@pytest.fixture
def params_file(tmp_path: Path, raw_params: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw_params))
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order_items(items)  # exclusive groups, then integration files, then unit files (`scheduling`)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile` with each exclusive group's files one work unit (`scheduling`)."""
    return GroupedFileScheduling(config, log) if config.getoption("dist") == "loadfile" else None


@pytest.fixture(scope="module", autouse=True)
def _exclusive_group(request: pytest.FixtureRequest) -> Iterator[None]:
    """This file's `scheduling.EXCLUSIVE_GROUPS` lock (a file lock every process sees), held until its last test is
    done: one worker runs a group's files in turn, and the lock keeps out any other run (another distribution mode,
    a second pytest)."""
    group = exclusive_group(request.node.path.name)
    if group is None:
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"syncsafe-tests-{group}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the worker dies
        yield
