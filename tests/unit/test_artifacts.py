"""The artifact contract: the layout is spelled once, readers and writers round-trip, bad files name themselves."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from syncsafe import io
from syncsafe.artifacts import ArtifactError, ArtifactMalformed, ArtifactMissing, layout
from syncsafe.artifacts import calibration as cal_files
from syncsafe.artifacts import replay_sets, reports, schedule_sets, traces, train_runs
from syncsafe.artifacts.schedules import Schedule, ScheduleError, read_schedule, write_schedule
from syncsafe.errors import BadInput

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "syncsafe"

# --------------------------------------------------------------------------- layout


def test_relative_and_anchored_forms_agree(tmp_path):
    assert layout.traces_rel("bursty") == Path("data/traces/bursty")
    assert layout.train_rel("bursty") == Path("runs/train/bursty")
    assert layout.schedule_set_rel("bursty") == Path("runs/schedule-sets/bursty")
    assert layout.replay_set_rel(layout.SIMULATOR, "bursty") == Path("runs/replay-sets/simulator/bursty")
    assert layout.SCHEDULE_INDEX == Path("runs/schedules/index.csv") and layout.REPLAY_INDEX == Path("runs/replay/index.csv")
    assert layout.FITTED_CALIBRATION == Path("runs/calibration/calibration.json")
    run = layout.train_run_dir(tmp_path, "bursty", "fixed_h", 3)
    assert run == tmp_path / "runs/train/bursty/fixed_h/seed-3" == layout.at(tmp_path, layout.train_rel("bursty", "fixed_h", 3))
    assert layout.train_run_key(run) == ("bursty", "fixed_h", 3)
    assert layout.timing_path(run) == tmp_path / "logs/train/bursty/fixed_h/seed-3/timing.json"
    assert layout.trace_dir(tmp_path, "bursty", 0) == tmp_path / "data/traces/bursty/seed-0"
    assert layout.live_dir(tmp_path, "bursty", 1) == tmp_path / "runs/live/bursty/seed-1"
    assert layout.reports_dir(tmp_path) / layout.POLICY_TABLE_FILE == tmp_path / "reports/policy_table.csv"


def test_schedule_files_and_their_replays():
    rel = layout.schedule_rel("bursty", 0, "matched_random", "fixed_h", 7)
    assert rel == Path("runs/schedule-sets/bursty/seed-0/matched_random/fixed_h-007.json")
    assert layout.schedule_rel("bursty", 0, "harness", "fixed_h") == Path("runs/schedule-sets/bursty/seed-0/fixed_h.json")
    assert layout.schedule_rel("bursty", 0, "no_sync", "no_sync") == Path("runs/schedule-sets/bursty/seed-0/no_sync.json")
    assert layout.schedule_rel("b", 1, "even_cadence", "p") == Path("runs/schedule-sets/b/seed-1/even_cadence/p.json")
    replay = layout.replay_dir_for_schedule(Path("/r"), layout.VLLM, rel.as_posix())
    assert replay == Path("/r/runs/replay-sets/vllm/bursty/seed-0/matched_random/fixed_h-007")
    assert layout.replay_label(replay) == "matched_random/fixed_h-007"
    assert layout.slo_oracle_dir("/r", "b", 2, "p") == Path("/r/runs/replay-sets/simulator/b/seed-2/slo_oracle/p")
    with pytest.raises(ValueError, match="not a seed directory"):
        layout.parse_seed_dirname("fixed_h")


# --------------------------------------------------------------------------- round trips


def _timeline(n: int = 4) -> pd.DataFrame:
    return pd.DataFrame({c: [float(i) for i in range(n)] for c in traces.TIMELINE_COLUMNS})


def test_trace_set_round_trip(tmp_path):
    requests = pd.DataFrame({"arrival_s": [0.5, 1.5], "prompt_tokens": [10, 20], "output_tokens": [3, 4]})
    written = traces.write_trace_set(tmp_path, "tr", 1, _timeline(), requests, {"start_s": 0.0})
    assert [p.name for p in written] == ["timeline.parquet", "requests.parquet", "trace.json"]
    pd.testing.assert_frame_equal(traces.read_timeline(tmp_path, "tr", 1), _timeline())
    pd.testing.assert_frame_equal(traces.read_requests(tmp_path, "tr", 1), requests)
    assert traces.read_trace_info(tmp_path, "tr", 1) == {"start_s": 0.0}
    assert traces.read_trace_info(tmp_path, "missing", 1) is None


def _schedule(**kw) -> Schedule:
    base = dict(regime="bursty", policy="fixed_h", seed=0, source="train", duration_s=100.0, window_s=5.0,
                min_gap_s=1.0, merge_starts_s=[10.0, 40.0])
    return Schedule(**{**base, **kw})


def test_schedule_and_schedule_index_round_trip(tmp_path):
    schedule = _schedule(source="harness")
    rel = layout.schedule_rel("bursty", 0, schedule.source, schedule.policy)
    write_schedule(layout.at(tmp_path, rel), schedule)
    assert read_schedule(layout.at(tmp_path, rel)) == schedule
    rows = [{"regime": "bursty", "policy": "fixed_h", "seed": 0, "draw": None, "matched_to": None,
             "source": "harness", "n_merges": 2, "path": rel.as_posix()},
            {"regime": "bursty", "policy": "matched_random", "seed": 0, "draw": 3, "matched_to": "fixed_h",
             "source": "matched_random", "n_merges": 2, "path": "x.json"}]
    written = schedule_sets.write_set_index(tmp_path, "bursty", rows)
    pd.testing.assert_frame_equal(schedule_sets.read_set_index(tmp_path, "bursty"), written)
    joined = schedule_sets.write_schedule_index(tmp_path, rows)
    pd.testing.assert_frame_equal(schedule_sets.read_schedule_index(tmp_path), joined)
    assert joined["draw"].dtype == "Int64" and joined["draw"].isna().tolist() == [True, False]
    assert list(joined.columns) == list(schedule_sets.INDEX_COLUMNS)


@dataclass
class _Decision:
    t_s: float
    merge: bool


def test_train_run_round_trip(tmp_path):
    run = layout.train_run_dir(tmp_path, "bursty", "fixed_h", 0)
    write_schedule(run / layout.SCHEDULE_FILE, _schedule())
    train_runs.write_decisions(run / layout.DECISIONS_FILE, [_Decision(0.0, False), _Decision(5.0, True)])
    train_runs.write_losses(run, [(2, 1, 0.5), (1, 0, 1.0), (1, 1, 2.0), (2, 0, 1.5)])
    train_runs.write_merges(run, pd.DataFrame({"merge": [1], "step": [2], "bytes_communicated": [64], "t_s": [10.0],
                                               "eval_loss": [0.75]}))
    train_runs.write_timing(run, {"train_wall_s": 1.0})
    assert not train_runs.is_complete(run) and train_runs.complete_train_runs(tmp_path) == []
    train_runs.write_metrics(run, {"final_eval_loss": 0.7, "n_merges": 1})
    assert train_runs.is_complete(run)
    [found] = train_runs.complete_train_runs(tmp_path)
    assert (found.regime, found.policy, found.seed, found.path) == ("bursty", "fixed_h", 0, run)
    assert found.metrics == {"final_eval_loss": 0.7, "n_merges": 1}
    assert train_runs.read_decisions(run) == [{"t_s": 0.0, "merge": False}, {"t_s": 5.0, "merge": True}]
    assert train_runs.read_losses(run)[["step", "island"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1]]
    assert train_runs.read_timing(run) == {"train_wall_s": 1.0}
    assert train_runs.read_train_schedule(tmp_path, "bursty", "fixed_h", 0) == _schedule()
    assert train_runs.eval_losses(tmp_path).to_dict("records") == [
        {"regime": "bursty", "policy": "fixed_h", "seed": 0, "eval_loss": 0.7}]
    losses, merges = train_runs.loss_curves(tmp_path)
    assert losses["loss"].tolist() == [1.5, 1.0] and merges["eval_loss"].tolist() == [0.75]


def test_a_run_without_merges_reads_an_empty_merge_table(tmp_path):
    run = layout.train_run_dir(tmp_path, "b", "p", 1)
    train_runs.write_merges(run, pd.DataFrame())
    assert train_runs.read_merges(run).empty


def test_train_schedule_of_another_run_is_refused(tmp_path):
    run = layout.train_run_dir(tmp_path, "bursty", "fixed_h", 0)
    write_schedule(run / layout.SCHEDULE_FILE, _schedule(seed=1))
    with pytest.raises(ScheduleError, match=r"seed-0/schedule\.json: expected the train schedule"):
        train_runs.read_train_schedule(tmp_path, "bursty", "fixed_h", 0)


def _replay_row(path: str) -> dict:
    return {"regime": "bursty", "policy": "fixed_h", "seed": 0, "draw": pd.NA, "backend": "simulator",
            "slo_violation_rate": 0.1, "p95_ms": 100.0, "p99_ms": 120.0, "n_requests": 10, "n_failed": 0,
            "path": path, "matched_to": None, "source": "harness", "n_merges": 2, "schedule": "s.json",
            "ttft_p95_ms": 50.0, "sync_ratio_unpaired": 1.2, "pressure_ratio": 1.1, "requests_during_merges": 3,
            "tokens_per_s": 9.0, "goodput_rps": 1.0, "valid": True}


def test_replay_set_and_index_round_trip(tmp_path):
    out = layout.replay_dir_for_schedule(tmp_path, layout.SIMULATOR, "runs/schedule-sets/bursty/seed-0/fixed_h.json")
    requests = pd.DataFrame({"request_id": [0, 1], "e2e_ms": [10.0, 20.0]})
    summary = {"slo_violation_rate": 0.1, "e2e_p95_ms": 100.0, "e2e_p99_ms": 120.0, "n_requests": 2, "n_failed": 0}
    assert not replay_sets.is_complete(out)
    replay_sets.write_replay_files(out, requests, summary)
    assert replay_sets.is_complete(out) and replay_sets.read_summary(out) == summary
    pd.testing.assert_frame_equal(replay_sets.read_requests(out, ("request_id",)), requests)
    rel = out.relative_to(tmp_path).as_posix()
    set_index = replay_sets.write_set_index(layout.replay_set_dir(tmp_path, "simulator", "bursty") / "index.csv",
                                            [_replay_row(rel)])
    assert replay_sets.set_index_paths(tmp_path) == [tmp_path / "runs/replay-sets/simulator/bursty/index.csv"]
    replay_sets.write_replay_index(tmp_path, set_index)
    back = replay_sets.read_replay_index(tmp_path)
    assert list(back.columns) == [*replay_sets.INDEX_COLUMNS, *replay_sets.EXTRA_COLUMNS]
    assert back["path"].tolist() == [rel] and back["draw"].isna().all()


def test_vllm_index_with_repeats(tmp_path):
    replay_sets.write_set_index(layout.at(tmp_path, layout.VLLM_INDEX), [_replay_row("a")])
    replay_sets.write_set_index(layout.at(tmp_path, layout.VLLM_REPEATS), [_replay_row("a-repeat")])
    index = replay_sets.read_vllm_index(tmp_path)
    assert index["_repeat"].tolist() == [False, True] and index["path"].tolist() == ["a", "a-repeat"]
    assert replay_sets.read_vllm_index(tmp_path, repeats=False)["_repeat"].tolist() == [False]


def test_calibration_files_round_trip(tmp_path):
    from syncsafe.analysis.evidence import FidelityEvidence, MechanismEvidence
    from syncsafe.control.serving_model import Calibration, CalibrationError, load_calibration

    from syncsafe.analysis.calibration.refits import CalibrationRefits

    refits = CalibrationRefits(reason="no fit to refit")
    files = cal_files.write_calibration_dir(tmp_path, Calibration(), MechanismEvidence(regimes={}),
                                           {"fitted": False, "reason": "why"}, pd.DataFrame(), "# report\n", refits)
    assert sorted(files) == ["calibration.json", "fit.json", "mechanism.json", "refits.json", "report.md",
                             "transfer.csv"]
    assert cal_files.read_refits(tmp_path, CalibrationRefits) == refits
    assert load_calibration(layout.at(tmp_path, layout.FITTED_CALIBRATION)) == Calibration()
    assert cal_files.read_mechanism(tmp_path, MechanismEvidence) == MechanismEvidence(regimes={})
    assert cal_files.read_fit(tmp_path) == {"fitted": False, "reason": "why"}
    assert cal_files.read_fidelity(tmp_path, FidelityEvidence) is None
    with pytest.raises(CalibrationError, match=r"nope\.json: no calibration file") as err:
        load_calibration(tmp_path / "nope.json")
    assert isinstance(err.value, ArtifactMissing)


def test_report_readers(tmp_path):
    table = pd.DataFrame([{c: 1 for c in reports.CONTRACT_COLUMNS}])
    io.write_csv(reports.policy_table_path(tmp_path), table)
    io.write_json(layout.reports_dir(tmp_path) / layout.REPORT_METRICS_FILE, {"alpha": 0.05})
    assert list(reports.read_policy_table(tmp_path).columns) == list(reports.CONTRACT_COLUMNS)
    assert reports.read_report_metrics(tmp_path) == {"alpha": 0.05}


# --------------------------------------------------------------------------- bad files


def _one_line_naming(err: pytest.ExceptionInfo, path: Path) -> None:
    message = str(err.value)
    assert isinstance(err.value, BadInput) and "\n" not in message and message.startswith(str(path)), message


def test_missing_files_are_bad_input_naming_the_file_and_the_stage(tmp_path):
    with pytest.raises(ArtifactMissing, match="run the traces stage") as err:
        traces.read_timeline(tmp_path, "bursty", 0)
    _one_line_naming(err, layout.trace_dir(tmp_path, "bursty", 0) / "timeline.parquet")
    assert isinstance(err.value, FileNotFoundError)  # callers that test for a missing file keep working
    with pytest.raises(ArtifactMissing, match="run the replay stages first") as err:
        replay_sets.read_replay_index(tmp_path)
    _one_line_naming(err, tmp_path / "runs/replay/index.csv")
    with pytest.raises(ArtifactMissing, match="run the schedules stage first"):
        schedule_sets.read_schedule_index(tmp_path)
    with pytest.raises(ArtifactMissing, match="no trained schedule"):
        train_runs.read_train_schedule(tmp_path, "bursty", "fixed_h", 0)


@pytest.mark.parametrize("content", ["not,a\nreplay,index\n", "\x00\x01garbage"])
def test_a_malformed_index_names_the_file_and_what_it_lacks(tmp_path, content):
    path = layout.at(tmp_path, layout.REPLAY_INDEX)
    io.write_text(path, content)
    with pytest.raises(ArtifactMalformed, match="not a replay index") as err:
        replay_sets.read_replay_index(tmp_path)
    _one_line_naming(err, path)


def test_malformed_json_parquet_and_lines(tmp_path):
    run = layout.train_run_dir(tmp_path, "b", "p", 0)
    io.write_text(run / layout.METRICS_FILE, "{not json")
    with pytest.raises(ArtifactMalformed, match="not a train run metrics file") as err:
        train_runs.read_metrics(run)
    _one_line_naming(err, run / "metrics.json")
    io.write_text(run / layout.METRICS_FILE, "[1, 2]")
    with pytest.raises(ArtifactMalformed, match="expected a JSON object"):
        train_runs.read_metrics(run)
    io.write_text(run / layout.DECISIONS_FILE, '{"t_s": 0}\nnope\n')
    with pytest.raises(ArtifactMalformed, match="line 2"):
        train_runs.read_decisions(run)
    io.write_text(layout.trace_dir(tmp_path, "b", 0) / layout.TIMELINE_FILE, "not parquet")
    with pytest.raises(ArtifactMalformed, match="not a load timeline"):
        traces.read_timeline(tmp_path, "b", 0)
    io.write_parquet(layout.trace_dir(tmp_path, "b", 1) / layout.TIMELINE_FILE, pd.DataFrame({"t_s": [0.0]}))
    with pytest.raises(ArtifactMalformed, match="missing column.*'busy'"):
        traces.read_timeline(tmp_path, "b", 1)
    replay = tmp_path / "replay"
    io.write_json(replay / layout.SUMMARY_FILE, {"n_requests": 1})
    with pytest.raises(ArtifactMalformed, match="missing key.*'slo_violation_rate'"):
        replay_sets.read_summary(replay)


def test_a_malformed_schedule_is_bad_input_and_still_a_schedule_error(tmp_path):
    path = tmp_path / "s.json"
    io.write_json(path, {"regime": "b"})
    with pytest.raises(ScheduleError, match="not a valid schedule") as err:
        read_schedule(path)
    assert isinstance(err.value, ArtifactError)


# --------------------------------------------------------------------------- the layout is spelled once

#: Not the project's data layout: the shared team stack keeps its own directories under .team/.
OWN_LAYOUT = {"team/": "the team stack's state directory (.team/), not data/, runs/ or reports/"}

LAYOUT_PREFIXES = ("data/", "runs/", "reports/", "logs/", "models/", "seed-")
#: Names that spell the layout wherever they appear.
LAYOUT_NAMES = {
    "replay-sets", "schedule-sets", "runs/replay", "runs/schedules", "timeline.parquet", "requests.parquet",
    "trace.json", "decisions.jsonl", "losses.csv", "merges.csv", "summary.json", "index.csv", "signals.parquet",
    "windows.csv", "repeats.csv", "policy_table.csv", "envelope.csv", "calibration.json", "mechanism.json",
    "fidelity.json", "fit.json", "transfer.csv", "fidelity.csv", "loss_curves.csv", "timing.json", "schedule.json",
    "metrics.json", "serve-untrained", "vllm-cache", "slo_by_policy_envelope.png", "timeline_bursts_vs_merges.png",
    "loss_curves.png", "cdf.png", "report.md", "profile.json", "metrics.txt",
}
#: Names that spell the layout when a path is built from them (`x / "runs"`, `Path("data")`).
PATH_PART_NAMES = {"data", "runs", "reports", "logs", "models", "train", "traces", "calibration", "fidelity", "live",
                   "replay", "schedules", "checkpoints", "model", "tokenizer"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _path_parts(tree: ast.AST) -> set[int]:
    """Constants used to build a path: operands of `/` and arguments of Path(...) / joinpath(...)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            ids.update(id(side) for side in (node.left, node.right))
        elif isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in ("Path", "PurePath", "PurePosixPath", "joinpath"):
                ids.update(id(arg) for arg in node.args)
    return ids


def layout_spellings(source: str, label: str) -> list[str]:
    """`label:line: 'value'` for every string constant of `source` that spells a layout path."""
    tree = ast.parse(source)
    skip, parts = _docstrings(tree), _path_parts(tree)
    found = []
    for node in ast.walk(tree):
        # every string constant, the literal pieces of f-strings (f"seed-{seed}") included
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            value = node.value
            if (value.startswith(LAYOUT_PREFIXES) or value in LAYOUT_NAMES
                    or (value in PATH_PART_NAMES and id(node) in parts)):
                found.append(f"{label}:{node.lineno}: {value!r}")
    return found


def _allowed(rel: str) -> bool:
    return any(rel == entry or (entry.endswith("/") and rel.startswith(entry)) for entry in OWN_LAYOUT)


def test_no_module_but_the_layout_spells_a_layout_path():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "artifacts/layout.py" or _allowed(rel):
            continue
        offenders += layout_spellings(path.read_text(encoding="utf-8"), rel)
    assert not offenders, "spell these through syncsafe.artifacts.layout:\n" + "\n".join(offenders)


def test_the_check_finds_a_spelled_path():
    source = ('"""Docstrings may say runs/train/<regime>."""\nfrom pathlib import Path\n'
              'X = Path("runs") / "train"\nY = f"seed-{1}"\nZ = "index.csv"\nW = {"data": 1}\n')
    found = layout_spellings(source, "probe.py")
    assert sorted(found) == sorted(["probe.py:3: 'runs'", "probe.py:3: 'train'", "probe.py:4: 'seed-'",
                                    "probe.py:5: 'index.csv'"])


def test_artifacts_sits_at_the_bottom():
    """artifacts imports no syncsafe module but errors, io and itself (and only the data libraries)."""
    allowed_third_party = {"numpy", "pandas", "pyarrow", "pydantic", "yaml"}
    stdlib = set(__import__("sys").stdlib_module_names)
    for path in sorted((PACKAGE / "artifacts").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == "syncsafe":  # from syncsafe import io
                names = [f"syncsafe.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            for name in names:
                top = name.split(".")[0]
                if top == "syncsafe":
                    assert name in ("syncsafe.errors", "syncsafe.io") or name.startswith(
                        "syncsafe.artifacts"), f"{path.name} imports {name}"
                else:
                    assert top in stdlib or top in allowed_third_party or top == "__future__", f"{path.name}: {name}"


def test_merge_checkpoints_are_found_by_number(tmp_path):
    run = layout.train_run_dir(tmp_path, "bursty", "fixed_h", 0)
    for k in (12, 3, 100):
        layout.island_state_file(layout.merge_checkpoint_dir(run, k), 1).parent.mkdir(parents=True)
    assert [k for k, _ in layout.merge_checkpoint_dirs(run)] == [3, 12, 100]
    assert layout.merge_checkpoint_dirs(run)[0][1] == layout.merge_checkpoint_dir(run, 3)
    assert layout.latest_checkpoint_pointer(run).parent == layout.controller_state_file(
        layout.merge_checkpoint_dir(run, 3)).parent.parent
