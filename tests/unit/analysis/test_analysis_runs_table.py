"""Runs-table validation: bad input fails loudly, naming the file and column."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from syncsafe.analysis.runs_table import RunsTableError, load_runs_table


@pytest.fixture
def good(build_runs) -> pd.DataFrame:
    return build_runs(
        no_sync=[0.1, 0.2],
        policies={"wa_diloco": [0.12, 0.22]},
        draws={"wa_diloco": [[0.13, 0.14], [0.23, 0.25]]},
    )


def write_csv(frame: pd.DataFrame, tmp_path, name: str = "runs.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def assert_error(frame_or_path, *fragments: str) -> None:
    with pytest.raises(RunsTableError) as caught:
        load_runs_table(frame_or_path)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_valid_csv_and_parquet_load_with_normalised_types(good, tmp_path):
    from_csv = load_runs_table(write_csv(good, tmp_path))
    good.to_parquet(tmp_path / "runs.parquet", index=False)
    from_parquet = load_runs_table(tmp_path / "runs.parquet")
    for table in (from_csv, from_parquet):
        assert table.regimes == ["bursty"]
        assert table.frame["seed"].dtype == "int64"
        assert str(table.frame["draw"].dtype) == "Int64"
        assert table.frame.loc[table.frame["policy"] != "matched_random", "draw"].isna().all()


def test_missing_column_names_file_and_column(good, tmp_path):
    path = write_csv(good.drop(columns="slo_violation_rate"), tmp_path)
    assert_error(path, str(path), "slo_violation_rate", "missing required column")


def test_empty_table(good, tmp_path):
    path = write_csv(good.iloc[:0], tmp_path)
    assert_error(path, str(path), "empty")


@pytest.mark.parametrize("rate", [1.2, -0.01, "high"])
def test_rate_outside_unit_interval(good, rate):
    bad = good.astype({"slo_violation_rate": object})
    bad.loc[2, "slo_violation_rate"] = rate
    assert_error(bad, "<DataFrame>", "slo_violation_rate", "row(s) [2]")


@pytest.mark.parametrize("seed", [1.5, "one", None])
def test_non_integer_seed(good, seed):
    bad = good.astype({"seed": object})
    bad.loc[0, "seed"] = seed
    assert_error(bad, "'seed'", "integer")


def test_missing_no_sync_for_a_seed(good, tmp_path):
    path = write_csv(good[~((good["policy"] == "no_sync") & (good["seed"] == 1))], tmp_path)
    assert_error(path, str(path), "no 'no_sync' row", "('bursty', '1')")


def test_controller_without_matched_random_draws(good, build_runs):
    extra = build_runs(no_sync=[0.1, 0.2], policies={"pressure_gate": [0.1, 0.2]}, draws={}).query("policy != 'no_sync'")
    assert_error(pd.concat([good, extra]), "without matched-random draws", "pressure_gate")


def test_draw_matched_to_an_unknown_controller(good):
    bad = good.copy()
    bad.loc[bad["policy"] == "matched_random", "matched_to"] = "wa_ghost"
    assert_error(bad, "matched_to", "wa_ghost")


def test_draw_rules(good):
    on_controller = good.copy()
    on_controller.loc[on_controller["policy"] == "wa_diloco", "draw"] = 3
    assert_error(on_controller, "'draw'", "except on matched_random")
    missing = good.copy()
    missing.loc[missing["policy"] == "matched_random", "draw"] = None
    assert_error(missing, "'draw'", "empty on matched_random")


def test_duplicate_runs_and_bad_backend(good):
    assert_error(pd.concat([good, good.iloc[[0]]]), "duplicate runs")
    bad = good.copy()
    bad.loc[0, "backend"] = "tgi"
    assert_error(bad, "'backend'", "tgi")
    assert_error(good.assign(source="nightly"), "'source'", "nightly")


def test_unreadable_or_unknown_files(tmp_path):
    assert_error(tmp_path / "absent.csv", "absent.csv", "not found")
    (tmp_path / "runs.xlsx").write_text("x")
    assert_error(tmp_path / "runs.xlsx", "unsupported")


def test_without_matched_to_draws_match_every_controller_of_the_seed(good):
    table = load_runs_table(
        pd.concat([good, good[good["policy"] == "wa_diloco"].assign(policy="fixed_h")]).drop(columns="matched_to")
    )
    draws = table.matched_rows()
    assert sorted(draws["matched_to"].unique()) == ["fixed_h", "wa_diloco"]
    assert len(draws) == 2 * (good["policy"] == "matched_random").sum()


def test_error_is_a_value_error():
    assert issubclass(RunsTableError, ValueError)
    assert re.search("missing", str(RunsTableError("f.csv", "missing x")))
