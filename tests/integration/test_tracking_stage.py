"""The generic tracking step (`tracked_stage`) on real stages and a real SQLite MLflow store:
nested runs under one pipeline parent, item runs found by `syncsafe compare`'s search, a
failing stage marked FAILED, tracking off writing nothing, and the collectors on stage files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from tracking_store import TRACKING_ENV
from syncsafe.analysis.evidence import FidelityEvidence
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import write_model
from syncsafe.artifacts.reports import CONTRACT_COLUMNS, policy_table_path
from syncsafe.artifacts.traces import read_timeline
from syncsafe.artifacts.train_runs import write_losses, write_merges, write_metrics
from syncsafe.pipeline.declarations import stage as declared
from syncsafe.control.serving_model import Calibration
from syncsafe.schedules.stage import build_schedules
from syncsafe.traces.stage import build_traces
from syncsafe.tracking import (
    TAG_KIND,
    TAG_PIPELINE,
    TrackingError,
    TrackingWarning,
    compare_table,
    search_item_runs,
    tracked_stage,
)
from syncsafe.tracking.collectors import COLLECTORS, collect_stage

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

_ENV = TRACKING_ENV
PARENT = "mlflow.parentRunId"


@pytest.fixture
def store(fresh_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tracking on, the default store of root tmp_path (<tmp_path>/mlflow.db), one pipeline run id."""
    monkeypatch.setenv("SYNCSAFE_PIPELINE_RUN_ID", "nightly-7")
    return fresh_store


def _client(root: Path) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def _all_runs(root: Path) -> list:
    c = _client(root)
    return c.search_runs([c.get_experiment_by_name("syncsafe").experiment_id], max_results=5000)


def test_stages_leave_nested_item_runs_under_one_parent_found_by_compare(store: Path, params) -> None:
    with tracked_stage("traces", root=store, params=params, regime="bursty", sections=declared("traces").params) as traces:
        build_traces(params, "bursty", store)
    with tracked_stage("schedules", root=store, params=params, regime="bursty",
                       sections=declared("schedules").params) as schedules:
        index = build_schedules(params, "bursty", store)
    assert traces.record is not None and schedules.record is not None
    parent_id = traces.record.parent_run_id
    assert schedules.record.parent_run_id == parent_id and traces.record.pipeline_run_id == "nightly-7"

    c = _client(store)
    parent = c.get_run(parent_id)
    assert parent.data.tags[TAG_KIND] == "pipeline" and PARENT not in parent.data.tags
    assert parent.info.status == "FINISHED" and parent.data.tags[TAG_PIPELINE] == "nightly-7"
    units = index[index["matched_to"].isna()]  # a run per controller and no-sync schedule: draws join their controller's
    for record, n_items in ((traces.record, len(params.seeds)), (schedules.record, len(units))):
        stage = c.get_run(record.stage_run_id)
        assert stage.data.tags[PARENT] == parent_id and stage.data.tags[TAG_KIND] == "stage"
        assert stage.info.status == "FINISHED"
        # MLflow's own view of the nesting: the stage run's children are exactly its item runs
        children = c.search_runs([record.experiment_id], filter_string=f"tags.{PARENT} = '{record.stage_run_id}'",
                                 max_results=5000)
        assert sorted(r.info.run_id for r in children) == sorted(record.run_ids) and len(children) == n_items
        assert {r.data.tags[TAG_KIND] for r in children} == {"item"}
        assert {r.info.status for r in children} == {"FINISHED"}
    assert len(_all_runs(store)) == 1 + 2 + len(params.seeds) + len(units)

    stage = c.get_run(schedules.record.stage_run_id)
    assert stage.info.run_name == "schedules@bursty"
    assert stage.data.params["merge.window_s"] == str(params.merge.window_s)
    assert stage.data.params["schedules.random_draws"] == str(params.schedules.random_draws)
    assert stage.data.params["regimes.bursty.kind"] == "bursty"
    assert not any(k.startswith(("traces.", "regimes.steady")) for k in stage.data.params)

    # traces: one item per seed, its metrics read back from the trace set
    seed0 = c.search_runs([traces.record.experiment_id],
                          filter_string=f"tags.stage = 'traces' and tags.seed = '{params.seeds[0]}'")
    assert len(seed0) == 1
    timeline = read_timeline(store, "bursty", params.seeds[0])
    assert seed0[0].data.metrics["busy_fraction"] == pytest.approx(float(timeline["busy"].mean()))

    # schedules: compare's search finds every item run, and the n_merges table matches the index
    found = search_item_runs(stage="schedules", regime="bursty", root=store)
    assert sorted(found["run_id"]) == sorted(schedules.record.run_ids)
    table = compare_table("bursty", "n_merges", root=store).set_index(["policy", "matched_to"])
    own = index[index["draw"].isna()]
    for rec in own.itertuples():
        assert table.loc[(rec.policy, "" if pd.isna(rec.matched_to) else rec.matched_to), f"seed_{rec.seed}"] == rec.n_merges
    draws = index[index["draw"].notna()]  # every numbered draw (fair and free matched random) joins the envelope
    assert len(draws) > 0
    for policy, group in draws.groupby("matched_to"):
        assert table.loc[(policy, ""), "mr_draws"] == len(group)


def test_a_failing_stage_marks_its_runs_failed_and_reraises(store: Path, params) -> None:
    with pytest.raises(RuntimeError, match="stage broke"):
        with tracked_stage("schedules", root=store, params=params, regime="bursty") as handle:
            raise RuntimeError("stage broke")
    assert handle.record is None
    runs = _all_runs(store)
    assert sorted((r.data.tags[TAG_KIND], r.info.status) for r in runs) == [("pipeline", "FAILED"), ("stage", "FAILED")]


def test_a_stage_whose_outputs_cannot_be_read_warns_or_raises_when_strict(store: Path, params) -> None:
    with pytest.warns(TrackingWarning, match=r"stage 'schedules': logged 0 item runs, then failed .*index.csv"):
        with tracked_stage("schedules", root=store, params=params, regime="bursty") as handle:
            pass  # wrote nothing: the collector finds no schedule index
    assert handle.record is None
    (stage,) = [r for r in _all_runs(store) if r.data.tags[TAG_KIND] == "stage"]
    assert stage.info.status == "FAILED" and stage.data.tags["syncsafe.tracking_incomplete"] == "true"
    with pytest.raises(TrackingError, match="index.csv"):
        with tracked_stage("schedules", root=store, params=params, regime="bursty", strict=True):
            pass


_OFF_PROBE = """
import sys
from pathlib import Path
from syncsafe.tracking import tracked_stage
root = Path(sys.argv[1])
with tracked_stage("schedules", root=root, params={"seeds": [0]}, regime="bursty", system_metrics=True) as h:
    (root / "out.txt").write_text("done")
assert h.record is None
print("mlflow" in sys.modules)
"""


def test_tracking_off_runs_the_stage_and_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _ENV}
    env.update(SYNCSAFE_TRACKING="0", SYNCSAFE_TRACKING_STRICT="1")  # strict, yet nothing to fail
    out = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", _OFF_PROBE, str(tmp_path)],
                         env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # MLflow was not even imported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


# --------------------------------------------------------------------------- collectors on stage files


def test_every_pipeline_stage_has_a_collector() -> None:
    assert set(COLLECTORS) == {"traces", "train", "schedules", "replay-simulator", "profile-vllm", "replay-vllm",
                               "live",
                               "calibrate-fit", "fidelity", "analyze"}
    assert collect_stage("schedule-index", Path("."), None, None).runs == []


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_train_collector_reads_metrics_curves_and_timing(tmp_path: Path, params) -> None:
    policy, seed = params.control.policies[0], params.seeds[0]
    run_dir = layout.train_run_dir(tmp_path, "bursty", policy, seed)
    write_losses(run_dir, [(0, 0, 4.0), (0, 1, 2.0), (10, 0, 1.5), (10, 1, 0.5)])
    write_merges(run_dir, pd.DataFrame({"merge": [0], "step": [10], "bytes_communicated": [64], "eval_loss": [0.9]}))
    _write(layout.timing_path(run_dir), json.dumps({"wall_s": 3.5}))
    write_metrics(run_dir, {"final_eval_loss": 0.8, "n_merges": 1, "converged": True})
    other = layout.train_run_dir(tmp_path, "bursty", "not_in_params", seed)  # left over from another config
    write_losses(other, [(0, 0, 1.0)])
    write_metrics(other, {"n_merges": 0})
    (run,) = collect_stage("train", tmp_path, params, "bursty").runs
    assert (run.regime, run.policy, run.seed) == ("bursty", policy, seed)
    assert run.metrics == {"final_eval_loss": 0.8, "n_merges": 1, "wall_s": 3.5}
    assert run.series == {"train_loss": [(0, 3.0), (10, 1.0)], "merge_eval_loss": [(10, 0.9)]}
    assert [Path(p).name for p in run.artifacts] == ["schedule.json", "decisions.jsonl", "merges.csv"]


def test_stage_level_collectors_read_live_calibration_fidelity_and_reports(tmp_path: Path, params) -> None:
    seed = params.seeds[0]
    rows = [{"regime": "bursty", "seed": seed, "condition": c, "slo_violation_rate": r, "n_merges": n}
            for c, r, n in (("policy", 0.1, 4), ("no_train", 0.05, 0))]
    rows.append({"regime": "steady", "seed": seed, "condition": "policy", "slo_violation_rate": 0.3, "n_merges": 2})
    index = tmp_path / layout.LIVE_INDEX
    index.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(index, index=False)
    live = collect_stage("live", tmp_path, params, "bursty")
    assert live.metrics == {f"policy.seed-{seed}.slo_violation_rate": 0.1, f"policy.seed-{seed}.n_merges": 4,
                            f"no_train.seed-{seed}.slo_violation_rate": 0.05, f"no_train.seed-{seed}.n_merges": 0}
    assert live.artifacts == [index] and live.runs == []

    calibration = Calibration(fitted=True, iter_base_ms=5.0, merge_compute_share=0.2)
    write_model(tmp_path / layout.FITTED_CALIBRATION, calibration)
    _write(tmp_path / layout.CALIBRATION_REPORT, "# fit\n")
    fit = collect_stage("calibrate-fit", tmp_path, params, None)
    assert fit.metrics == {f"calibration.{k}": float(v) for k, v in calibration.model_dump(exclude={"fitted", "merge_link"}).items()}
    assert fit.metrics["calibration.iter_base_ms"] == 5.0 and fit.metrics["calibration.merge_compute_share"] == 0.2
    assert sorted(Path(p).name for p in fit.artifacts) == ["calibration.json", "report.md"]

    write_model(tmp_path / layout.FIDELITY_EVIDENCE, FidelityEvidence(calibration="fitted", p95_rel_error_max=0.25))
    fidelity = collect_stage("fidelity", tmp_path, params, None)
    assert fidelity.metrics == {"fidelity.p95_rel_error_max": 0.25}  # what was not measured is not logged

    table = policy_table_path(tmp_path)
    table.parent.mkdir(parents=True)
    row = dict.fromkeys(CONTRACT_COLUMNS, float("nan"))
    row.update(regime="bursty", policy="wa_diloco", tier="stress harness only", slo_pct_mean=1.5, n_seeds=2)
    pd.DataFrame([row]).to_csv(table, index=False)
    _write(tmp_path / "reports" / "figures" / "loss.png", "png")
    (run,) = (analyze := collect_stage("analyze", tmp_path, params, None)).runs
    assert (run.regime, run.policy, dict(run.tags)) == ("bursty", "wa_diloco", {"tier": "stress harness only"})
    assert run.metrics == {"slo_pct_mean": 1.5, "n_seeds": 2}
    assert sorted(Path(p).name for p in analyze.artifacts) == ["figures", "policy_table.csv"]
