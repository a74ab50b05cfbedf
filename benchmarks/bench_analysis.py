"""Wall time of the evidence protocol at GPU-profile size, and of the SLO oracle per schedule.

1. `analyze_runs` on a constructed table: 10 seeds x 8 controllers x 20
   matched-random draws (plus even cadence, SLO oracle and offline bound per
   controller run) x 3 regimes, seeded.
2. `slo_oracle` on real default-params inputs (bursty, 600 s, harness
   controllers, 20 draws each, shipped calibration): seconds per controller
   schedule and simulator evaluations spent.

Usage: python benchmarks/bench_analysis.py [--repeats N] [--oracle-seeds N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from syncsafe.analysis import MechanismEvidence, analyze_runs
from syncsafe.analysis.synthetic import DEFAULT_EFFECTS, synthetic_runs
from syncsafe.config import load_params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import matched_random
from syncsafe.schedules.stage import run_harness
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.metrics import derive_slo, violation_mask
from syncsafe.serving.oracle import slo_oracle
from syncsafe.serving.simulator import simulate_replay
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng

REGIMES = ("bursty", "steady", "pressure_heavy")
EFFECTS = {**DEFAULT_EFFECTS, "wa_seasonal": -0.03, "wa_lookahead": -0.04}


def bench_protocol(repeats: int) -> None:
    runs = synthetic_runs(regimes=REGIMES, effects=EFFECTS, n_seeds=10, n_draws=20, seed=0)
    mechanism = MechanismEvidence(regimes={r: {"sync_ratio_paired": 1.3, "drift_ratio": 1.0, "gate_ratio": 1.3,
                                                "gate_ratio_ci_low": 1.2} for r in REGIMES})
    print(f"runs table: {len(runs)} rows, {len(EFFECTS)} controllers x 10 seeds x 20 draws x {len(REGIMES)} regimes")
    timings = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            analyze_runs(runs, Path(out), mechanism, primary=("wa_diloco", "bursty"))
            timings.append(time.perf_counter() - start)
    print(f"analyze_runs wall time: best {min(timings):.2f} s, all {[round(t, 2) for t in timings]}")


def bench_oracle(seeds: int) -> None:
    params = load_params()
    regime = "bursty"
    space = ActionSpace.of_params(params, regime)
    calibration = Calibration()
    seconds, evals, gains = [], [], []
    for seed in range(seeds):
        timeline = generate_timeline(regime, params.regimes[regime], params.traces.step_s, seed)
        requests = generate_requests(timeline, params.traces.requests, params.traces.step_s,
                                     regime_rng(regime, seed, "requests"))
        for policy in params.control.policies:
            controller, _ = run_harness(params, regime, policy, seed, timeline)
            empty = controller.model_copy(update={"merge_starts_s": []})
            slo = derive_slo(simulate_replay(requests, timeline, empty, calibration, seed), params.replay.slo.multiplier)
            rivals = []
            for draw in range(params.schedules.random_draws):
                d = matched_random(controller, draw, space)
                rivals.append((d, int(violation_mask(simulate_replay(requests, timeline, d, calibration, seed), slo).sum())))
            start = time.perf_counter()
            found = slo_oracle(controller, space, requests, timeline, calibration, seed, slo, rivals,
                               max_evals=params.replay.simulator.oracle_evals)
            seconds.append(time.perf_counter() - start)
            evals.append(found.evaluations)
            gains.append(min(c for _, c in rivals) - found.violations)
    s = np.asarray(seconds)
    print(f"slo_oracle: {s.size} controller schedules ({len(requests)} requests each): {np.median(s):.2f} s median, "
          f"{s.max():.2f} s max per schedule, {np.mean(evals):.1f} simulator evaluations on average; "
          f"violations below the best of {params.schedules.random_draws} draws: median {np.median(gains):.0f}, "
          f"min {min(gains)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--oracle-seeds", type=int, default=2)
    args = parser.parse_args()
    bench_protocol(args.repeats)
    bench_oracle(args.oracle_seeds)


if __name__ == "__main__":
    main()
