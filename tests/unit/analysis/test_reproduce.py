"""`syncsafe real-arm compare A B`: two recorded runs' real-arm outputs reproduce, or the command names what not."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence, RegimeFidelity
from syncsafe.analysis.reproduce import (
    compare_real_arms,
    load_outputs,
    render,
    seed_differences,
    t_interval,
)
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import ArtifactMalformed, ArtifactMissing
from syncsafe.artifacts.calibration import write_model
from syncsafe.artifacts.replay_sets import write_set_index
from syncsafe.artifacts.reports import CONTRACT_COLUMNS
from syncsafe.cli import app
from syncsafe.realarm.design import RealPlan, RegimePlan

REGIME = "bursty"
PRIMARY = "wa_diloco"
SEEDS = (0, 1, 2, 3)
DRAWS = 3


def _index_rows(slo_shift: float, p95_shift: float) -> list[dict]:
    """Per seed: no-sync, the primary, its span-matched draws and span cadence (fixed numbers per seed)."""
    rng = np.random.default_rng(7)
    rows = []

    def row(policy: str, seed: int, slo: float, p95: float, *, draw=None, matched_to=None, source="train",
            valid=True) -> dict:
        return {"regime": REGIME, "policy": policy, "seed": seed, "draw": draw, "backend": "vllm",
                "slo_violation_rate": slo, "p95_ms": p95, "p99_ms": p95 * 1.2, "n_requests": 400, "n_failed": 0,
                "path": f"runs/replay-sets/vllm/{REGIME}/seed-{seed}/{policy}-{draw}", "matched_to": matched_to,
                "source": source, "n_merges": 4, "schedule": "s.json", "ttft_p95_ms": 50.0,
                "sync_ratio_unpaired": 1.2, "pressure_ratio": 1.1, "requests_during_merges": 40,
                "tokens_per_s": 100.0, "goodput_rps": 3.0, "valid": valid}

    for seed in SEEDS:
        rows.append(row("no_sync", seed, 0.02, 800.0, source="no_sync"))
        draws = 0.10 + rng.uniform(-0.01, 0.01, DRAWS)
        rows.append(row(PRIMARY, seed, 0.06 + rng.uniform(-0.01, 0.01) + slo_shift,
                        1000.0 + rng.uniform(-20, 20) + p95_shift))
        rows += [row("matched_random", seed, float(v), 1200.0 + 10 * d, draw=d, matched_to=PRIMARY,
                     source="matched_random") for d, v in enumerate(draws)]
        rows.append(row("even_cadence", seed, 0.09, 1150.0, matched_to=PRIMARY, source="even_cadence"))
    return rows


def write_run(root: Path, *, time_scale: float = 2.0, fit_seeds: tuple[int, ...] = (0, 1),
              tiers: dict[str, str] | None = None, gate: tuple[float, float, float] = (1.30, 1.20, 1.40),
              p95_error: float = 0.10, slo_shift: float = 0.0, p95_shift: float = 0.0,
              sync_ratio: tuple[float, ...] = (1.05,)) -> Path:
    """One recorded run's real-arm outputs under `root`, written with the project's models and writers."""
    plan = RealPlan(regimes={REGIME: RegimePlan(
        regime=REGIME, time_scale=time_scale, span_s=120.0, fit_seeds=list(fit_seeds),
        held_out_seeds=[s for s in SEEDS if s not in fit_seeds], controllers=[PRIMARY, "fixed_h"], draws=DRAWS,
        controls=2, expected_wall_s=600.0)})
    write_model(layout.at(root, layout.VLLM_PLAN), plan)
    ratio, low, high = gate
    write_model(layout.at(root, layout.MECHANISM), MechanismEvidence(regimes={REGIME: {
        "sync_ratio_paired": ratio, "drift_ratio": 1.0, "gate_ratio": ratio, "gate_ratio_ci_low": low,
        "gate_ratio_ci_high": high, "seeds": list(SEEDS)}}))
    write_model(layout.at(root, layout.FIDELITY_EVIDENCE), FidelityEvidence(
        calibration="fitted", fit_seeds=list(fit_seeds), held_out_seeds=[2, 3], n_held_out_replays=8,
        regimes={REGIME: RegimeFidelity(n_held_out_replays=8, p95_rel_error_max=p95_error, slo_abs_error_pp_max=1.0,
                                        sync_ratio_paired_sim_over_real=sync_ratio[0],
                                        bounds={"sync_ratio_paired_sim_over_real": sync_ratio[1:]}
                                        if len(sync_ratio) == 3 else {})}))
    tiers = tiers or {PRIMARY: "beats matched random", "fixed_h": "mechanism transfers", "no_sync": "reference"}
    table = pd.DataFrame([{c: None for c in CONTRACT_COLUMNS} | {"regime": REGIME, "policy": p, "tier": t}
                          for p, t in tiers.items()])
    path = layout.at(root, layout.report_rel(layout.POLICY_TABLE_FILE))
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    write_set_index(layout.at(root, layout.VLLM_INDEX), _index_rows(slo_shift, p95_shift))
    return root


@pytest.fixture
def runs(tmp_path):
    def make(a: dict | None = None, b: dict | None = None) -> tuple[Path, Path]:
        return write_run(tmp_path / "a", **(a or {})), write_run(tmp_path / "b", **(b or {}))

    return make


def invoke(a: Path, b: Path, *extra: str):
    return CliRunner().invoke(app, ["real-arm", "compare", str(a), str(b), *extra])


def test_identical_runs_reproduce(runs):
    a, b = runs()
    result = compare_real_arms(a, b)
    assert result.reproduces and result.failures == []
    assert result.regimes == [REGIME] and result.n_tiers == 3
    assert len(result.gates) == 1 and len(result.fidelity) == 3 and len(result.real_vs_random) == 2
    slo = result.real_vs_random[0]
    assert slo.a.n == len(SEEDS) and slo.a.value == pytest.approx(slo.b.value) and slo.a.value < 0
    out = invoke(a, b)
    assert out.exit_code == 0, out.output
    assert "reproduces" in out.stdout and "not reproduced" not in out.output
    assert f"{PRIMARY} - matched random SLO violation rate" in out.stdout


def test_a_time_scale_off_by_20_percent_fails_plans(runs):
    a, b = runs(b={"time_scale": 2.4})
    out = invoke(a, b)
    assert out.exit_code == 1
    failures = [line for line in out.stderr.splitlines() if line.startswith("not reproduced:")]
    assert len(failures) == 1 and "plans:" in failures[0] and f"{REGIME} time_scale" in failures[0]
    assert "20.0%" in failures[0]
    # within the tolerance: the same plan
    a, b = runs(b={"time_scale": 2.1})
    assert invoke(a, b).exit_code == 0
    assert invoke(a, b, "--time-scale-tolerance", "0.01").exit_code == 1


def test_other_seeds_fail_plans_naming_the_field(runs):
    a, b = runs(b={"fit_seeds": (0, 2)})
    failures = compare_real_arms(a, b).failures
    assert any(f.startswith("plans:") and "fit_seeds" in f for f in failures)
    assert any(f.startswith("plans:") and "held_out_seeds" in f for f in failures)


def test_a_changed_tier_fails_tiers(runs):
    a, b = runs(b={"tiers": {PRIMARY: "mechanism transfers", "fixed_h": "mechanism transfers", "no_sync": "reference"}})
    out = invoke(a, b)
    assert out.exit_code == 1
    assert (f"not reproduced: tiers: {REGIME}/{PRIMARY}: A 'beats matched random', B 'mechanism transfers'"
            in out.stderr)
    a, b = runs(b={"tiers": {PRIMARY: "beats matched random", "no_sync": "reference"}})
    assert any("fixed_h only in A" in f for f in compare_real_arms(a, b).failures)


def test_a_gate_ratio_outside_the_other_s_interval_fails(runs):
    a, b = runs(b={"gate": (1.60, 1.50, 1.70)})
    out = invoke(a, b)
    assert out.exit_code == 1
    gate = [line for line in out.stderr.splitlines() if "gate:" in line]
    assert len(gate) == 1 and "A 1.3 outside B's [1.5, 1.7]" in gate[0] and "B 1.6 outside A's" in gate[0]
    # inside both ways: reproduces
    a, b = runs(b={"gate": (1.35, 1.22, 1.45)})
    assert compare_real_arms(a, b).reproduces


def test_a_fidelity_target_met_in_one_run_only_fails(runs):
    a, b = runs(b={"p95_error": 0.20})
    failures = compare_real_arms(a, b).failures
    assert failures == [f"fidelity: {REGIME} held-out p95 error meets its target <= 15% in A, misses it in B"]
    a, b = runs(a={"p95_error": 0.20}, b={"p95_error": 0.30})  # both miss: the same conclusion
    result = compare_real_arms(a, b)
    assert result.reproduces and any("missed" in line for line in render(result))


@pytest.mark.parametrize(("a", "b", "reproduces", "outcomes"), [
    ((0.665, 0.43, 1.03), (0.844, 0.54, 1.31), True, ("undecided", "undecided")),
    # met in one (whole range inside [0.8, 1.25]), undecided in the other, each inside the other's bounds
    ((1.0, 0.85, 1.2), (1.1, 0.9, 1.3), True, ("met", "undecided")),
    # different outcomes, B's value outside A's bounds
    ((1.0, 0.85, 1.2), (1.4, 1.15, 1.7), False, ("met", "undecided")),
    # met against missed contradicts, even with overlapping bounds
    ((1.0, 0.81, 1.24), (1.3, 1.26, 1.5), False, ("met", "missed")),
    # a bare point against a bounded figure: their outcomes must agree
    ((0.9,), (0.85, 0.6, 1.1), False, ("met", "undecided")),
])
def test_fidelity_outcomes_reproduce_within_each_other_s_wander_bounds(runs, a, b, reproduces, outcomes):
    first, second = runs(a={"sync_ratio": a}, b={"sync_ratio": b})
    result = compare_real_arms(first, second)
    ratio = next(m for m in result.fidelity if m.metric == "paired sync ratio sim/real")
    assert (ratio.outcome_a, ratio.outcome_b) == outcomes
    assert ratio.ok is reproduces and result.reproduces is reproduces
    if not reproduces:
        assert result.failures == [ratio.failure()] and ratio.failure().startswith(f"fidelity: {REGIME} paired")


def test_a_different_controller_minus_random_fails(runs):
    a, b = runs(b={"slo_shift": 0.05, "p95_shift": 150.0})
    failures = compare_real_arms(a, b).failures
    assert len(failures) == 2 and all(f.startswith(f"real vs random: {REGIME} {PRIMARY}") for f in failures)
    assert "SLO violation rate" in failures[0] and "p95" in failures[1]


def test_a_missing_file_exits_2_naming_it(runs):
    a, b = runs()
    missing = layout.at(b, layout.MECHANISM)
    missing.unlink()
    out = invoke(a, b)
    assert out.exit_code == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and lines[0].startswith("error:")
    with pytest.raises(ArtifactMissing, match="mechanism"):
        load_outputs(b)


def test_a_malformed_file_exits_2_naming_it(runs):
    a, b = runs()
    plan = layout.at(a, layout.VLLM_PLAN)
    plan.write_text('{"regimes": {"bursty": {"regime": "bursty"}}}')
    out = invoke(a, b)
    assert out.exit_code == 2 and str(plan) in out.stderr and "real-arm plan" in out.stderr
    write_run(a)
    index = layout.at(a, layout.VLLM_INDEX)
    pd.read_csv(index).drop(columns=["matched_to"]).to_csv(index, index=False)
    with pytest.raises(ArtifactMalformed, match="matched_to"):
        load_outputs(a)


def test_controller_minus_random_uses_valid_replays_and_a_t_interval(runs):
    a, _ = runs()
    frame = load_outputs(a).index
    diffs = seed_differences(frame, REGIME, PRIMARY, "slo_violation_rate")
    assert diffs.shape == (len(SEEDS),) and (diffs < 0).all()
    frame.loc[(frame["seed"] == 0) & (frame["policy"] == PRIMARY), "valid"] = False
    assert seed_differences(frame, REGIME, PRIMARY, "slo_violation_rate").shape == (len(SEEDS) - 1,)
    one = t_interval(np.array([1.0]))
    assert one.value == 1.0 and one.low == -np.inf and one.high == np.inf and one.contains(50.0)
    same = t_interval(np.array([2.0, 2.0, 2.0]))
    assert (same.low, same.high) == (2.0, 2.0)
    wide = t_interval(np.array([1.0, 2.0, 3.0]))
    assert wide.low < 2.0 < wide.high and wide.high - 2.0 == pytest.approx(2.0 - wide.low)
    assert t_interval(np.array([])).value is None


def test_real_arm_without_a_subcommand_shows_help():
    out = CliRunner().invoke(app, ["real-arm"])
    assert "compare" in out.output


def test_a_recorded_run_is_a_reference_a_new_run_is_compared_with(runs, tmp_path):
    a, b = runs(b={"gate": (1.9, 1.8, 2.0)})
    (a / "params.yaml").write_text("seeds: [0]\n")
    record = tmp_path / "evidence" / "reference"
    out = CliRunner().invoke(app, ["real-arm", "record", str(a), str(record), "--profile", "powered"])
    assert out.exit_code == 0, out.output
    provenance = json.loads((record / "provenance.json").read_text())
    assert provenance["profile"] == "powered" and provenance["machine"]["cpus"] >= 1
    assert set(provenance["files"]) >= {"params.yaml", "runs/replay-sets/vllm/plan.json", "reports/policy_table.csv"}
    assert not (record / "runs" / "replay-sets" / "vllm" / "blocks.json").exists(), "what the run lacks is not made up"
    assert compare_real_arms(a, record).reproduces, "the record holds what compare reads"
    assert invoke(a, record).exit_code == 0
    assert invoke(b, record).exit_code == 1, "a run whose gate left the recorded bounds does not reproduce"
    layout.at(b, layout.MECHANISM).unlink()
    bad = CliRunner().invoke(app, ["real-arm", "record", str(b), str(record)])
    assert bad.exit_code == 2 and "mechanism" in bad.stderr
    assert compare_real_arms(a, record).reproduces, "a failed record leaves the previous one whole"
