"""Wall time of `analyze_runs` on a constructed table of GPU-profile size.

10 seeds x 8 policies (no_sync, offline_bound and 6 controllers incl.
fixed_h) x 20 matched-random draws per controller run x 3 regimes, seeded.
Usage: python benchmarks/bench_analysis.py [--repeats N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from syncsafe.analysis import MechanismEvidence, analyze_runs
from syncsafe.analysis.synthetic import synthetic_runs

REGIMES = ("bursty", "steady", "pressure_heavy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = synthetic_runs(regimes=REGIMES, n_seeds=10, n_draws=20, seed=0)
    mechanism = MechanismEvidence(regimes={r: {"sync_ratio": 1.3, "pressure_ratio": 1.6} for r in REGIMES})
    print(f"runs table: {len(runs)} rows, {runs['policy'].nunique() - 1} policies + matched_random draws")
    timings = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            analyze_runs(runs, Path(out), mechanism)
            timings.append(time.perf_counter() - start)
    print(f"analyze_runs wall time: best {min(timings):.2f} s, all {[round(t, 2) for t in timings]}")


if __name__ == "__main__":
    main()
