"""Benchmark: what MLflow tracking costs each stage, and what one pipeline run leaves in the store.

Run it in a project where the pipeline has run (`make run`): it reruns the
named stage items with tracking off and on, alternating, `--reps` times
each, and prints the median wall time of each and the overhead (target:
tracking at most 10 % of a stage's wall time). The tracked runs go to a
fresh SQLite store in a temporary folder, never the project's. The stage
outputs are rewritten byte for byte (the stages are deterministic), and
dvc.lock is not touched. Then, with `--store`, it counts the runs of a
store and its size (target: at most 2,000 runs and 50 MB per default run).

    python benchmarks/bench_tracking.py [--item schedules@bursty ...] [--reps 3] [--store mlflow.db]

Measure alone on the machine: stage wall times taken beside other work are not evidence.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ITEMS = ["traces@bursty", "schedules@bursty", "replay-simulator@bursty", "replay-index", "analyze"]


def _argv(item: str) -> list[str]:
    stage, _, regime = item.partition("@")
    return [sys.executable, f"stages/{stage.replace('-', '_')}.py", *(["--regime", regime] if regime else [])]


def timed(item: str, tracking: bool, store: Path) -> float:
    env = {**os.environ, "SYNCSAFE_TRACKING": "on" if tracking else "off",
           "MLFLOW_TRACKING_URI": f"sqlite:///{store}", "SYNCSAFE_PIPELINE_RUN_ID": "bench-tracking"}
    started = time.perf_counter()
    done = subprocess.run(_argv(item), env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{item} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall


def store_facts(db: Path) -> dict[str, object]:
    with sqlite3.connect(db) as con:
        kinds = dict(con.execute("SELECT value, count(*) FROM tags WHERE key = 'syncsafe.run_kind' GROUP BY value"))
        runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    return {"runs": runs, "by_kind": kinds, "mb": round(db.stat().st_size / 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--item", action="append", help=f"stage item to time (default: {', '.join(DEFAULT_ITEMS)})")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--store", type=Path, help="a store to count runs and size of (e.g. mlflow.db)")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        store = Path(tmp) / "mlflow.db"
        for item in args.item or DEFAULT_ITEMS:
            walls: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.reps):
                for tracking in (False, True):
                    walls[tracking].append(timed(item, tracking, store))
            off, on = statistics.median(walls[False]), statistics.median(walls[True])
            results[item] = {"off_s": round(off, 2), "on_s": round(on, 2), "overhead": round(on / off - 1.0, 3)}
            print(f"{item:32s} off {off:7.2f} s   on {on:7.2f} s   tracking {100 * (on / off - 1):+5.1f} %", flush=True)
    if args.store:
        results["store"] = store_facts(args.store)
        print(f"store {args.store}: {results['store']}")
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
