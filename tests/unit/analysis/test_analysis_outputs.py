"""analyze_runs end to end: contract files, honest report, atomic writes."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from syncsafe.analysis import analyze, analyze_runs
from syncsafe.analysis.analyze import CONTRACT_COLUMNS
from syncsafe.analysis.runs_table import RunsTableError
from syncsafe.analysis.synthetic import synthetic_runs

OUTPUTS = {"policy_table.csv", "envelope.csv", "metrics.json", "report.md", "slo_by_policy_envelope.png"}


def test_outputs_exist_with_contract_columns(clear_winner, mechanism, fidelity, tmp_path):
    runs = tmp_path / "replay_index.csv"
    clear_winner.to_csv(runs, index=False)
    out = tmp_path / "reports"
    result = analyze_runs(runs, out, mechanism("bursty"), fidelity=fidelity("bursty"), primary=("wa_diloco", "bursty"))
    assert {p.name for p in out.iterdir()} == OUTPUTS
    assert set(result.files) == OUTPUTS

    table = pd.read_csv(out / "policy_table.csv")
    assert list(table.columns[: len(CONTRACT_COLUMNS)]) == list(CONTRACT_COLUMNS)
    assert {"reason", "p_vs_fixed_cadence", "p_vs_fixed_cadence_adjusted", "ci_low", "ci_high", "training"} <= set(
        table.columns)
    winner = table.set_index("policy").loc["wa_diloco"]
    assert winner["tier"] == "beats matched random"
    assert winner["seeds_won"] == 6 and winner["n_seeds"] == 6

    envelope = pd.read_csv(out / "envelope.csv")
    assert len(envelope) == 12  # 2 controllers x 6 seeds
    assert {"mr_sync_excess_pct_min", "mr_sync_excess_pct_mean", "mr_sync_excess_pct_max"} <= set(envelope.columns)

    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"alpha", "primary", "bursty", "fidelity"}  # headline figures only
    assert metrics["primary"] == {"p_rank": 4.0 ** -6, "p_adjusted": 4.0 ** -6, "gap_closed": pytest.approx(0.8),
                                  "tier_rank": 4}
    assert metrics["bursty"]["n_beats_matched_random"] == 1 and metrics["fidelity"]["licensed"] == 1
    leaves = [v for section in metrics.values() if isinstance(section, dict) for v in section.values()]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in leaves)
    assert (out / "slo_by_policy_envelope.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_reads_verdicts_first_and_never_overclaims(clear_winner, tmp_path):
    analyze_runs(clear_winner, tmp_path)
    report = (tmp_path / "report.md").read_text()
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections == ["## Verdicts", "## Policies: regime bursty", "## Matched-random envelope per seed"]
    assert "- runs table: <DataFrame>" in report and "runs table: `<DataFrame>`" not in report
    assert "- seeds (6): 0, 1, 2, 3, 4, 5" in report and "one Holm family" in report
    assert "](slo_by_policy_envelope.png)" in report
    assert "beats matched random**" not in report and "SLO improvement claimed" not in report
    assert "| bursty | wa_diloco | **stress harness only** | a stress-harness result only; no serving claim |" in report


def test_bad_input_writes_nothing(clear_winner, tmp_path):
    out = tmp_path / "reports"
    with pytest.raises(RunsTableError, match="slo_violation_rate"):
        analyze_runs(clear_winner.drop(columns="slo_violation_rate"), out)
    assert not out.exists()


def test_a_failing_write_leaves_no_partial_files(clear_winner, tmp_path, monkeypatch):
    def broken_png(figure, path):
        raise OSError("disk full")

    monkeypatch.setattr(analyze, "write_png", broken_png)
    out = tmp_path / "reports"
    with pytest.raises(OSError, match="disk full"):
        analyze_runs(clear_winner, out)
    assert not out.exists()

    out.mkdir()
    (out / "report.md").write_text("previous report\n")
    with pytest.raises(OSError):
        analyze_runs(clear_winner, out)
    assert [p.name for p in out.iterdir()] == ["report.md"]
    assert (out / "report.md").read_text() == "previous report\n"


def test_synthetic_runs_known_effects(mechanism, fidelity, tmp_path):
    frame = synthetic_runs(regimes=("bursty",), n_seeds=6, n_draws=5, noise=0.002,
                           effects={"fixed_h": 0.01, "wa_calibrated": -0.03})
    table = analyze_runs(frame, tmp_path, mechanism("bursty"), fidelity=fidelity("bursty", policies=("wa_calibrated",)),
                         primary=("wa_calibrated", "bursty")).policy_table.set_index("policy")
    assert table.loc["wa_calibrated", "tier"] == "beats matched random"
    assert table.loc["fixed_h", "tier"] == "mechanism transfers"
    assert table.loc["no_sync", "tier"] == "reference"
    assert set(table.index) == {"fixed_h", "wa_calibrated", "no_sync"}
