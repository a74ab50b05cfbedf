"""The traces -> schedules pipeline through the CLI, and `dvc repro` in a fresh copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import CONTROLLER_POLICIES, load_params
from syncsafe.schedules.schedule import LoadIntegral, busy_overlap_s, read_schedule
from syncsafe.traces.stage import load_timeline

INDEX_COLUMNS = ["regime", "policy", "seed", "draw", "matched_to", "source", "n_merges", "path"]


@pytest.fixture
def built(tmp_path, params_file, cli):
    root = tmp_path / "project"
    for cmd in (["traces"], ["schedules", "build"], ["schedules", "index"]):
        cli(*cmd, "--params", str(params_file), "--root", str(root))
    return root


def test_schedule_index_contract(built, params):
    index = pd.read_csv(built / "runs" / "schedules" / "index.csv")
    assert list(index.columns) == INDEX_COLUMNS
    n_seeds, n_pol, draws = len(params.seeds), len(CONTROLLER_POLICIES), params.schedules.random_draws
    # per seed: no_sync; per controller: itself, its offline bound, its even cadence and two envelopes of draws
    assert len(index) == len(params.regimes) * n_seeds * (1 + n_pol * (3 + 2 * draws))
    assert set(index["source"]) == {"harness", "matched_random", "matched_random_free", "even_cadence", "no_sync",
                                    "offline_bound"}
    drawn = index["source"].isin(["matched_random", "matched_random_free"])
    assert index.loc[drawn, "draw"].notna().all() and index.loc[~drawn, "draw"].isna().all()
    for rec in index.sample(40, random_state=0).itertuples():
        s = read_schedule(built / rec.path)
        assert (s.regime, s.policy, s.seed, s.n_merges) == (rec.regime, rec.policy, rec.seed, rec.n_merges)


def test_offline_bound_never_overlaps_more_than_its_controller_or_draws(built):
    index = pd.read_csv(built / "runs" / "schedules" / "index.csv")
    for (regime, seed, matched), group in index[index["matched_to"].notna()].groupby(["regime", "seed", "matched_to"]):
        load = LoadIntegral(load_timeline(built, regime, seed))
        ctl_path = index[(index.regime == regime) & (index.seed == seed) & (index.policy == matched)]["path"].item()
        overlap = {p: busy_overlap_s(read_schedule(built / p), load) for p in [ctl_path, *group["path"]]}
        bound = group.loc[group["source"] == "offline_bound", "path"].item()
        assert all(overlap[bound] <= v + 1e-9 for v in overlap.values())


def test_schedules_view_shows_every_policy_seed_and_regime(built, params, cli):
    out = cli("schedules", "--root", str(built))
    for regime in params.regimes:
        assert f"regime {regime}" in out
    for policy in CONTROLLER_POLICIES:
        assert policy in out
        assert f"matched_random[{policy}]" in out and f"offline_bound[{policy}]" in out
    assert "no_sync" in out and "busy overlap" in out


STAGES = (["traces"], ["schedules", "build"], ["schedules", "index"], ["replay", "run", "--backend", "simulator"],
          ["replay", "index"])


def _all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _two_regimes(raw: dict) -> dict:
    raw["regimes"] = {k: v for k, v in raw["regimes"].items() if k in ("bursty", "steady")}
    raw["replay"]["vllm"]["regimes"] = ["bursty"]
    raw["replay"]["simulator"]["calibration"] = None  # shipped defaults: no calibrate stage here
    return raw


@pytest.mark.slow
def test_rerun_writes_every_output_byte_for_byte(tmp_path, raw_params, cli):
    """Two fresh runs of traces -> schedules -> simulator replay -> replay index -> analyze: every file
    identical, the replay index, policy_table.csv and metrics.json included."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(_two_regimes(raw_params)))
    runs = []
    for name in ("first", "again"):
        root = tmp_path / name
        for cmd in (*STAGES, ["analyze"]):
            cli(*cmd, "--params", str(params_file), "--root", str(root))
        runs.append(_all_files(root))
    first, again = runs
    assert sorted(first) == sorted(again)
    for path in ("runs/replay/index.csv", "reports/policy_table.csv", "reports/metrics.json"):
        assert path in first
    assert any(p.endswith("decisions.jsonl") for p in first) and any(p.endswith("requests.parquet") for p in first)
    assert [p for p in first if first[p] != again[p]] == []
    decision = json.loads(next(v for p, v in first.items() if p.endswith("decisions.jsonl")).splitlines()[0])
    assert "decide_us" not in decision  # the decision log holds trace-time facts only


def test_a_regime_seed_or_policy_removed_from_params_is_not_indexed(tmp_path, raw_params, cli):
    root = tmp_path / "project"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(_two_regimes(raw_params)))
    for cmd in STAGES:
        cli(*cmd, "--params", str(path), "--root", str(root))
    primary = raw_params.get("analysis", {}).get("primary", {})
    kept = primary.get("regime", "bursty")
    policies = list(dict.fromkeys([primary.get("policy", "wa_diloco"), "fixed_h"]))
    raw_params["regimes"] = {kept: raw_params["regimes"][kept]}
    raw_params["seeds"] = [1]
    raw_params["control"]["policies"] = policies
    raw_params["replay"]["vllm"].update({"regimes": [kept], "policies": policies})
    path.write_text(yaml.safe_dump(raw_params))
    for cmd in (["schedules", "index"], ["replay", "index"]):
        cli(*cmd, "--params", str(path), "--root", str(root))
    for index in (pd.read_csv(root / "runs" / "schedules" / "index.csv"),
                  pd.read_csv(root / "runs" / "replay" / "index.csv")):
        assert set(index["regime"]) == {kept} and set(index["seed"]) == {1}
        controllers = set(index.loc[index["source"].isin(["harness", "train"]), "policy"])
        assert controllers == set(policies)
        assert set(index["matched_to"].dropna()) == set(policies)
        assert "no_sync" in set(index["policy"])
    assert (root / "runs" / "replay-sets" / "simulator" / "steady").is_dir()  # still on disk, never indexed


def test_import_trace_command(tmp_path, cli):
    src = tmp_path / "burst.csv"
    src.write_text("Timestamp,Request tokens,Response tokens\n3,10,5\n7,20,0\n9,30,6\n")
    out = tmp_path / "requests.parquet"
    assert "2 requests" in cli("import-trace", "burstgpt", str(src), "--out", str(out))
    assert pd.read_parquet(out)["arrival_s"].tolist() == [0.0, 6.0]
    bad = CliRunner().invoke(app, ["import-trace", "azure", str(src), "--out", str(tmp_path / "x.parquet")])
    assert bad.exit_code == 2 and "TIMESTAMP" in bad.output and not (tmp_path / "x.parquet").exists()


@pytest.mark.slow
@pytest.mark.real_server
def test_dvc_repro_in_a_fresh_copy_then_nothing_to_do(real_repro):
    """The whole dvc.yaml, real training and a real vLLM replay included (the session's shared run,
    `real_repro.repro_params`), then a no-op second repro."""
    project, first = real_repro.project, real_repro.first
    assert first.returncode == 0, first.stdout + first.stderr
    assert "Running stage 'train@steady'" in first.stdout and "Running stage 'schedules@steady'" in first.stdout
    index = pd.read_csv(project / "runs" / "schedules" / "index.csv")
    assert set(index.loc[index["matched_to"].isna() & (index["policy"] != "no_sync"), "source"]) == {"train"}
    replays = pd.read_csv(project / "runs" / "replay" / "index.csv")
    assert set(replays["backend"]) == {"simulator", "vllm"}
    # the first no-sync control and every planned controller with its span-matched draws; the later
    # no-sync controls are listed in runs/replay-sets/vllm/repeats.csv
    plan = json.loads((project / "runs" / "replay-sets" / "vllm" / "plan.json").read_text())["regimes"]["bursty"]
    assert plan["controllers"][0] == real_repro.raw["analysis"]["primary"]["policy"]
    assert len(replays[replays["backend"] == "vllm"]) == 1 + len(plan["controllers"]) * (2 + plan["draws"])
    repeats = pd.read_csv(project / "runs" / "replay-sets" / "vllm" / "repeats.csv")
    if len(repeats) == plan["controls"]:
        # the drift test asked for one more control per seed; with it, the seeds stay when their controls no longer
        # follow the replay order (the deciding p is at or above control_alpha) and are left out otherwise
        alpha = load_params(project / "params.yaml").replay.vllm.control_alpha
        for rec in repeats.itertuples():
            summary = json.loads((project / rec.path / "summary.json").read_text())
            if rec.valid:
                assert summary["control_p"] >= alpha, summary
            elif "noise floor" in (summary["invalid_reason"] or ""):
                assert summary["control_p"] < alpha, summary
    else:
        assert len(repeats) == plan["controls"] - 1
    assert (project / "runs" / "calibration" / "mechanism.json").is_file()
    table = pd.read_csv(project / "reports" / "policy_table.csv")
    assert set(table["policy"]) == {"fixed_h", "wa_diloco", "no_sync"}  # references are columns of their controller
    assert "## Real replays (vLLM)" in (project / "reports" / "report.md").read_text()
    second = real_repro.run("dvc", "repro")
    assert second.returncode == 0
    assert "Running stage" not in second.stdout
    assert "up to date" in second.stdout
    # the server profile is reused until what it measures changes: a new replay budget re-plans, never re-profiles
    params_yaml = project / "params.yaml"
    written = params_yaml.read_text()
    try:
        changed_raw = yaml.safe_load(written)
        changed_raw["replay"]["vllm"]["budget_s"] += 10
        params_yaml.write_text(yaml.safe_dump(changed_raw))
        changed = json.loads(real_repro.run("dvc", "status", "--json").stdout)
        assert "replay-vllm" in changed and "profile-vllm" not in changed
        dry = real_repro.run("syncsafe", "run", "--dry-run", "--redo", "profile-vllm")  # re-profiling on purpose
        assert dry.returncode == 0, dry.stderr
        assert "run profile-vllm alone" in dry.stdout and "run replay-vllm alone" in dry.stdout
        assert "ok  traces@bursty" in dry.stdout
    finally:  # the other tests read this project as it ran
        params_yaml.write_text(written)


def test_dvc_yaml_command_writes_the_render_and_check_names_a_stage_that_differs(tmp_path, cli):
    root = tmp_path / "checkout"
    (root / "dags").mkdir(parents=True)
    cli("dvc-yaml", "--root", root)
    assert "match the declarations" in cli("dvc-yaml", "--check", "--root", root)
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert stages["train"]["foreach"] == "${regimes}" and "stages/train.py" in stages["train"]["do"]["deps"]
    text = (root / "dvc.yaml").read_text()
    (root / "dvc.yaml").write_text(text.replace("      - src/syncsafe/diloco\n", "", 1))  # train's first use of it
    result = CliRunner().invoke(app, ["dvc-yaml", "--check", "--root", str(root)])
    assert result.exit_code == 1 and "stage train" in result.output and "stage traces" not in result.output
    assert (root / "dvc.yaml").read_text() != text  # --check writes nothing


_LOADED = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
print("LOADED", " ".join(sorted(m for m in sys.modules if m.startswith("syncsafe"))))
"""


def test_a_stage_script_runs_its_entry_alone_with_the_cli_s_outputs(tmp_path, params_file, cli, repo_root):
    """stages/traces.py writes what `syncsafe traces` writes, and loads none of the other stages' code."""
    by_cli, by_script = tmp_path / "cli", tmp_path / "script"
    cli("traces", "--regime", "bursty", "--params", params_file, "--root", by_cli)
    env = {**os.environ, "PYTHONPATH": str(repo_root / "src")}
    args = [sys.executable, "-c", _LOADED, str(repo_root / "stages" / "traces.py"), "--regime", "bursty",
            "--params", str(params_file), "--root", str(by_script)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _all_files(by_cli) == _all_files(by_script) and _all_files(by_cli)
    loaded = next(line for line in done.stdout.splitlines() if line.startswith("LOADED")).split()[1:]
    assert "syncsafe.pipeline.entries.traces" in loaded and "syncsafe.traces.stage" in loaded
    assert not [m for m in loaded if m.startswith(("syncsafe.cli", "syncsafe.analysis", "syncsafe.serving",
                                                   "syncsafe.diloco", "syncsafe.pipeline.entries.train"))]
    bad = subprocess.run([*args[:5], "nope", *args[6:]], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --regime 'nope': not a regime in params.yaml (have " + repr(sorted(yaml.safe_load(
            params_file.read_text())["regimes"])) + ")"]


@pytest.mark.slow
def test_the_calibration_loop_has_no_cycle_in_dvc(repo_root):
    dvc = repo_root / ".venv" / "bin" / "dvc"
    if not dvc.exists():
        dvc = Path(shutil.which("dvc") or "dvc")
    done = subprocess.run([str(dvc), "dag", "--dot"], cwd=repo_root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr  # dvc refuses a cyclic pipeline
    edges = {tuple(part.strip().strip('"') for part in line.rstrip(";").split("->"))
             for line in done.stdout.splitlines() if "->" in line}
    assert ("replay-vllm", "calibrate-fit") in edges and ("calibrate-fit", "fidelity") in edges
    assert any(a == "calibrate-fit" and b.startswith("replay-simulator@") for a, b in edges)
    assert ("fidelity", "analyze") in edges
    assert not any(a.startswith("replay-simulator@") and b in ("replay-vllm", "calibrate-fit") for a, b in edges)
