"""Test helper: several stage processes logging to one MLflow store at the same moment.

Each writer is a separate ``python`` process that imports the tracking code, says so
(a readiness file), waits for a shared start signal given once every writer is ready
(so that their writes overlap), then logs one stage run
with ``items`` item runs (a scalar metric and a short loss curve each) through
:func:`syncsafe.tracking.tracked_stage` in strict mode: any store failure exits 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

_WRITER = """
import sys, time
from pathlib import Path
from syncsafe.tracking import TrackedRun, tracked_stage

index, items, go, ready = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()  # imports done: MLflow and the tracking code are loaded
runs = [TrackedRun(regime="bursty", policy=f"writer{index}", seed=s, backend="parallel",
                   metrics={"value": index * 100 + s},
                   series={"loss": [(step, 1.0 / (step + 1 + s)) for step in range(25)]})
        for s in range(items)]
deadline = time.monotonic() + 300
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
with tracked_stage(f"parallel-{index}", root=".", params={"writer": {"index": index}}, sections=["writer"]) as stage:
    stage.extend(runs)
record = stage.record
assert record is not None and len(record.run_ids) == items, record
print("logged", len(record.run_ids))
"""


def run_writers(uri: str, n: int, items: int, workdir: Path, pipeline_run_id: str, timeout_s: float = 600,
                login: dict[str, str] | None = None) -> None:
    """Start ``n`` writers on ``uri`` (``login``: the server's MLFLOW_TRACKING_USERNAME/_PASSWORD), release them
    together, and assert that each one exited 0."""
    workdir.mkdir(parents=True, exist_ok=True)
    go = workdir / "go"
    go.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCSAFE_", "MLFLOW_")) and k != "DVC_STAGE"}
    env.update({
        "MLFLOW_TRACKING_URI": uri,
        "SYNCSAFE_TRACKING_STRICT": "1",
        "SYNCSAFE_PIPELINE_RUN_ID": pipeline_run_id,
        "PYTHONWARNINGS": "ignore::DeprecationWarning",
        **(login or {}),
    })
    ready = [workdir / f"ready-{i}" for i in range(n)]
    for path in ready:
        path.unlink(missing_ok=True)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(i), str(items), str(go), str(ready[i])], cwd=workdir,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(n)
    ]
    try:
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break  # a writer failed before it was ready: its exit is reported below
            time.sleep(0.05)
        go.touch()  # every writer is ready: their writes start together
        outs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [(i, p.returncode, out[-800:]) for i, (p, out) in enumerate(zip(procs, outs)) if p.returncode != 0]
    assert not failed, failed


def item_runs(uri: str, pipeline_run_id: str) -> dict[str, list]:
    """The store's runs of one pipeline run, by ``syncsafe.run_kind`` (pipeline, stage, item)."""
    from mlflow import MlflowClient

    from syncsafe.tracking import TAG_KIND, TAG_PIPELINE, experiment_name

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment_name())
    assert exp is not None, f"no experiment {experiment_name()!r} in {uri}"
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{TAG_PIPELINE}` = '{pipeline_run_id}'",
                              max_results=5000)
    out: dict[str, list] = {}
    for run in runs:
        out.setdefault(run.data.tags.get(TAG_KIND, ""), []).append(run)
    return out
