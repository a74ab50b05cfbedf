"""`syncsafe analyze --runs FILE --out DIR` on an external runs table."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from syncsafe.analysis.synthetic import synthetic_runs
from syncsafe.cli import app


def test_analyze_external_table_writes_the_contract(tmp_path):
    runs = tmp_path / "runs.csv"
    synthetic_runs(regimes=("bursty",), n_seeds=5, n_draws=8).to_csv(runs, index=False)
    mech = tmp_path / "mechanism.json"
    mech.write_text(json.dumps({"regimes": {"bursty": {"sync_ratio": 1.5, "pressure_ratio": 1.2}}}))
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(out), "--mechanism", str(mech)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "policy_table.csv")
    assert list(table.columns[:8]) == ["regime", "policy", "n_seeds", "slo_pct_mean", "sync_excess_pct_mean",
                                       "p_vs_matched_random", "seeds_won", "tier"]
    assert (out / "report.md").is_file() and (out / "metrics.json").is_file()
    assert table.set_index("policy").loc["fixed_h", "tier"] != "beats matched random"


def test_analyze_bad_inputs_fail_cleanly(tmp_path):
    runs = tmp_path / "runs.csv"
    pd.DataFrame({"regime": ["bursty"], "policy": ["fixed_h"], "seed": [0]}).to_csv(runs, index=False)
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "slo_violation_rate" in result.output and str(runs) in result.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    mech = tmp_path / "m.json"
    mech.write_text("{}")
    synthetic_runs(regimes=("bursty",), n_seeds=2, n_draws=2).to_csv(runs, index=False)
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "o"), "--mechanism", str(mech)])
    assert result.exit_code == 1 and "not a mechanism-evidence file" in result.output
