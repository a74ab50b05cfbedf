"""Tuning on load the judging never sees, the knob grid, and the online-bound split of the gap."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from syncsafe.analysis.headroom import headroom_section
from syncsafe.config import CONTROLLER_POLICIES, ConfigError, load_params, parse_params
from syncsafe.errors import BadInput
from syncsafe.traces.stage import seed_loads
from syncsafe.tuning.bench import SeedBench, gap_closed
from syncsafe.tuning.knobs import DEFAULT_GRIDS, current, grid, parse_knob, with_knobs
from syncsafe.tuning.search import BenchSettings, headroom, headroom_summary, tune, write_tuned
from syncsafe.tuning.segments import TuningSplit, default_tuning_seeds

GATE = ["control.pressure_gate.max_pressure=0.2,0.5,0.8"]


def test_synthetic_tuning_seeds_are_other_seeds_and_a_shared_seed_is_refused(params):
    split = TuningSplit.of(params, "bursty")
    assert split.judged == (0, 1) and split.tuning == (2, 3, 4, 5, 6)
    with pytest.raises(BadInput, match=r"tuning seeds \[1\] are judged seeds too"):
        TuningSplit.of(params, "bursty", tuning=[1, 7])


def test_trace_tuning_segments_share_no_trace_second_with_a_judged_one(params):
    """Neighbouring seeds of a trace regime overlap (stride 300 s < 600 s): a seed that is not judged can still
    hold judged load, and is refused naming both segments."""
    p = params.model_copy(update={"regimes": {**params.regimes, "azure_conv": params.regimes["azure_conv"].model_copy(
        update={"duration_s": 600.0})}})
    split = TuningSplit.of(p, "azure_conv")
    judged = [split.segments[s] for s in split.judged]
    assert split.tuning and 2 not in split.tuning  # seed 2 [600, 1200) s overlaps judged seed 1 [300, 900) s
    for seed in split.tuning:
        start, end = split.segments[seed]
        assert end <= 3501.7 and all(end <= a or b <= start for a, b in judged), seed
    with pytest.raises(BadInput, match=r"tuning seed 2 \[600, 1200\) s overlaps judged seed 1 \[300, 900\) s"):
        TuningSplit.of(p, "azure_conv", tuning=[2])


def test_judged_segments_that_cover_the_trace_leave_no_tuning_load_and_say_how_to_make_room(repo_root):
    params = load_params(repo_root / "params.yaml")  # 10 judged seeds cover [0, 3300) s of the 3,501 s trace
    params = params.model_copy(update={"regimes": {**params.regimes, "azure_conv": params.regimes["azure_conv"].model_copy(
        update={"path": str(repo_root / params.regimes["azure_conv"].path)})}})
    assert default_tuning_seeds(params, "azure_conv", list(params.seeds)) == []
    with pytest.raises(BadInput, match=r"cover \[0, 3300\) s of the 3502 s trace .* judge fewer seeds"):
        TuningSplit.of(params, "azure_conv")
    assert TuningSplit.of(params, "azure_conv", judged=[0, 1, 2, 3, 4, 5, 6]).tuning == (8, 9)  # [2400, 3000) and [2700, 3300) s


def test_knob_grid_points_apply_through_the_schema(params):
    assert parse_knob("control.lookahead.w_defer=0, 0.5,1") == ("control.lookahead.w_defer", [0, 0.5, 1])
    with pytest.raises(BadInput, match="expected KEY=V1,V2"):
        parse_knob("control.lookahead.w_defer")
    points = grid("wa_lookahead", ["control.lookahead.history_s=300,600"])
    assert len(points) == 7 * 2 and points[0] == {"control.lookahead.w_defer": 0.0, "control.lookahead.history_s": 300}
    assert with_knobs(params, points[-1]).control.lookahead.w_defer == 2.0
    assert current(params, points[0]) == {"control.lookahead.w_defer": 0.25, "control.lookahead.history_s": 600.0}
    with pytest.raises(ConfigError, match="w_defer"):
        with_knobs(params, {"control.lookahead.w_defer": -1})
    with pytest.raises(ConfigError, match="no_such_knob"):
        with_knobs(params, {"control.lookahead.no_such_knob": 1})
    with pytest.raises(BadInput, match="'no_sync' is not a controller policy"):
        grid("no_sync")


def test_gap_closed_is_undefined_below_one_request_and_the_oracle_only_improves(params):
    assert math.isnan(gap_closed(3.4, 3, 3))
    assert gap_closed(10.0, 4, 2) == pytest.approx(0.75)
    bench = SeedBench.build(params, "bursty", 0, seed_loads(params, "bursty", [0])[0], draws=4)
    scored = [bench.score(bench.controller(with_knobs(params, p), "pressure_gate")) for p in grid("pressure_gate")]
    final = [bench.rescored(s) for s in scored]
    for s in final:
        others = [t.violations for t in final if t.n_merges == s.n_merges]
        assert s.oracle <= min(others)
        assert math.isnan(s.closed) or s.closed <= 1.0


def test_tune_chooses_on_tuning_seeds_alone_and_writes_an_overlay_params_accept(params, tmp_path):
    settings = BenchSettings(root=tmp_path, draws=3)
    split = TuningSplit.of(params, "bursty", tuning=[5, 6])
    result = tune(params, "pressure_gate", split, GATE, settings)
    best = result.trials.sort_values(["pooled_closed", "violations"], ascending=[False, True]).iloc[0]
    assert result.chosen == {"control.pressure_gate.max_pressure": best["control.pressure_gate.max_pressure"]}
    assert len(result.trials) == 3  # the params' own 0.5 is a grid point already
    other = tune(params, "pressure_gate", TuningSplit.of(params, "bursty", tuning=[5, 6], judged=[0]), GATE, settings)
    assert other.chosen == result.chosen  # the judged load never enters the choice
    assert result.judged["own"]["seeds"] == 2
    path = write_tuned(result, tmp_path)
    text = path.read_text()
    assert "seeds 5, 6; never judged there" in text and "Judged on seeds 0, 1" in text
    overlay = yaml.safe_load(text)
    assert with_knobs(params, {"control.pressure_gate.max_pressure": overlay["control"]["pressure_gate"]["max_pressure"]})
    assert path.with_suffix(".trials.csv").is_file()


def test_the_online_bound_works_the_controllers_count_and_never_loses_to_it(params, tmp_path):
    table = headroom(params, "pressure_gate", "bursty", [0, 1], GATE, BenchSettings(root=tmp_path, draws=3))
    assert list(table["seed"]) == [0, 1]
    assert (table["bound_violations"] <= table["controller"]).all()
    assert (table["bound_points"] >= 1).all()
    defined = table.dropna(subset=["closed"])
    assert (defined["bound_closed"] >= defined["closed"] - 1e-12).all()
    summary = headroom_summary(table)
    assert summary["seeds"] == 2 and summary["seeds_defined"] == len(defined)
    if len(defined):
        assert summary["foresight_share"] == pytest.approx(1 - defined["bound_closed"].mean())
    gap = table["random"].sum() - table["oracle"].sum()
    if gap >= 1:  # pooled: the summed gap, which the bound closes at least as far as the controller
        assert summary["controller_pooled"] == pytest.approx((table["random"].sum() - table["controller"].sum()) / gap)
        assert summary["online_bound_pooled"] >= summary["controller_pooled"] - 1e-12
    else:
        assert math.isnan(summary["controller_pooled"]) and math.isnan(summary["online_bound_pooled"])


def test_the_commands_write_the_overlay_and_the_headroom_table_and_refuse_bad_input(cli, params_file, tmp_path):
    from typer.testing import CliRunner

    from syncsafe.cli import app

    out = cli("tune", "pressure_gate", "bursty", "--knob", GATE[0], "--seed", "4", "--draws", "2",
              "--params", params_file, "--root", tmp_path)
    assert (tmp_path / "tuned" / "bursty" / "pressure_gate.yaml").is_file() and "never judged there" in out
    out = cli("headroom", "bursty", "--policy", "pressure_gate", "--knob", GATE[0], "--draws", "2",
              "--params", params_file, "--root", tmp_path)
    assert (tmp_path / "reports" / "headroom" / "bursty" / "pressure_gate.csv").is_file() and "online bound" in out
    for args, said in ((["tune", "pressure_gate", "bursty", "--seed", "0"], "are judged seeds too"),
                       (["tune", "pressure_gate", "nowhere"], "regime 'nowhere' is not in"),
                       (["headroom", "nowhere"], "regime 'nowhere' is not in"),
                       (["headroom", "bursty", "--stage", "--policy", "fixed_h", "--draws", "2"],
                        "it takes no --policy, --draws"),
                       (["tune", "pressure_gate", "bursty", "--knob", "control.pressure_gate.max_pressure=2"],
                        "max_pressure")):
        result = CliRunner().invoke(app, [*args, "--params", str(params_file), "--root", str(tmp_path)])
        assert result.exit_code == 2 and said in result.output, result.output


def test_every_controller_policy_has_a_knob_grid_for_its_online_bound():
    assert set(CONTROLLER_POLICIES) <= set(DEFAULT_GRIDS)


def test_the_headroom_stage_splits_each_policy_s_gap_on_the_traces_stage_s_load_and_the_report_shows_it(
        cli, raw_params, tmp_path):
    raw_params["analysis"]["headroom_policies"] = ["pressure_gate", "fixed_h"]
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw_params))
    params = parse_params(raw_params)
    common = ["--params", str(params_file), "--root", str(tmp_path)]
    assert headroom_section(params, tmp_path) == ""  # no stage table yet: no section
    cli("traces", "--regime", "bursty", *common)
    out = cli("headroom", "bursty", "--stage", *common)
    for policy in ("pressure_gate", "fixed_h"):
        written = pd.read_csv(tmp_path / "reports" / "headroom" / "bursty" / f"{policy}.csv")
        # the traces stage's tables are the load the command generates from params: the same split
        generated = headroom(params, policy, "bursty", params.seeds, (), BenchSettings(root=tmp_path))
        pd.testing.assert_frame_equal(written, generated, check_dtype=False)
        assert list(written["seed"]) == list(params.seeds)
        s = headroom_summary(written)
        assert f"headroom bursty {policy}: gap closed" in out and f"({s['seeds_defined']}/{s['seeds']} seeds" in out
    section = headroom_section(params, tmp_path)
    assert section.startswith("## Headroom") and "| bursty | pressure_gate |" in section
    assert "| bursty | fixed_h |" in section and "| steady |" not in section  # steady's stage did not run

