"""Shared fixtures: small params for fast pipeline runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from syncsafe.config import Params, parse_params
from syncsafe.profiles import compose_file

REPO = Path(__file__).resolve().parents[1]


def small_raw_params() -> dict:
    """params.yaml shrunk: 2 seeds, 240 s regimes, 3 draws, harness schedules."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["seeds"] = [0, 1]
    for regime in raw["regimes"].values():
        regime["duration_s"] = 240
        if regime["kind"] == "trace":  # shipped trace files, wherever pytest runs from
            regime["path"] = str(REPO / regime["path"])
    raw["schedules"]["random_draws"] = 3
    raw["schedules"]["source"] = "harness"  # training has its own tests
    return raw


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
