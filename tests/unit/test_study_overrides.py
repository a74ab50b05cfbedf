"""A study point is validated on what `dvc exp run -S` will run (DVC's own Hydra composition), and its
experiment name belongs to it alone."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from syncsafe.config import ConfigError
from syncsafe.errors import BadInput
from syncsafe.studies.dvc_overrides import check_same, dvc_applied, set_param_args
from syncsafe.studies.report import check_ran_its_params
from syncsafe.config import apply_overrides
from syncsafe.studies.spec import load_study

REPO = Path(__file__).resolve().parents[2]
BASE = {"merge": {"window_s": 8, "bytes": 4}, "regimes": {"bursty": {"kind": "bursty", "duration_s": 600}},
        "note": "kept"}


@pytest.mark.parametrize("overrides", [
    {"regimes.bursty": {"kind": "bursty", "duration_s": 120}},  # Hydra alone would keep nothing else, merged
    {"merge": {"window_s": 4}},  # a whole section replaced: `bytes` goes
    {"merge.window_s": None},  # removed
    {"regimes.steady": None, "merge.window_s": 2},  # removing what is not there: nothing to do, no failure
    {"note": "it's $HOME, \\ and a 'quote'"},  # strings literal
    {"note": "ends in \\\\", "other": "\\'q"},  # backslashes at the end and before a quote
    {"regimes.azure": {"kind": "trace", "path": "a b.csv"}, "new.list": [1, 2.5, "x", True]},
])  # fmt: skip
def test_dvc_runs_what_the_study_means(overrides):
    ours = apply_overrides(BASE, overrides)
    assert dvc_applied(BASE, set_param_args(overrides, BASE)) == ours
    check_same(ours, BASE, overrides)


def test_an_interpolation_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"note: '\$\{merge.window_s\}': .*interpolation"):
        set_param_args({"note": "${merge.window_s}"}, BASE)


def test_a_difference_between_the_two_semantics_is_named():
    merged = {**BASE, "merge": {"window_s": 4, "bytes": 4}}  # what Hydra's merge alone would give
    with pytest.raises(ConfigError, match=r"merge.bytes: `dvc exp run -S` would run it with \(absent\), the "
                                          r"study means 4"):
        check_same(merged, BASE, {"merge": {"window_s": 4}})


def test_a_removal_dvc_refuses_is_one_line_before_anything_runs():
    with pytest.raises(ConfigError, match=r"refused by DVC"):
        dvc_applied(BASE, ["-S", "~regimes.steady"])  # what a bare `~key` of an absent key did


def test_experiment_names_of_two_studies_never_collide(tmp_path: Path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "studies").mkdir()
    axis = lambda name, key: {"description": "d", "question": "sensitivity",  # noqa: E731
                              "axes": [{"name": name, "keys": [key], "values": [0.05]}]}
    (tmp_path / "studies" / "s.yaml").write_text(yaml.safe_dump(axis("x-y", "analysis.alpha")))
    (tmp_path / "studies" / "s-x.yaml").write_text(yaml.safe_dump(axis("y", "analysis.alpha")))
    first, second = load_study(tmp_path, "s"), load_study(tmp_path, "s-x")
    names = {first.experiment(first.points[0]), second.experiment(second.points[0])}
    assert names == {"s.x-y-0p05", "s-x.y-0p05"}


def _commit_params(root: Path, raw: dict) -> str:
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, check=True)  # noqa: E731
    if not (root / ".git").exists():
        git("init", "-q")
    git("add", "params.yaml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x", "--allow-empty")
    return git("rev-parse", "HEAD").stdout.strip()


def test_the_report_refuses_an_experiment_that_ran_other_params(tmp_path: Path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "studies", tmp_path / "studies")
    study = load_study(tmp_path, "sensitivity")
    point = next(p for p in study.points if p.name == "merge window (s)=4")
    ran = apply_overrides(study.base, study.overrides(point))
    check_ran_its_params(tmp_path, study, point, _commit_params(tmp_path, ran))  # its own params: fine
    ran["merge"]["window_s"] = 16  # another study's, an older run's or a hand edit
    with pytest.raises(BadInput, match=r"point merge window \(s\)=4: experiment sensitivity.merge-window-s-4 ran "
                                       r"with merge.window_s = 16.0, the point means 4.0"):
        check_ran_its_params(tmp_path, study, point, _commit_params(tmp_path, ran))
