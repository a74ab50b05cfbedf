"""MLflow tracking against temporary SQLite stores: runs, tags, params, metrics, artifacts,
the shared pipeline parent, the compare table and the failure policy."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import mlflow  # a required dependency: a broken install fails here, never skips
import numpy as np
import pandas as pd
import pytest

from tracking_store import TRACKING_ENV
from syncsafe import tracking
from syncsafe.tracking import (
    RUN_TAGS,
    TrackedRun,
    TrackingError,
    TrackingWarning,
    StageRecord,
    compare_table,
    render_table,
    tracked_stage,
)


# MLflow 3.17's SQL store still uses SQLAlchemy's deprecated `noload` (SQLAlchemy 2.1); not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")

_ENV = TRACKING_ENV


@pytest.fixture
def store(fresh_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh store at <tmp_path>/mlflow.db, the project root being tmp_path."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{fresh_store}/mlflow.db")
    monkeypatch.setenv("SYNCSAFE_PIPELINE_RUN_ID", "night-1")
    return fresh_store


def client(root: Path):
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def write(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def track(stage: str, runs=(), *, root: Path, regime: str | None = None, strict: bool | None = None) -> StageRecord | None:
    """One stage run holding the given item runs (no collector: the items are made up here)."""
    with tracked_stage(stage, root=root, regime=regime, strict=strict, collect=False) as st:
        st.extend(runs)
    return st.record


SECTION = {"seeds": [0, 1], "merge": {"window_s": 8.0, "min_gap_s": 10.0}, "regimes": {"bursty": {"kind": "bursty"}}}


# --------------------------------------------------------------------------- logging


def test_stage_leaves_nested_runs_with_tags_params_metrics_artifacts(store: Path) -> None:
    schedule = write(store / "runs" / "wa_diloco.json", '{"merge_starts_s": [0.0]}')
    decisions = write(store / "runs" / "wa_diloco.decisions.jsonl", '{"step": 1}\n')
    plots = store / "runs" / "plots"
    write(plots / "loss.png", "png")
    index = write(store / "runs" / "index.csv", "regime,policy\n")
    runs = [
        TrackedRun(
            regime="bursty",
            policy="wa_diloco",
            seed=0,
            draw=pd.NA,  # as read from the schedule index (Int64 column)
            backend="harness",
            params={"control.min_h": 20},
            metrics={"n_merges": 7, "busy_overlap": 0.25, "p95 latency/ms": 12.5},
            series={"loss": [(0, 3.0), (10, 2.5), (20, 2.25)]},
            artifacts=[schedule, decisions, plots],
        ),
        TrackedRun(
            regime="bursty", policy="matched_random", seed=np.int64(0), draw=np.int64(3), matched_to="wa_diloco",
            metrics={"n_merges": np.int64(7)},
        ),
    ]
    with tracked_stage("schedules", root=store, params={**SECTION, "profile": "cpu"}, sections=list(SECTION),
                       regime="bursty", collect=False) as st:
        st.extend(runs)
        st.log_metric("wall_s", 1.5)
        st.log_artifact(index)
    rec = st.record
    assert rec is not None and len(rec.run_ids) == 2 and rec.pipeline_run_id == "night-1"
    c = client(store)
    exp = c.get_experiment(rec.experiment_id)
    assert exp.name == "syncsafe"
    assert exp.artifact_location == (store / "mlartifacts" / "syncsafe").as_uri()

    parent = c.get_run(rec.parent_run_id)
    assert parent.data.tags[tracking.TAG_KIND] == "pipeline"
    assert parent.data.tags[tracking.TAG_PIPELINE] == "night-1"
    assert parent.info.status == "FINISHED"

    stage = c.get_run(rec.stage_run_id)
    assert stage.data.tags["mlflow.parentRunId"] == rec.parent_run_id
    assert stage.data.tags[tracking.TAG_KIND] == "stage"
    assert stage.info.run_name == "schedules@bursty"
    assert stage.data.params == {
        "seeds": "[0, 1]", "merge.window_s": "8.0", "merge.min_gap_s": "10.0", "regimes.bursty.kind": "bursty"
    }
    assert stage.data.metrics == {"wall_s": 1.5}
    assert [a.path for a in c.list_artifacts(rec.stage_run_id)] == ["index.csv"]

    controller, draw = (c.get_run(i) for i in rec.run_ids)
    for run in (controller, draw):
        assert set(RUN_TAGS) <= set(run.data.tags)
        assert run.data.tags["mlflow.parentRunId"] == rec.stage_run_id
        assert run.data.tags[tracking.TAG_KIND] == "item"
        assert run.data.tags["profile"] == "cpu"
        assert run.data.tags["stage"] == "schedules"
        assert run.data.tags["dvc_lock_md5"] == ""  # no dvc.lock in tmp_path
        assert run.info.status == "FINISHED"
    assert controller.info.run_name == "bursty/wa_diloco/harness/s0"
    assert draw.info.run_name == "bursty/matched_random/to-wa_diloco/s0/d003"
    tags = controller.data.tags
    assert {k: tags[k] for k in ("regime", "policy", "seed", "draw", "matched_to", "backend")} == {
        "regime": "bursty", "policy": "wa_diloco", "seed": "0", "draw": "", "matched_to": "", "backend": "harness"
    }
    assert {k: draw.data.tags[k] for k in ("policy", "seed", "draw", "matched_to")} == {
        "policy": "matched_random", "seed": "0", "draw": "3", "matched_to": "wa_diloco"
    }
    assert controller.data.params == {"control.min_h": "20"}  # its own: the stage's params are on the stage run
    assert controller.data.metrics == {"n_merges": 7, "busy_overlap": 0.25, "p95 latency/ms": 12.5, "loss": 2.25}
    history = c.get_metric_history(controller.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(0, 3.0), (10, 2.5), (20, 2.25)]
    assert sorted(a.path for a in c.list_artifacts(controller.info.run_id)) == [
        "plots", "wa_diloco.decisions.jsonl", "wa_diloco.json"
    ]
    # File artifacts lie beside the database.
    art = store / "mlartifacts" / "syncsafe" / controller.info.run_id / "artifacts"
    assert (art / "plots" / "loss.png").read_text() == "png"
    assert (art / "wa_diloco.json").read_text() == schedule.read_text()


def test_default_store_is_sqlite_in_root(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking.tracking_uri(store) == f"sqlite:///{store.resolve()}/mlflow.db"
    rec = track("traces", [TrackedRun(regime="bursty", seed=0, metrics={"n_requests": 3})], root=store)
    assert rec is not None and rec.uri == f"sqlite:///{store.resolve()}/mlflow.db"
    assert client(store).get_run(rec.run_ids[0]).data.metrics == {"n_requests": 3}


def test_stage_processes_share_one_pipeline_parent(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = track("traces", [TrackedRun(regime="bursty", seed=0)], root=store)
    second = track("schedules", [TrackedRun(regime="bursty", policy="fixed_h", seed=0)], root=store)
    assert first and second and first.parent_run_id == second.parent_run_id
    assert first.stage_run_id != second.stage_run_id
    monkeypatch.setenv("SYNCSAFE_PIPELINE_RUN_ID", "night-2")
    third = track("traces", [], root=store)
    assert third and third.parent_run_id != first.parent_run_id
    parents = client(store).search_runs(
        [first.experiment_id], filter_string=f"tags.`{tracking.TAG_KIND}` = 'pipeline'"
    )
    assert sorted(r.data.tags[tracking.TAG_PIPELINE] for r in parents) == ["night-1", "night-2"]


def _pipeline_id_in_subprocess(env: dict[str, str]) -> str:
    code = "from syncsafe.tracking import pipeline_run_id; print(pipeline_run_id())"
    # Like DVC: the stage runs as `$SHELL -c CMD` with DVC_STAGE set for the shell and the stage.
    out = subprocess.run(
        ["/bin/sh", "-c", f'"{sys.executable}" -c "{code}"'], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_pipeline_run_id_is_the_launching_dvc_process() -> None:
    env = {k: v for k, v in os.environ.items() if k not in _ENV}
    under_dvc = [_pipeline_id_in_subprocess({**env, "DVC_STAGE": f"schedules@{r}"}) for r in ("a", "b")]
    assert under_dvc[0] == under_dvc[1]  # two stage processes, one launcher (this pytest process)
    assert under_dvc[0].startswith("dvc-") and under_dvc[0].endswith(f"-{os.getpid()}")
    by_hand = [_pipeline_id_in_subprocess(env) for _ in range(2)]
    assert by_hand[0] != by_hand[1] and by_hand[0].startswith("cli-")
    assert _pipeline_id_in_subprocess({**env, "SYNCSAFE_PIPELINE_RUN_ID": "dag run/7"}) == "dag_run_7"


def test_failed_stage_body_marks_stage_run_failed_and_logs_no_items(store: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with tracked_stage("train", root=store, params={"profile": "cpu"}) as st:
            st.add(TrackedRun(regime="bursty", policy="fixed_h", seed=0))
            raise RuntimeError("boom")
    c = client(store)
    runs = c.search_runs([c.get_experiment_by_name("syncsafe").experiment_id])
    kinds = {r.data.tags[tracking.TAG_KIND]: r.info.status for r in runs}
    assert kinds == {"pipeline": "FAILED", "stage": "FAILED"}


def test_a_failed_stage_whose_run_cannot_be_closed_still_fails_its_parent(store: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run is terminated on its own: a store error closing the stage run leaves the parent FAILED,
    not RUNNING."""
    from mlflow import MlflowClient

    real = MlflowClient.set_terminated
    refused: list[str] = []

    def refuse_stage_runs(self, run_id, status=None, end_time=None):
        if self.get_run(run_id).data.tags.get(tracking.TAG_KIND) == "stage":
            refused.append(run_id)
            raise RuntimeError("store hiccup")
        return real(self, run_id, status, end_time)

    monkeypatch.setattr(MlflowClient, "set_terminated", refuse_stage_runs)
    with pytest.raises(RuntimeError, match="boom"):
        with tracked_stage("train", root=store, params={"profile": "cpu"}):
            raise RuntimeError("boom")
    monkeypatch.setattr(MlflowClient, "set_terminated", real)
    c = client(store)
    runs = c.search_runs([c.get_experiment_by_name("syncsafe").experiment_id])
    kinds = {r.data.tags[tracking.TAG_KIND]: r.info.status for r in runs}
    assert refused and kinds["pipeline"] == "FAILED"


def test_system_metrics_sampled_on_stage_run(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    with tracked_stage("train", root=store, system_metrics=True, collect=False) as st:
        deadline = time.monotonic() + 60  # until the monitor has logged a sample (0.2 s apart, however loaded)
        while time.monotonic() < deadline and "system/cpu_utilization_percentage" not in client(store).get_run(
                st.run_id).data.metrics:
            time.sleep(0.1)
        st.add(TrackedRun(regime="bursty", policy="fixed_h", seed=0, series={"loss": [(0, 1.0)]}))
    assert st.record is not None
    metrics = client(store).get_run(st.record.stage_run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics
    assert "system/system_memory_usage_megabytes" in metrics


def test_missing_artifact_warns_and_the_rest_is_logged(store: Path) -> None:
    present = write(store / "a.json")
    with pytest.warns(TrackingWarning, match="missing.json does not exist"):
        rec = track("schedules", [TrackedRun(policy="p", seed=0, artifacts=[present, store / "missing.json"])], root=store)
    assert rec is not None
    assert [a.path for a in client(store).list_artifacts(rec.run_ids[0])] == ["a.json"]
    with pytest.raises(TrackingError, match="missing.json"):
        track("schedules", [TrackedRun(artifacts=[store / "missing.json"])], root=store, strict=True)


# --------------------------------------------------------------------------- failure policy


@pytest.fixture
def unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    write(tmp_path / "runs" / "out.json", '{"done": true}')
    return tmp_path


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9", "sqlite:///{root}/runs/out.json/sub/mlflow.db"])
def test_unreachable_store_only_warns(unreachable: Path, monkeypatch: pytest.MonkeyPatch, uri: str) -> None:
    uri = uri.format(root=unreachable)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    runs = [TrackedRun(regime="bursty", policy="fixed_h", seed=0, artifacts=[unreachable / "runs" / "out.json"])]
    start = time.monotonic()
    with pytest.warns(TrackingWarning, match=r"could not start tracking at .*files on disk are complete") as caught:
        assert track("schedules", runs, root=unreachable) is None
    assert time.monotonic() - start < 10
    ours = [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]
    assert len(ours) == 1 and "\n" not in ours[0] and f"at {uri}: " in ours[0]
    assert (unreachable / "runs" / "out.json").read_text() == '{"done": true}'


def test_unreachable_store_raises_when_strict(unreachable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    with pytest.raises(TrackingError, match=r"stage 'schedules': could not start tracking at http://127.0.0.1:9"):
        track("schedules", [TrackedRun()], root=unreachable, strict=True)
    monkeypatch.setenv("SYNCSAFE_TRACKING_STRICT", "1")
    with pytest.raises(TrackingError):
        with tracked_stage("train", root=unreachable):
            pytest.fail("strict tracking must fail before the stage's work starts")


def test_tracking_off_touches_nothing(unreachable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCSAFE_TRACKING", "off")
    monkeypatch.setenv("SYNCSAFE_TRACKING_STRICT", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert track("schedules", [TrackedRun(seed=0)], root=unreachable) is None
    assert not (unreachable / "mlflow.db").exists()


# --------------------------------------------------------------------------- compare


def _item(policy: str, seed: int, value: float, *, draw: int | None = None, matched_to: str = "", regime: str = "bursty", n: int = 0) -> TrackedRun:
    return TrackedRun(
        regime=regime, policy=policy, seed=seed, draw=draw, matched_to=matched_to,
        metrics={"slo_violation_rate": value, "n_merges": n},
    )


def _log_compare_fixture(root: Path) -> None:
    runs = [
        _item("wa_diloco", 0, 0.10, n=10), _item("wa_diloco", 1, 0.20, n=12), _item("wa_diloco", 2, 0.30, n=14),
        _item("fixed_h", 0, 0.40), _item("fixed_h", 1, 0.50),
        _item("matched_random", 0, 0.10, draw=0, matched_to="wa_diloco"),
        _item("matched_random", 0, 0.20, draw=1, matched_to="wa_diloco"),
        _item("matched_random", 0, 0.60, draw=2, matched_to="wa_diloco"),
        _item("matched_random", 1, 0.30, draw=0, matched_to="wa_diloco"),
        _item("matched_random", 1, 0.50, draw=1, matched_to="wa_diloco"),
        _item("matched_random", 0, 0.70, draw=0, matched_to="fixed_h"),
        _item("matched_random", 2, 0.90, draw=0, matched_to="fixed_h"),  # fixed_h has no seed 2: unpaired
        _item("offline_bound", 0, 0.05, matched_to="wa_diloco"), _item("offline_bound", 1, 0.07, matched_to="wa_diloco"),
        _item("no_sync", 0, 0.01),
        _item("wa_diloco", 0, 0.90, regime="steady"),
    ]
    assert track("schedules", runs, root=root)


def test_compare_table_policy_by_seed_with_envelope(store: Path) -> None:
    _log_compare_fixture(store)
    table = compare_table("bursty", root=store).set_index(["policy", "matched_to"])
    assert list(table.index) == [("no_sync", ""), ("fixed_h", ""), ("wa_diloco", ""), ("offline_bound", "wa_diloco")]
    wa = table.loc[("wa_diloco", "")]
    assert (wa.seed_0, wa.seed_1, wa.seed_2, wa.n_seeds) == (0.10, 0.20, 0.30, 3)
    assert wa["mean"] == pytest.approx(0.20) and wa.sd == pytest.approx(0.10)
    assert (wa.mr_seed_0_min, wa.mr_seed_0_mean, wa.mr_seed_0_max) == pytest.approx((0.10, 0.30, 0.60))
    assert (wa.mr_seed_1_min, wa.mr_seed_1_mean, wa.mr_seed_1_max) == pytest.approx((0.30, 0.40, 0.50))
    assert math.isnan(wa.mr_seed_2_mean)
    assert wa.mr_draws == 5
    assert (wa.mr_min, wa.mr_mean, wa.mr_max) == pytest.approx((0.20, 0.35, 0.55))
    fixed = table.loc[("fixed_h", "")]
    assert math.isnan(fixed.seed_2) and fixed.n_seeds == 2
    assert fixed["mean"] == pytest.approx(0.45) and fixed.sd == pytest.approx(math.sqrt(0.005))
    assert (fixed.mr_draws, fixed.mr_min, fixed.mr_mean, fixed.mr_max) == (1, 0.70, 0.70, 0.70)
    assert math.isnan(fixed.mr_seed_2_mean)
    bound = table.loc[("offline_bound", "wa_diloco")]
    assert bound["mean"] == pytest.approx(0.06) and bound.mr_draws == 0 and math.isnan(bound.mr_mean)
    assert math.isnan(table.loc[("no_sync", "")].sd)

    merges = compare_table("bursty", "n_merges", root=store).set_index(["policy", "matched_to"])
    assert merges.loc[("wa_diloco", ""), "mean"] == 12 and merges.loc[("wa_diloco", ""), "sd"] == 2
    both = compare_table(None, root=store)
    assert sorted(set(both.regime)) == ["bursty", "steady"]

    md = render_table(compare_table("bursty", root=store))
    assert "| regime | policy | matched_to | seed 0 | seed 1 | seed 2 | mean ± sd |" in md
    assert "| bursty | wa_diloco |  | 0.1 (0.1 / 0.3 / 0.6) | 0.2 (0.3 / 0.4 / 0.5) | 0.3 | 0.2 ± 0.1 | 0.2 / 0.35 / 0.55 (5) |" in md
    csv = render_table(compare_table("bursty", root=store), "csv")
    assert csv.splitlines()[0].startswith("regime,policy,matched_to,backend,seed_0,seed_1,seed_2,n_seeds,mean,sd,mr_draws")
    assert "bursty,wa_diloco,,,0.1,0.2,0.3,3,0.2,0.1,5,0.2,0.35,0.55," in csv


def test_compare_uses_latest_run_and_asks_for_a_stage(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _log_compare_fixture(store)
    monkeypatch.setenv("SYNCSAFE_PIPELINE_RUN_ID", "night-2")  # the nightly rerun changes one result
    assert track("schedules", [_item("wa_diloco", 0, 0.16)], root=store)
    wa = compare_table("bursty", root=store).set_index("policy").loc["wa_diloco"]
    assert wa.seed_0 == 0.16 and wa["mean"] == pytest.approx(0.22) and wa.sd == pytest.approx(math.sqrt(0.0052))
    first = compare_table("bursty", pipeline_run="night-1", root=store).set_index("policy").loc["wa_diloco"]
    assert first.seed_0 == 0.10
    assert track("replay", [_item("wa_diloco", 0, 0.5)], root=store)
    with pytest.raises(ValueError, match="logged by stages replay, schedules"):
        compare_table("bursty", root=store)
    assert compare_table("bursty", stage="replay", root=store).seed_0.tolist() == [0.5]
    with pytest.raises(ValueError, match="--metric 'nope': no tracked run has it"):
        compare_table("bursty", "nope", root=store)


def test_compare_without_store_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(FileNotFoundError, match="no tracking store"):
        compare_table(root=tmp_path)
    assert not (tmp_path / "mlflow.db").exists()


# --------------------------------------------------------------------------- helpers


def test_params_helpers(params) -> None:
    section = tracking.section_params(params, ["seeds", "merge", "regimes.bursty"])
    flat = tracking.flatten_params(section)
    assert flat["seeds"] == "[0, 1]"
    assert flat["merge.window_s"] == str(params.merge.window_s)
    assert flat["regimes.bursty.kind"] == "bursty"
    assert not any(k.startswith("control") for k in flat)
    with pytest.raises(KeyError, match="regimes.nope"):
        tracking.section_params(params, ["regimes.nope"])


def test_provenance_helpers(tmp_path: Path, repo_root: Path) -> None:
    assert tracking.git_commit(tmp_path) == ""
    assert tracking.dvc_lock_md5(tmp_path) == ""
    write(tmp_path / "dvc.lock", "schema: '2.0'\n")
    assert tracking.dvc_lock_md5(tmp_path) == hashlib.md5(b"schema: '2.0'\n").hexdigest()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True)
    if head.returncode != 0:  # not a git checkout (e.g. an sdist): nothing to compare with
        assert tracking.git_commit(repo_root) == ""
    else:
        assert tracking.git_commit(repo_root) == head.stdout.strip()
    assert tracking.artifact_location("http://h:5000", tmp_path) is None
    assert tracking.artifact_location("sqlite:////x/y/mlflow.db", tmp_path, "exp") == "file:///x/y/mlartifacts/exp"
    assert tracking.redact("https://u:secret@h/x") == "https://***@h/x"


def test_a_small_pipeline_run_leaves_its_stage_and_item_runs(store, params_file, params, cli):
    """traces → schedules → simulator replay through the CLI, tracking on: one parent, nested runs, tags, artifacts."""
    os.environ["SYNCSAFE_PIPELINE_RUN_ID"] = "pytest-pipeline"
    try:
        common = ["--params", str(params_file), "--root", str(store.parent)]
        cli("traces", "--regime", "bursty", *common)
        cli("schedules", "build", "--regime", "bursty", *common)
        cli("replay", "run", "--backend", "simulator", "--regime", "bursty", *common)
    finally:
        del os.environ["SYNCSAFE_PIPELINE_RUN_ID"]
    runs = mlflow.search_runs(search_all_experiments=True, output_format="pandas", max_results=5000)
    assert set(runs["tags.syncsafe.pipeline_run_id"]) == {"pytest-pipeline"}
    kinds = runs["tags.syncsafe.run_kind"].value_counts()
    assert kinds["pipeline"] == 1 and kinds["stage"] == 3
    items = runs[runs["tags.syncsafe.run_kind"] == "item"]
    for tag in RUN_TAGS:
        assert f"tags.{tag}" in items.columns
    # one run per regime x policy x seed: the controllers and no-sync; draws and references inside their controller's
    replays = items[items["tags.stage"] == "replay-simulator"]
    assert len(replays) == len(params.seeds) * (len(params.control.policies) + 1)
    assert set(replays["tags.draw"]) == {""} and set(replays["tags.matched_to"]) == {""}
    controllers = replays[replays["tags.policy"] != "no_sync"]
    assert (controllers["metrics.matched_random.n"] == params.schedules.random_draws).all()
    for stat in ("min", "mean", "max"):
        assert controllers[f"metrics.matched_random.slo_violation_rate.{stat}"].between(0, 1).all()
    assert (controllers["metrics.matched_random.slo_violation_rate.min"]
            <= controllers["metrics.matched_random.slo_violation_rate.max"]).all()
    assert controllers["metrics.slo_oracle.slo_violation_rate"].notna().all()
    fixed = items[(items["tags.stage"] == "schedules") & (items["tags.policy"] == "fixed_h")]
    assert len(fixed) == 2 and fixed["metrics.n_merges"].gt(0).all()
    stages = runs[runs["tags.syncsafe.run_kind"] == "stage"]
    assert (stages.loc[stages["tags.stage"] == "schedules", "params.merge.window_s"] == "8.0").all()
    client = mlflow.MlflowClient()
    artifacts = [a.path for a in client.list_artifacts(fixed["run_id"].iloc[0])]
    assert "fixed_h.json" in artifacts and "derived.parquet" in artifacts
    derived = pd.read_parquet(client.download_artifacts(fixed["run_id"].iloc[0], "derived.parquet"))
    assert (derived["policy"] == "matched_random").sum() == params.schedules.random_draws
