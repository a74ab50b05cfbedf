"""Benchmark: controller decision latency and stress-harness wall time.

Runs every controller policy over 10 seeds × the shipped regimes (trace regimes: their segments) on the
learner-progress model, timing each `policy.decide` call and the whole
harness (controller schedules only; derived schedules are timed separately).

    python benchmarks/bench_controller.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from syncsafe.config import TraceRegime, load_params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.derive import matched_random, offline_bound
from syncsafe.schedules.schedule import LoadIntegral
from syncsafe.schedules.stage import run_harness
from syncsafe.traces.timeline import generate_timeline
from syncsafe.traces.trace_regime import build_trace_sets


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    params = load_params(args.params)
    latencies: dict[str, list[float]] = {}
    derive_s = 0.0
    start = time.perf_counter()
    runs = 0
    for regime, cfg in params.regimes.items():
        if isinstance(cfg, TraceRegime):  # each seed a segment of the recorded trace
            cuts = build_trace_sets(params.model_copy(update={"seeds": list(range(args.seeds))}), regime)
        for seed in range(args.seeds):
            if isinstance(cfg, TraceRegime):
                timeline = cuts[seed].timeline
            else:
                timeline = generate_timeline(regime, cfg, params.traces.step_s, seed)
            space = ActionSpace.of_params(params, regime)
            for policy in params.control.policies:
                schedule, result = run_harness(params, regime, policy, seed, timeline)
                latencies.setdefault(policy, []).extend(result.decide_us)
                runs += 1
                t0 = time.perf_counter()
                offline_bound(schedule, LoadIntegral(timeline))
                for draw in range(params.schedules.random_draws):
                    matched_random(schedule, draw, space)
                derive_s += time.perf_counter() - t0
    wall = time.perf_counter() - start
    print(f"harness: {runs} runs ({len(params.regimes)} regimes × {args.seeds} seeds × "
          f"{len(params.control.policies)} policies) in {wall:.2f} s wall "
          f"({wall - derive_s:.2f} s controller, {derive_s:.2f} s offline bound + "
          f"{params.schedules.random_draws} matched-random draws)")
    print(f"{'policy':16s} {'decisions':>9s} {'p50 us':>8s} {'p99 us':>8s} {'max us':>8s}")
    for policy, lat in latencies.items():
        a = np.asarray(lat)
        print(f"{policy:16s} {a.size:9d} {np.percentile(a, 50):8.1f} {np.percentile(a, 99):8.1f} {a.max():8.1f}")
    if "wa_lookahead" in latencies:
        p99 = float(np.percentile(latencies["wa_lookahead"], 99))
        print(f"wa_lookahead decision latency p99 {p99:.1f} us (target <= 1000 us): {'met' if p99 <= 1000 else 'MISSED'}")


if __name__ == "__main__":
    main()
