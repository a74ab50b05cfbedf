"""params.yaml validation: every impossible value names its key and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import ConfigError, load_params, parse_params


def test_shipped_params_are_valid(repo_root):
    p = load_params(repo_root / "params.yaml")
    assert p.profile == "cpu"
    assert set(p.regimes) == {"bursty", "steady", "pressure_heavy", "azure_conv"}
    bursty = p.regimes["bursty"]
    assert (bursty.period_s, bursty.window_s) == (120, 30)
    azure = p.regimes["azure_conv"]
    assert (azure.kind, azure.format, azure.duration_s, azure.segment_stride_s) == ("trace", "azure", 600, 300)
    assert (repo_root / azure.path).is_file()


def _mutate(raw: dict, dotted: str, value) -> dict:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    return raw


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("control.bogus", 1, "control.bogus: unknown key"),
        ("merge.window_s", "eight", "merge.window_s: Input should be a valid number"),
        ("seeds", "zero", "seeds: Input should be a valid list"),
        ("control.min_h", 90, "min_h (90) must be <= max_h (16)"),
        ("merge.window_s", 0, "merge.window_s: Input should be greater than 0"),
        ("merge.window_s", -4, "merge.window_s: Input should be greater than 0"),
        ("regimes.bursty.window_s", 200, "regimes.bursty: window_s (200.0) must not be longer than period_s (120.0)"),
        ("regimes.bursty.window_s", 0, "regimes.bursty.window_s: Input should be greater than 0"),
        ("regimes.bursty.kind", "spiky", "regimes.bursty: Input tag 'spiky'"),
        ("merge.min_gap_s", 30, "merge.min_gap_s (30.0) must be <="),
        ("merge.window_s", 7.3, "merge.window_s (7.3) must be a multiple of traces.step_s"),
        ("profile", "tpu", "profile: Input should be 'cpu' or 'gpu'"),
    ],
)
def test_bad_value_names_the_key(raw_params, key, value, expected):
    with pytest.raises(ConfigError) as err:
        parse_params(_mutate(raw_params, key, value))
    assert expected in str(err.value)


def test_unknown_top_level_key(raw_params):
    raw_params["regime"] = {}
    with pytest.raises(ConfigError, match=r"params.yaml: regime: unknown key"):
        parse_params(raw_params)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("key", "value"),
    [("control.min_h", 90), ("regimes.bursty.window_s", -1), ("regimes.bursty.window_s", 500), ("typo", 1)],
)
def test_cli_stops_with_exit_2_and_writes_nothing(tmp_path: Path, raw_params, key, value):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_mutate(raw_params, key, value)))
    root = tmp_path / "project"
    root.mkdir()
    result = CliRunner().invoke(app, ["traces", "--params", str(params), "--root", str(root)])
    assert result.exit_code == 2
    assert key.split(".")[-1] in result.output
    assert result.output.count("\n") == 1, "one clear line"
    assert list(root.iterdir()) == []


def test_cli_rejects_unknown_regime(params_file, tmp_path):
    result = CliRunner().invoke(app, ["traces", "--regime", "nope", "--params", str(params_file), "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "--regime 'nope'" in result.output


def test_gpu_profile_overlay_is_valid(repo_root, tmp_path, cli):
    out = tmp_path / "params.gpu.yaml"
    cli("profile", "gpu", "--params", repo_root / "params.yaml", "--out", out)
    gpu = load_params(out)
    assert gpu.profile == "gpu" and gpu.train.islands == 8 and len(gpu.seeds) == 10
    assert gpu.regimes["bursty"].period_s == 120  # untouched keys keep the cpu values
    assert gpu.replay.vllm.time_scale == 1.0 and gpu.train.hub.model.startswith("HuggingFaceTB/")
