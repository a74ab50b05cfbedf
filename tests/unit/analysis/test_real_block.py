"""The real-only block: real vLLM replays judged on their own, in the verdict table's one family."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.analysis import analyze_runs
from syncsafe.analysis.multiplicity import gatekept_adjusted, holm_adjusted
from syncsafe.analysis.protocol import ProtocolError, run_protocol, smallest_rank_p, smallest_sign_p
from syncsafe.analysis.stage import real_block_runs, valid_mask
from syncsafe.analysis.runs_table import load_runs_table
from syncsafe.analysis.stats import rank_test, sign_test
from syncsafe.analysis.verdicts import assign_tiers, assign_verdict
from verdict_rows import winner_row

PRIMARY = ("wa_diloco", "bursty")
RANK, CADENCE = "matched random", "fixed cadence"
runs_frame = None  # set per test from the build_runs fixture


@pytest.fixture(autouse=True)
def _builder(build_runs):
    """The analysis conftest's runs-table builder, for the helpers below."""
    global runs_frame
    runs_frame = build_runs


def simulator_table(n_seeds: int = 8) -> pd.DataFrame:
    """wa_diloco wins every seed against 3 draws and its even cadence; fixed_h ties its own; equal losses."""
    base = [0.01 * (1 + s % 4) for s in range(n_seeds)]
    return runs_frame(
        no_sync=base,
        policies={"wa_diloco": [b + 0.01 for b in base], "fixed_h": [b + 0.05 for b in base]},
        draws={"wa_diloco": [[b + 0.04, b + 0.05, b + 0.06] for b in base],
               "fixed_h": [[b + 0.04, b + 0.05, b + 0.06] for b in base]},
        references={"even_cadence": {"wa_diloco": [b + 0.04 for b in base], "fixed_h": [b + 0.05 for b in base]}},
        losses={"wa_diloco": [3.0] * n_seeds, "fixed_h": [3.0] * n_seeds},
    )


def real_table(n_seeds: int = 8, draws: int = 2, *, controller: float = 0.02, even: float = 0.05) -> pd.DataFrame:
    """The real arm: no-sync at 10 %, wa_diloco `controller` above it, its draws 4..(3+draws) pp, its span
    cadence `even` above (no eval loss: it comes from the runs table's training runs)."""
    return runs_frame(
        no_sync=[0.10] * n_seeds,
        policies={"wa_diloco": [0.10 + controller] * n_seeds},
        draws={"wa_diloco": [[0.10 + 0.04 + 0.01 * d for d in range(draws)] for _ in range(n_seeds)]},
        references={"even_cadence": {"wa_diloco": [0.10 + even] * n_seeds}},
        backend="vllm",
    )


def both(sim: pd.DataFrame | None = None, real: pd.DataFrame | None = None, **kw):
    return run_protocol(load_runs_table(simulator_table() if sim is None else sim), primary=PRIMARY,
                        real=load_runs_table(real_table() if real is None else real), block="simulator", **kw)


def test_real_rows_go_through_the_same_tests_in_the_same_holm_family():
    result = both()
    policies = result.policies
    real = policies[policies["block"] == "vllm"]
    assert list(zip(real["regime"], real["policy"])) == [("bursty", "no_sync"), ("bursty", "wa_diloco")]
    assert set(real["backend"]) == {"vllm"} and set(policies.loc[policies["block"] != "vllm", "block"]) == {"simulator"}
    row = real.set_index("policy").loc["wa_diloco"]
    # scored on the real replays alone: +2 pp over the real no-sync, draws +4/+5 pp, cadence +5 pp
    assert row["sync_excess_pct_mean"] == pytest.approx(2.0) and row["mr_sync_excess_pct_mean"] == pytest.approx(4.5)
    assert row["p_rank"] == pytest.approx(rank_test([2.0] * 8, [[4.0, 5.0]] * 8).p_value) == pytest.approx(3.0 ** -8)
    assert row["p_vs_fixed_cadence"] == pytest.approx(sign_test([2.0] * 8, [5.0] * 8).p_value) == pytest.approx(2.0 ** -8)
    assert not row["primary"] and policies.set_index(["block", "policy"]).loc[("simulator", "wa_diloco"), "primary"]
    # one family: 2 tests for each of the 3 controller rows (wa_diloco and fixed_h simulated, wa_diloco real)
    assert len(result.family) == 6
    assert (RANK, "wa_diloco", "bursty", "vllm") in result.family and (CADENCE, "wa_diloco", "bursty", "vllm") in result.family
    gate = (RANK, *PRIMARY)
    others = holm_adjusted({k: p for k, p in result.family.items() if k != gate})
    assert row["p_adjusted"] == pytest.approx(max(result.family[gate], others[(RANK, "wa_diloco", "bursty", "vllm")]))
    expected = gatekept_adjusted(result.family, gate)
    assert row["p_vs_fixed_cadence_adjusted"] == pytest.approx(expected[(CADENCE, "wa_diloco", "bursty", "vllm")])
    # the real block enlarges the family the simulator rows are adjusted in
    alone = run_protocol(load_runs_table(simulator_table()), primary=PRIMARY).policies.set_index("policy")
    sim = policies[policies["block"] == "simulator"].set_index("policy")
    assert sim.loc["wa_diloco", "p_vs_fixed_cadence_adjusted"] > alone.loc["wa_diloco", "p_vs_fixed_cadence_adjusted"]
    assert sim.loc["wa_diloco", "p_vs_fixed_cadence_adjusted"] == pytest.approx(expected[(CADENCE, *PRIMARY)])


def test_the_declared_primary_falls_back_to_its_real_row_only_when_the_runs_table_lacks_it():
    sim = simulator_table()
    sim = sim[~((sim["policy"] == "wa_diloco") | (sim["matched_to"] == "wa_diloco"))]
    result = both(sim=sim)
    row = result.policies.set_index(["block", "policy"]).loc[("vllm", "wa_diloco")]
    assert row["primary"] and row["p_adjusted"] == pytest.approx(row["p_rank"])


def test_real_rows_need_the_mechanism_gate_not_the_simulator_licence(mechanism):
    policies = assign_tiers(both().policies, mechanism("bursty"))  # no fidelity evidence
    tiers = policies.set_index(["block", "policy"])
    assert tiers.loc[("simulator", "wa_diloco"), "tier"] == "mechanism transfers"
    real = tiers.loc[("vllm", "wa_diloco")]
    assert real["calibration"] == "n/a"
    assert real["training"] == "non-inferior"  # the training runs' losses, from the runs table
    assert real["tier"] == "beats matched random", real["reason"]
    assert "runs on vllm (real replays judged on their own)" in real["reason"]
    assert "gap closed n/a: no SLO oracle replay behind it (the oracle is a simulator search" in real["reason"]
    assert np.isnan(real["gap_closed_mean"]) and real["gap_closed_seeds"] == "0/0"
    without_gate = assign_tiers(both().policies, mechanism("steady")).set_index(["block", "policy"])
    assert without_gate.loc[("vllm", "wa_diloco"), "tier"] == "stress harness only"


def test_a_real_row_that_loses_is_not_claimed(mechanism):
    losing = real_table(controller=0.06, even=0.03)  # worse than its draws and its cadence on every seed
    row = assign_tiers(both(real=losing).policies, mechanism("bursty")).set_index(["block", "policy"]).loc[
        ("vllm", "wa_diloco")]
    assert row["tier"] == "mechanism transfers" and row["p_rank"] == pytest.approx(1.0) and "underpowered" not in row["reason"]


def test_the_real_block_holds_real_replays_only():
    mixed = real_table()
    mixed.loc[mixed["policy"] == "matched_random", "backend"] = "simulator"
    with pytest.raises(ProtocolError, match="never mixed"):
        both(real=mixed)
    with pytest.raises(ValueError, match="real-only block's label"):
        run_protocol(load_runs_table(simulator_table()), block="vllm")


@pytest.mark.parametrize("seeds, draws", [(2, 2), (4, 2), (2, 3), (3, 2), (8, 1), (5, 1)])
def test_the_power_statement_appears_exactly_when_the_design_cannot_reach_alpha(mechanism, seeds, draws):
    alpha = 0.05
    floor = (draws + 1.0) ** -seeds
    row = both(real=real_table(seeds, draws)).policies.set_index(["block", "policy"]).loc[("vllm", "wa_diloco")]
    assert row["p_rank_min"] == pytest.approx(floor)
    assert row["p_rank"] == pytest.approx(floor)  # it won every seed: the floor is what the test returns
    assert row["p_vs_fixed_cadence_min"] == pytest.approx(2.0 ** -seeds)
    reason = assign_verdict(row.to_dict() | {"regime": "bursty", "policy": "wa_diloco"}, mechanism("bursty"),
                            alpha=alpha).reason
    statement = f"rank test underpowered: smallest achievable p {floor:.3g} > alpha {alpha:g}"
    assert (statement in reason) == (floor > alpha), reason
    assert ("cadence test underpowered" in reason) == (2.0 ** -seeds > alpha)


def test_the_smallest_p_is_the_tests_own_minimum_with_the_draws_each_seed_kept():
    # an invalid draw leaves one seed with 1 draw: the floor is 1/3 * 1/2, not (2 + 1)^-2
    assert smallest_rank_p([2, 1]) == pytest.approx(1 / 6)
    assert smallest_rank_p([2, 0, 2]) == pytest.approx(1 / 9)  # a seed without draws is not in the test
    assert smallest_rank_p([]) == 1.0 and smallest_sign_p(0) == 1.0 and smallest_sign_p(3) == pytest.approx(1 / 8)
    real = real_table(2, 2)
    real = real[~((real["policy"] == "matched_random") & (real["seed"] == 1) & (real["draw"] == 1))]
    row = both(real=real).policies.set_index(["block", "policy"]).loc[("vllm", "wa_diloco")]
    assert row["p_rank_min"] == pytest.approx(1 / 6) == pytest.approx(row["p_rank"])
    # no tie lowers the floor: a tie with a draw can only raise the p
    assert rank_test([1.0, 1.0], [[1.0, 2.0], [3.0]]).p_value > smallest_rank_p([2, 1])


def test_a_row_without_the_power_columns_states_nothing(mechanism):
    assert "underpowered" not in assign_verdict(winner_row(backend="vllm"), mechanism("bursty")).reason
    weak = assign_verdict(winner_row(backend="vllm", p_rank_min=0.11, n_draws=4, n_seeds_rank=2), mechanism("bursty"))
    assert "rank test underpowered: smallest achievable p 0.11 > alpha 0.05 (4 draws over 2 seeds)" in weak.reason


def index_rows(seed: int, *, valid=None, backend: str = "vllm", no_sync_valid=True) -> list[dict]:
    valid = valid or {}
    rows = [dict(policy="no_sync", source="no_sync", rate=0.10, valid=no_sync_valid),
            dict(policy="wa_diloco", source="harness", rate=0.12),
            dict(policy="fixed_h", source="harness", rate=0.15),
            dict(policy="even_cadence", source="even_cadence", matched_to="wa_diloco", rate=0.15),
            *(dict(policy="matched_random", source="matched_random", matched_to="wa_diloco", draw=d, rate=0.14 + d / 100)
              for d in range(2)),
            dict(policy="matched_random", source="matched_random", matched_to="fixed_h", draw=0, rate=0.16)]
    out = []
    for r in rows:
        name = r["policy"] + (f"-{r['draw']}" if "draw" in r else "")
        out.append({"regime": "bursty", "seed": seed, "backend": backend, "slo_violation_rate": r.pop("rate"),
                    "valid": valid.get(name, True), **r})
    return out


def test_an_invalid_real_replay_is_left_out():
    index = pd.DataFrame([*index_rows(0, valid={"matched_random-1": "False"}), *index_rows(1, no_sync_valid=False),
                          *index_rows(2), *index_rows(0, backend="simulator"), *index_rows(3, valid={"wa_diloco": 0})])
    index = index.astype({"draw": "Int64"})
    assert valid_mask(index).sum() == len(index) - 3
    selection = real_block_runs(index, {"bursty": [0, 1, 2, 3, 4]}, ["wa_diloco"], index.columns)
    runs = selection.runs
    assert set(runs["backend"]) == {"vllm"} and sorted(runs["seed"].unique()) == [0, 2]
    assert "fixed_h" not in set(runs["policy"]) and set(runs["matched_to"].dropna()) == {"wa_diloco"}
    assert runs.loc[(runs["seed"] == 0) & (runs["policy"] == "matched_random"), "draw"].tolist() == [0]
    assert runs.groupby("seed").size().to_dict() == {0: 4, 2: 5}
    notes = "\n".join(selection.notes)
    assert "bursty seed 0: 1 invalid real replay(s) left out (matched_random[wa_diloco] draw 1)" in notes
    assert "bursty seed 1: no valid no-sync control" in notes
    assert "bursty seed 3: no valid replay of wa_diloco: left out" in notes
    assert "bursty seed 4: no real replay" in notes
    policies = run_protocol(load_runs_table(simulator_table()), primary=PRIMARY, real=load_runs_table(runs)).policies
    row = policies.set_index(["block", "policy"]).loc[("vllm", "wa_diloco")]
    assert row["n_seeds"] == 2 and row["n_draws"] == 3 and row["p_rank_min"] == pytest.approx(1 / 6)


def test_the_report_and_table_show_the_real_block_on_its_own(mechanism, tmp_path):
    out = analyze_runs(simulator_table(), tmp_path / "r", mechanism("bursty"), primary=PRIMARY, block="simulator",
                       real_runs=real_table(2, 2), real_notes=["bursty seed 5: no valid no-sync control"])
    table = pd.read_csv(tmp_path / "r" / "policy_table.csv")
    assert list(table["block"]) == ["simulator"] * 3 + ["vllm"] * 2  # the real block's rows last
    assert list(table.columns).index("block") == 14 and table.columns[15] == "reason"
    report = out.report
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections == ["## Verdicts", "## Policies: regime bursty", "## Real replays judged on their own (vLLM)",
                        "## Matched-random envelope per seed"]
    assert "| bursty | wa_diloco (real replays only, vllm) | **mechanism transfers** |" in report
    assert "rank test underpowered: smallest achievable p 0.111 > alpha 0.05" in report
    assert "- bursty seed 5: no valid no-sync control" in report
    assert "the real-only block's 2 tests included" in report
    assert out.metrics["real_only"]["bursty"]["wa_diloco"]["p_rank_min"] == pytest.approx(1 / 9)
    assert out.metrics["bursty"]["top_tier_rank"] == 2 and len(out.envelope) == 16  # simulator rows only
    assert len(out.real_seeds[out.real_seeds["policy"] == "wa_diloco"]) == 2
