"""Bad input is one clear line and exit 2, before anything runs or is written (a lost island's exit 3: tests/integration/test_train.py).

One test per row of the reliability table that concerns params and arguments:
non-finite numbers, duplicate keys, CLI arguments outside params, the exit code
of a lost island, and `--host`/`--port` in the vLLM server arguments.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import ConfigError, parse_params
from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_ISLAND_LOST, BadInput

REPO = Path(__file__).resolve().parents[2]


def _run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def _one_clean_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    return lines[0]


def test_exit_codes_are_the_documented_ones():
    assert (EXIT_FAILED, EXIT_BAD_INPUT, EXIT_ISLAND_LOST) == (1, 2, 3)
    readme = (REPO / "README.md").read_text()
    for code, words in ((1, "a run failed"), (2, "bad input"), (3, "a lost island")):
        assert f"| {code} | {words}" in readme
    assert issubclass(ConfigError, BadInput)


def test_infinite_number_in_params_is_one_line_exit_2(tmp_path, raw_params):
    raw_params["merge"]["window_s"] = float("inf")
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw_params))  # written as `.inf`
    assert ".inf" in path.read_text()
    result = _run("traces", "--params", path, "--root", tmp_path)
    assert result.exit_code == 2
    line = _one_clean_line(result.output)
    assert "merge.window_s" in line and "finite" in line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("key", ["merge.window_s", "replay.vllm.time_scale", "control.score.threshold"])
def test_nan_is_refused_wherever_a_number_goes(raw_params, key):
    node = raw_params
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = float("nan")
    with pytest.raises(ConfigError, match=rf"{key}: Input should be a finite number"):
        parse_params(raw_params)


def test_duplicate_key_is_refused_naming_it(tmp_path, params_file):
    text = params_file.read_text().replace("merge:\n", "merge:\n  min_gap_s: 5\n", 1)
    assert text.count("min_gap_s") == 2
    params_file.write_text(text)
    result = _run("traces", "--params", params_file, "--root", tmp_path)
    assert result.exit_code == 2
    line = _one_clean_line(result.output)
    assert "duplicate key 'min_gap_s'" in line and str(params_file) in line
    assert not (tmp_path / "data").exists()
    result = _run("profile", "gpu", "--params", params_file, "--out", tmp_path / "gpu.yaml")
    assert result.exit_code == 2 and "duplicate key 'min_gap_s'" in result.output
    assert not (tmp_path / "gpu.yaml").exists()


def test_duplicate_section_is_refused(tmp_path, params_file):
    params_file.write_text(params_file.read_text() + "\nmerge:\n  window_s: 4\n")
    result = _run("check", "--params", params_file)
    assert result.exit_code == 2 and "duplicate key 'merge'" in _one_clean_line(result.output)


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--seed", "99", "--seed 99: not in seeds"),
    ("--policy", "nope", "--policy 'nope': not in control.policies"),
    ("--regime", "calm", "--regime 'calm': not a regime"),
])
def test_train_arguments_are_checked_before_any_island_starts(tmp_path, params_file, option, value, words):
    result = _run("train", option, value, "--params", params_file, "--root", tmp_path)
    assert result.exit_code == 2
    assert words in _one_clean_line(result.output)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "models").exists()


@pytest.mark.parametrize("arg", ["--host", "--host=0.0.0.0", "--port", "--served-model-name"])
def test_server_identity_arguments_are_refused_in_params(tmp_path, params_file, arg):
    raw = yaml.safe_load(params_file.read_text())
    raw["replay"]["vllm"]["server_args"] = [*raw["replay"]["vllm"].get("server_args", []), arg, "0.0.0.0"]
    params_file.write_text(yaml.safe_dump(raw))
    result = _run("check", "--params", params_file)
    assert result.exit_code == 2
    line = _one_clean_line(result.output)
    assert "replay.vllm" in line and arg.split("=")[0] in line and "not allowed" in line


def test_server_refuses_identity_arguments_and_sets_its_own_last(tmp_path):
    from syncsafe.serving.vllm_server import VllmServer

    with pytest.raises(BadInput, match="--host is not allowed"):
        VllmServer("python", "m", tmp_path / "log", ["--host=0.0.0.0"])
    server = VllmServer("python", "m", tmp_path / "log", ["--dtype", "float32"])
    server.port, server.served_name = 4321, "syncsafe-x"
    cmd = server.command()
    assert cmd[-6:] == ["--served-model-name", "syncsafe-x", "--host", "127.0.0.1", "--port", "4321"]
    from syncsafe.config import VllmReplay

    assert "port" not in VllmReplay.model_fields  # a free port per start, never a fixed one


def test_a_failed_run_exits_1_and_click_exits_pass_through(tmp_path):
    result = _run("replay", "index", "--root", tmp_path)  # no replay sets: a run that cannot proceed
    assert result.exit_code == 1 and "no replay sets" in _one_clean_line(result.output)
    assert _run("compare", "--format", "xml", "--root", tmp_path).exit_code == 2


@pytest.mark.parametrize("jobs, extra", [("0", []), ("-5", ["--dry-run"]), ("0", ["--dry-run"])])
def test_run_refuses_a_number_of_cores_below_one_in_one_line(tmp_path, jobs, extra):
    """`--jobs 0` ran on every core and `--jobs -5 --dry-run` exited 0; both are refused before anything runs."""
    result = _run("run", "--jobs", jobs, *extra, "--root", tmp_path)
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"--jobs {jobs}: expected a number of cores, at least 1" in _one_clean_line(result.output)
    assert not (tmp_path / "logs").exists()
