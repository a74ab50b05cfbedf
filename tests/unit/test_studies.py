"""Studies: the study files and their points, the within-study family (by hand and by simulation), the
report's figure and text. The real `dvc exp` runs are in tests/integration/test_studies.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import yaml
from typer.testing import CliRunner

from syncsafe.analysis.multiplicity import holm_adjusted
from syncsafe.analysis.stats import sign_test
from syncsafe.cli import app
from syncsafe.config import ConfigError, policy_label
from syncsafe.studies.family import PointResult, judge, seed_table
from syncsafe.studies.figure import save_study_figure
from syncsafe.studies.report import render
from syncsafe.studies.dvc_overrides import set_param_args
from syncsafe.studies.spec import load_study, point_params, slug

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "studies", tmp_path / "studies")
    return tmp_path


def write_study(root: Path, name: str, body: dict) -> None:
    (root / "studies" / f"{name}.yaml").write_text(yaml.safe_dump(body), encoding="utf-8")


def test_the_shipped_studies_validate_and_name_their_points(project: Path):
    ablation = load_study(project, "ablation")
    assert [p.name for p in ablation.points] == ["wa_diloco-progress", "wa_diloco-staleness", "wa_diloco-pressure",
                                                 "wa_forecast-forecast", "wa_calibrated-cost", "wa_lookahead-lookahead"]
    first = ablation.points[0]
    assert first.overrides["control.policies"] == ["fixed_h", "wa_diloco", "wa_diloco-progress"]
    assert point_params(ablation, first).analysis.primary.policy == "wa_diloco"
    assert ablation.shared["schedules.source"] == "harness"
    assert "schedules.source" not in load_study(project, "ablation", full=True).shared
    sensitivity = load_study(project, "sensitivity")
    assert len(sensitivity.points) == 15 and sensitivity.policy == "wa_diloco"
    load = [p for p in sensitivity.points if p.axis == "load scale"]
    regimes = yaml.safe_load((project / "params.yaml").read_text())["regimes"]
    assert set(load[0].overrides) == {f"regimes.{r}.load_scale" for r in regimes}  # the wildcard, every regime
    assert point_params(sensitivity, load[0]).regimes["bursty"].load_scale == 0.5
    names = [sensitivity.experiment(p) for p in sensitivity.points]
    assert "sensitivity.SLO-multiplier-1p25" in names
    # the baseline value of each axis lands on the same params: one DVC experiment serves those five points
    baseline = {p.name for p in sensitivity.points if sensitivity.experiment(p) == "sensitivity.merge-window-s-8"}
    assert baseline == {"merge window (s)=8", "max_h (inner steps)=16", "SLO multiplier=1.5", "load scale=1.0",
                        "matched-random draws=20"}
    assert len(set(names)) == len(sensitivity.distinct()) == 11


def test_overrides_become_hydra_set_params():
    base = {"merge": {"window_s": 8}, "regimes": {"steady": {"kind": "steady"}}}
    args = set_param_args({"merge.window_s": 4, "replay.vllm.enabled": False, "control.policies": ["fixed_h", "a-b"],
                           "analysis.primary.policy": "wa_diloco", "regimes.steady": None}, base)
    assert args == ["-S", "++merge.window_s=4", "-S", "++replay.vllm.enabled=false",
                    "-S", "++control.policies=['fixed_h','a-b']", "-S", "++analysis.primary.policy='wa_diloco'",
                    "-S", "~regimes.steady"]
    assert slug("merge window (s)=4") == "merge-window-s-4" and slug("x=1.25") == "x-1p25"


@pytest.mark.parametrize("body,expected", [
    ({"description": "d", "question": "ablation", "ablations": ["wa_diloco-pressure"], "colour": 1},
     r"colour: Extra inputs are not permitted"),
    ({"description": "d", "question": "sensitivity", "axes": [{"name": "w", "keys": ["merge.windw_s"], "values": [4]}]},
     r"point w=4: .*merge.windw_s: unknown key"),
    ({"description": "d", "question": "sensitivity", "axes": [{"name": "w", "keys": ["merge.window_s"], "values": [-4]}]},
     r"point w=-4: .*merge.window_s"),
    ({"description": "d", "question": "ablation", "ablations": ["wa_diloco"]}, r"whole policy, not an ablated variant"),
    ({"description": "d", "question": "ablation", "ablations": ["wa_diloco-cost"]}, r"not a controller policy"),
    ({"description": "d", "question": "sensitivity", "cheap": {"seedz": [0]},
      "axes": [{"name": "w", "keys": ["merge.window_s"], "values": [4]}]}, r"common/cheap overrides: .*seedz"),
    ({"description": "d", "question": "sensitivity",
      "axes": [{"name": "w", "keys": ["merge.*"], "values": [4]}]}, r"wildcard may only stand for the regime"),
])
def test_a_bad_study_file_is_one_line_naming_the_file_point_and_key(project: Path, body: dict, expected: str):
    write_study(project, "bad", body)
    with pytest.raises(ConfigError, match=expected) as err:
        load_study(project, "bad")
    assert "studies/bad.yaml" in str(err.value) and "\n" not in str(err.value)
    done = CliRunner().invoke(app, ["study", "run", "bad", "--dry-run", "--root", str(project)])
    assert done.exit_code == 2
    assert done.output.count("\n") == 1 and done.output.startswith("error: ") and "bad.yaml" in done.output


def test_an_unknown_study_names_the_ones_there_are(project: Path):
    done = CliRunner().invoke(app, ["study", "run", "nope", "--dry-run", "--root", str(project)])
    assert done.exit_code == 2 and "have ablation, sensitivity" in done.output
    outside = CliRunner().invoke(app, ["study", "run", "../params", "--dry-run", "--root", str(project)])
    assert outside.exit_code == 2 and "letters, digits" in outside.output


def test_dry_run_prints_one_queue_command_per_point(project: Path):
    done = CliRunner().invoke(app, ["study", "run", "ablation", "--dry-run", "--root", str(project)])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert len(lines) == 6 and all(line.startswith("dvc exp run --queue --name ablation.") for line in lines)


# --------------------------------------------------------------------------- the family, by hand


def envelope(rows: list[tuple[str, int, float, float]], regime: str = "bursty") -> pd.DataFrame:
    """(policy, seed, rank, delta_vs_mr_pct) rows of an envelope.csv."""
    return pd.DataFrame([{"regime": regime, "policy": p, "seed": s, "slo_pct": 1.0 + r, "sync_excess_pct": r,
                          "delta_vs_mr_pct": d, "rank": r, "gap_closed": 1.0 - r} for p, s, r, d in rows])


def table(*policies: str, regime: str = "bursty") -> pd.DataFrame:
    return pd.DataFrame([{"regime": regime, "policy": p, "tier": "stress harness only", "p_rank": 0.5} for p in policies])


def test_the_ablation_family_on_a_hand_computation(project: Path):
    study = load_study(project, "ablation")
    a, b = study.points[0], study.points[2]  # wa_diloco-progress, wa_diloco-pressure
    # point a: the full policy ranks lower on all 6 seeds -> sign test p = 0.5 ** 6
    env_a = envelope([("wa_diloco", s, 0.1, -1.0) for s in range(6)] + [("wa_diloco-progress", s, 0.6, 2.0) for s in range(6)])
    # point b: full lower on 3 seeds, higher on 2, one tie -> p = P(Bin(5, 1/2) >= 3) = 16/32
    ranks_b = [(0.1, 0.5), (0.2, 0.6), (0.3, 0.7), (0.8, 0.2), (0.9, 0.4), (0.5, 0.5)]
    env_b = envelope([("wa_diloco", s, f, 0.0) for s, (f, _) in enumerate(ranks_b)]
                     + [("wa_diloco-pressure", s, v, 0.0) for s, (_, v) in enumerate(ranks_b)])
    results = [PointResult(a, env_a, table("wa_diloco", "wa_diloco-progress")),
               PointResult(b, env_b, table("wa_diloco", "wa_diloco-pressure"))]
    rows = judge(study, results, alpha=0.05).set_index("point")
    assert rows.loc["wa_diloco-progress", "p"] == pytest.approx(1 / 64)
    assert rows.loc["wa_diloco-pressure", "p"] == pytest.approx(16 / 32)
    # Holm over the two: 2 * 1/64, then max(that, 1 * 1/2)
    assert rows.loc["wa_diloco-progress", "p_holm"] == pytest.approx(2 / 64)
    assert rows.loc["wa_diloco-pressure", "p_holm"] == pytest.approx(0.5)
    assert rows["finding"].tolist() == [True, False]
    assert (rows.loc["wa_diloco-pressure", "seeds_full_better"], rows.loc["wa_diloco-pressure", "seeds_ablation_better"]) == (3, 2)
    assert rows.loc["wa_diloco-progress", "effect"] == pytest.approx(3.0)  # ablation's delta vs MR minus the full's
    assert rows.loc["wa_diloco-progress", "compared_to"] == "wa_diloco"


def test_the_sensitivity_family_holds_the_points_own_rank_p_values_together(project: Path):
    study = load_study(project, "sensitivity")
    results = []
    p_values = [0.001, 0.01, 0.04]
    for point, p in zip(study.points[:3], p_values):
        t = table("fixed_h", "wa_diloco")
        t.loc[t["policy"] == "wa_diloco", "p_rank"] = p
        results.append(PointResult(point, envelope([("wa_diloco", s, 0.2, -0.5) for s in range(4)]), t))
    rows = judge(study, results, alpha=0.05)
    expected = holm_adjusted(dict(enumerate(p_values)))
    assert rows["p_holm"].tolist() == pytest.approx([expected[i] for i in range(3)])  # 0.003, 0.02, 0.04
    assert rows["finding"].tolist() == [True, True, True]
    assert rows["gap_closed_mean"].tolist() == pytest.approx([0.8] * 3)


def test_a_point_without_the_policy_it_asks_about_is_an_error(project: Path):
    study = load_study(project, "ablation")
    with pytest.raises(ValueError, match="no envelope rows of policy 'wa_diloco-progress'"):
        seed_table(study, [PointResult(study.points[0], envelope([("wa_diloco", 0, 0.1, 0.0)]), table("wa_diloco"))])


# --------------------------------------------------------------------------- the family, by simulation


def _normalised_rank(value: float, draws: np.ndarray) -> float:
    ranks = scipy.stats.rankdata(np.concatenate([[value], draws]), method="average")
    return (ranks[0] - 1) / draws.size


def _zero_inflated(rng: np.random.Generator, size) -> np.ndarray:
    """SLO violation rates as they come: most replays have none, the rest are skewed (log-normal)."""
    return np.where(rng.random(size) < 0.6, 0.0, rng.lognormal(0.0, 1.5, size))


def _ablation_p(rng: np.random.Generator, seeds: int, draws: int, shift: float = 0.0) -> float:
    full_ranks, ablated_ranks = [], []
    for _ in range(seeds):
        full, ablated = _zero_inflated(rng, 1)[0], _zero_inflated(rng, 1)[0] + shift
        full_ranks.append(_normalised_rank(full, _zero_inflated(rng, draws)))
        ablated_ranks.append(_normalised_rank(ablated, _zero_inflated(rng, draws)))
    return sign_test(np.array(full_ranks), np.array(ablated_ranks)).p_value


@pytest.mark.slow
def test_the_study_family_keeps_its_error_under_a_zero_inflated_null_and_finds_a_real_effect():
    rng = np.random.default_rng(7)
    alpha, sims, tests = 0.05, 400, 24  # 6 ablations x 4 regimes, 10 seeds, 20 draws each, as shipped
    single, familywise = 0, 0
    for _ in range(sims):
        ps = {k: _ablation_p(rng, 10, 20) for k in range(tests)}
        single += ps[0] < alpha
        familywise += any(v < alpha for v in holm_adjusted(ps).values())
    # binomial error of the estimate at 400 sims: an upper 99 % bound of alpha's count is about alpha + 0.028
    assert single / sims <= alpha + 0.028, single / sims
    assert familywise / sims <= alpha + 0.028, familywise / sims
    # without the family the same study would find something most of the time
    unadjusted_any = np.mean([any(_ablation_p(rng, 10, 20) < alpha for _ in range(tests)) for _ in range(100)])
    assert unadjusted_any > 0.2
    # and a real effect (the ablation's violations shifted up on every seed) is found
    power = np.mean([_ablation_p(rng, 10, 20, shift=1.0) < alpha for _ in range(200)])
    assert power > 0.5, power


# --------------------------------------------------------------------------- figure and text


def test_the_figure_and_report_show_every_point_with_its_tier(project: Path, tmp_path: Path):
    study = load_study(project, "ablation")
    results = [PointResult(p, envelope([(policy, s, 0.1 * s, 0.0) for s in range(4)
                                        for policy in (p.name.split("-")[0], p.name)]),
                           table("wa_diloco", p.name.split("-")[0], p.name)) for p in study.points]
    seeds, rows = seed_table(study, results), judge(study, results, alpha=0.05)
    path = save_study_figure(seeds, rows, "study ablation", tmp_path / "figure.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    text = render(study, rows, 0.05, {"wall_s": 12.0, "points": [{"point": p.name, "ran": ["a"], "reused": ["traces@bursty"]}
                                                                 for p in study.points]})
    for point in study.points:
        assert policy_label(point.name) in text
    assert "wa_diloco\u2212pressure" in text and "one Holm family over all 6" in text and "traces@bursty" in text
