"""`syncsafe analyze --runs FILE --out DIR` on an external runs table."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from syncsafe.analysis.synthetic import synthetic_runs
from syncsafe.cli import app

CONTRACT = ["regime", "policy", "n_seeds", "slo_pct_mean", "sync_excess_pct_mean", "p_vs_matched_random", "seeds_won",
            "tier", "p_rank", "p_adjusted", "gap_closed_mean", "gap_closed_ci_low", "gap_closed_ci_high", "calibration"]


@pytest.fixture
def write_evidence(mechanism, fidelity):
    def write(tmp_path, regimes=("bursty",), policies=("wa_diloco",)):
        mech, fid = tmp_path / "mechanism.json", tmp_path / "fidelity.json"
        mech.write_text(mechanism(*regimes).model_dump_json())
        fid.write_text(fidelity(*regimes, policies=policies).model_dump_json())
        return mech, fid

    return write


def test_analyze_external_table_writes_the_contract_and_exact_tiers(tmp_path, write_evidence):
    # wa_diloco and wa_forecast are far better than random and cadence, fixed_h clearly worse than both
    runs = tmp_path / "runs.csv"
    effects = {"fixed_h": 0.01, "wa_diloco": -0.04, "wa_forecast": -0.04}
    synthetic_runs(regimes=("bursty",), effects=effects, n_seeds=8, n_draws=10, noise=0.002).to_csv(runs, index=False)
    mech, fid = write_evidence(tmp_path, policies=("wa_diloco", "wa_forecast"))
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(out), "--mechanism", str(mech),
                                      "--fidelity", str(fid), "--primary", "wa_diloco@bursty"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "policy_table.csv")
    assert list(table.columns[: len(CONTRACT)]) == CONTRACT
    tiers = table.set_index("policy")["tier"].to_dict()
    assert tiers == {"fixed_h": "mechanism transfers", "no_sync": "reference", "wa_diloco": "beats matched random",
                     "wa_forecast": "beats matched random"}
    assert table.set_index("policy").loc["wa_diloco", "calibration"] == "fitted"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["primary"]["p_adjusted"] < 0.05 and metrics["bursty"]["n_beats_matched_random"] == 2
    report = (out / "report.md").read_text()
    assert "declared primary `wa_diloco` on `bursty` tested first" in report and "<DataFrame>" not in report


def test_without_fidelity_evidence_simulator_rows_stop_at_mechanism_transfers(tmp_path, write_evidence):
    runs = tmp_path / "runs.csv"
    synthetic_runs(regimes=("bursty",), effects={"wa_diloco": -0.04}, n_seeds=8, n_draws=10,
                   noise=0.002).to_csv(runs, index=False)
    mech, _ = write_evidence(tmp_path)
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(out), "--mechanism", str(mech)])
    assert result.exit_code == 0, result.output
    row = pd.read_csv(out / "policy_table.csv").set_index("policy").loc["wa_diloco"]
    assert row["tier"] == "mechanism transfers" and row["p_adjusted"] < 0.05
    assert "without fidelity evidence" in row["reason"]


def test_analyze_bad_inputs_fail_cleanly(tmp_path):
    runs = tmp_path / "runs.csv"
    pd.DataFrame({"regime": ["bursty"], "policy": ["fixed_h"], "seed": [0]}).to_csv(runs, index=False)
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "slo_violation_rate" in result.output and str(runs) in result.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    mech = tmp_path / "m.json"
    mech.write_text("{}")
    synthetic_runs(regimes=("bursty",), n_seeds=2, n_draws=2).to_csv(runs, index=False)
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "o"), "--mechanism", str(mech)])
    assert result.exit_code == 2 and "--mechanism" in result.output and "not a MechanismEvidence file" in result.output
    result = CliRunner().invoke(app, ["analyze", "--runs", str(runs), "--out", str(tmp_path / "o"), "--primary", "wa_diloco"])
    assert result.exit_code == 2 and "POLICY@REGIME" in result.output
