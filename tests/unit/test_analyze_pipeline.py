"""The analyze stage in pipeline mode: simulator replays + mechanism evidence → reports/."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml



def _pipeline(root, params_file, cli):
    common = ["--params", str(params_file), "--root", str(root)]
    cli("traces", "--regime", "bursty", *common)
    cli("schedules", "build", "--regime", "bursty", *common)
    cli("schedules", "index", *common)
    cli("replay", "run", "--backend", "simulator", "--regime", "bursty", *common)
    cli("replay", "index", "--root", str(root))


def test_without_mechanism_evidence_nothing_passes_the_harness_tier(tmp_path, params_file, raw_params, cli):
    root = tmp_path / "p"
    raw_params["regimes"] = {"bursty": raw_params["regimes"]["bursty"]}
    raw_params["replay"]["vllm"]["regimes"] = ["bursty"]
    params_file.write_text(yaml.safe_dump(raw_params))
    _pipeline(root, params_file, cli)
    out = cli("analyze", "--params", str(params_file), "--root", str(root))
    table = pd.read_csv(root / "reports" / "policy_table.csv")
    controllers = table[table["policy"] != "no_sync"]
    assert set(controllers["tier"]) == {"stress harness only"}
    assert set(table["policy"]) == {"no_sync", *raw_params["control"]["policies"]}
    assert table.loc[controllers.index, "gap_closed_mean"].notna().all()  # every controller has a gap to close
    assert (table.loc[controllers.index, "calibration"] != "n/a").all()
    assert "stress harness only" in out
    report = (root / "reports" / "report.md").read_text()
    assert "## Real replays (vLLM)" in report and "No vLLM replays" in report
    assert "- runs table: simulator replays of runs/replay/index.csv" in report
    assert "figures/bursty_timeline_bursts_vs_merges.png" in report
    assert (root / "reports" / "figures" / "bursty_timeline_bursts_vs_merges.png").stat().st_size > 10_000
    metrics = json.loads((root / "reports" / "metrics.json").read_text())
    assert set(metrics) >= {"alpha", "bursty"} and metrics["bursty"]["top_tier_rank"] == 1
    # every controller got an SLO oracle replay, never worse than the best of its draws
    index = pd.read_csv(root / "runs" / "replay" / "index.csv")
    oracle = index[index["policy"] == "slo_oracle"].set_index(["seed", "matched_to"])["slo_violation_rate"]
    draws = index[index["policy"] == "matched_random"].groupby(["seed", "matched_to"])["slo_violation_rate"].min()
    assert len(oracle) == len(draws) > 0 and (oracle <= draws.loc[oracle.index] + 1e-12).all()


def test_mechanism_evidence_lifts_the_ceiling(tmp_path, params_file, raw_params, cli):
    root = tmp_path / "p"
    raw_params["regimes"] = {"bursty": raw_params["regimes"]["bursty"]}
    raw_params["replay"]["vllm"]["regimes"] = ["bursty"]
    params_file.write_text(yaml.safe_dump(raw_params))
    _pipeline(root, params_file, cli)
    mechanism = root / "runs" / "calibration" / "mechanism.json"
    mechanism.parent.mkdir(parents=True)
    mechanism.write_text(json.dumps({"regimes": {"bursty": {
        "sync_ratio_paired": 1.6, "drift_ratio": 1.0, "gate_ratio": 1.6, "gate_ratio_ci_low": 1.4}}}))
    cli("analyze", "--params", str(params_file), "--root", str(root))
    table = pd.read_csv(root / "reports" / "policy_table.csv").set_index("policy")
    # mechanism shown, but no fidelity evidence for the simulator: nothing above mechanism transfers
    assert set(table.drop(index="no_sync")["tier"]) == {"mechanism transfers"}
    report = (root / "reports" / "report.md").read_text()
    assert "paired sync ratio 1.6" in report and "no fidelity evidence" in report


def _real_index(root):
    """A vLLM replay set beside the simulator's: per seed the no-sync control, wa_diloco (the primary), two
    span-matched draws and its span cadence, and fixed_h with a draw (not in the real-only block: it holds the
    primary only); seed 1's second draw invalid; SLO rates of their own."""
    from syncsafe.artifacts.replay_sets import EXTRA_COLUMNS, INDEX_COLUMNS, write_set_index

    sim = pd.read_csv(root / "runs" / "replay" / "index.csv", dtype={"draw": "Int64"})
    sim = sim[(sim["regime"] == "bursty") & (sim["seed"].isin([0, 1]))]
    keep = ((sim["policy"].isin(["no_sync", "wa_diloco", "fixed_h"]))
            | ((sim["policy"] == "matched_random") & (sim["draw"] < 2))
            | ((sim["policy"] == "even_cadence") & (sim["matched_to"] == "wa_diloco")))
    real = sim[keep & (sim["matched_to"].isna() | sim["matched_to"].isin(["wa_diloco", "fixed_h"]))].copy()
    real = real[~((real["matched_to"] == "fixed_h") & (real["draw"] != 0))]
    real["backend"] = "vllm"
    real["slo_violation_rate"] = (0.5 * real["slo_violation_rate"] + 0.1).clip(upper=1.0)  # not the simulator's
    real["valid"] = True
    real.loc[(real["seed"] == 1) & (real["policy"] == "matched_random") & (real["matched_to"] == "wa_diloco")
             & (real["draw"] == 1), "valid"] = False
    real["path"] = [f"runs/replay-sets/vllm/bursty/seed-{s}/{p}-{i}" for i, (s, p) in enumerate(zip(real["seed"], real["policy"]))]
    real["n_failed"] = 0
    rows = real.reindex(columns=[*INDEX_COLUMNS, *EXTRA_COLUMNS]).to_dict("records")
    write_set_index(root / "runs" / "replay-sets" / "vllm" / "index.csv", rows)
    return real


def test_real_replays_are_judged_on_their_own_beside_the_simulator(tmp_path, params_file, raw_params, cli):
    root = tmp_path / "p"
    raw_params["regimes"] = {"bursty": raw_params["regimes"]["bursty"]}
    raw_params["replay"]["vllm"]["regimes"] = ["bursty"]
    params_file.write_text(yaml.safe_dump(raw_params))
    _pipeline(root, params_file, cli)
    real = _real_index(root)
    cli("replay", "index", "--params", str(params_file), "--root", str(root))
    index = pd.read_csv(root / "runs" / "replay" / "index.csv")
    assert set(index["backend"]) == {"simulator", "vllm"}
    mechanism = root / "runs" / "calibration" / "mechanism.json"
    mechanism.parent.mkdir(parents=True)
    mechanism.write_text(json.dumps({"regimes": {"bursty": {
        "sync_ratio_paired": 1.6, "drift_ratio": 1.0, "gate_ratio": 1.6, "gate_ratio_ci_low": 1.4}}}))
    cli("analyze", "--params", str(params_file), "--root", str(root))
    table = pd.read_csv(root / "reports" / "policy_table.csv", keep_default_na=False, na_values=[""])
    sim, vllm = table[table["block"] == "simulator"], table[table["block"] == "vllm"]
    assert set(sim["policy"]) == {"no_sync", *raw_params["control"]["policies"]} and set(sim["backend"]) == {"simulator"}
    assert list(table["block"]) == ["simulator"] * len(sim) + ["vllm"] * 2  # its own block, last
    assert list(zip(vllm["regime"], vllm["policy"])) == [("bursty", "no_sync"), ("bursty", "wa_diloco")]
    row = vllm.set_index("policy").loc["wa_diloco"]
    assert row["backend"] == "vllm" and row["calibration"] == "n/a" and row["n_seeds"] == 2
    assert not bool(row["primary"])
    # seed 1's invalid draw is left out: 2 + 1 draws, smallest achievable rank p 1/3 * 1/2 > alpha
    assert row["n_draws"] == 3 and row["p_rank_min"] == pytest.approx(1 / 6)
    assert "rank test underpowered: smallest achievable p 0.167 > alpha 0.05" in row["reason"]
    assert "runs on vllm (real replays judged on their own)" in row["reason"]
    assert pd.isna(row["gap_closed_mean"]) and "no SLO oracle replay behind it" in row["reason"]
    assert row["tier"] == "mechanism transfers"  # the gate passes; no simulator licence needed, but no power
    # the real row is scored on the real replays: its SLO is the real index's, not the simulator's
    own = real[(real["policy"] == "wa_diloco")]["slo_violation_rate"].mean()
    assert row["slo_pct_mean"] == pytest.approx(100 * own)
    assert row["slo_pct_mean"] != pytest.approx(sim.set_index("policy").loc["wa_diloco", "slo_pct_mean"])
    # one family: two tests per controller row of both blocks
    n_controllers = int((table["policy"] != "no_sync").sum())
    report = (root / "reports" / "report.md").read_text()
    assert f"the other {2 * n_controllers - 1} tests judged" in report and "the real-only block's 2 tests" in report
    assert "## Real replays judged on their own (vLLM)" in report
    assert "wa_diloco (real replays only, vllm)" in report
    assert "bursty seed 1: 1 invalid real replay(s) left out (matched_random[wa_diloco] draw 1)" in report
    metrics = json.loads((root / "reports" / "metrics.json").read_text())
    assert metrics["real_only"]["bursty"]["wa_diloco"]["n_seeds"] == 2
