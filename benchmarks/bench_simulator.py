"""Benchmark: simulated requests per second of the simulator serving backend.

Stretches each regime of params.yaml until its request table holds about N
requests, then replays it under three schedules of the same seed: no-sync, a
fixed merge cadence (one `merge.window_s` merge every `control.fixed_h.h`
inner steps) and a matched-random draw of that cadence. Only
`simulate_replay` is timed (trace generation is not), in wall seconds and in
the process's CPU seconds (the one-core rate on a busy machine).

    python benchmarks/bench_simulator.py [--sizes 100000 1000000] [--regimes bursty]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from syncsafe.config import Params, load_params
from syncsafe.schedules.derive import matched_random_free, no_sync
from syncsafe.schedules.schedule import Schedule
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.simulator import simulate_replay
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng

SEED = 0


def stretched_duration_s(params: Params, regime: str, n_requests: int) -> float:
    """A duration (whole periods of the regime, whole timeline steps) that yields ~n_requests."""
    cfg = params.regimes[regime]
    mean_rate = float(generate_timeline(regime, cfg, params.traces.step_s, SEED)["arrival_rate"].mean())
    unit = getattr(cfg, "period_s", cfg.duration_s)
    return math.ceil(n_requests / mean_rate / unit) * unit


def fixed_cadence(params: Params, regime: str, duration_s: float) -> Schedule:
    """One merge every fixed_h inner steps, as the fixed_h controller would place them."""
    every_s = params.control.fixed_h.h * params.control.step_s
    window_s = params.merge.window_s
    starts = np.arange(every_s, duration_s - window_s, every_s)
    return Schedule(
        regime=regime, policy="fixed_h", seed=SEED, source="harness", duration_s=duration_s,
        window_s=window_s, min_gap_s=params.merge.min_gap_s, merge_starts_s=starts.tolist(),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--regimes", nargs="+", default=["bursty"])
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    params = load_params(args.params)
    calibration = Calibration()
    step_s = params.traces.step_s
    print(f"{'regime':15s} {'requests':>9s} {'schedule':15s} {'merges':>6s} {'seconds':>8s} "
          f"{'requests/s':>11s} {'per CPU s':>11s} {'p95 E2E ms':>10s}")
    for regime in args.regimes:
        for size in args.sizes:
            duration_s = stretched_duration_s(params, regime, size)
            cfg = params.regimes[regime].model_copy(update={"duration_s": duration_s})
            timeline = generate_timeline(regime, cfg, step_s, SEED)
            requests = generate_requests(timeline, params.traces.requests, step_s, regime_rng(regime, SEED, "requests"))
            cadence = fixed_cadence(params, regime, duration_s)
            schedules = (
                no_sync(regime, SEED, duration_s, params.merge.window_s, params.merge.min_gap_s),
                cadence,
                matched_random_free(cadence, draw=0),
            )
            for schedule in schedules:
                start, cpu = time.perf_counter(), time.process_time()
                replay = simulate_replay(requests, timeline, schedule, calibration, SEED)
                seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
                print(f"{regime:15s} {len(requests):9d} {schedule.policy:15s} {schedule.n_merges:6d} "
                      f"{seconds:8.2f} {len(requests) / seconds:11,.0f} {len(requests) / cpu_s:11,.0f} "
                      f"{np.percentile(replay['e2e_ms'], 95):10.0f}")


if __name__ == "__main__":
    main()
