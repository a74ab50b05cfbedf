"""Benchmark: the live controller's scrape + decide latency on the wall clock (target: p99 <= 5 ms).

Two paths, each timed per control cycle over every controller policy:

- critical path (what a decision waits for in `syncsafe live`): the newest
  sample and the samples since the last decision from the scraper's memory
  (`LiveSignals.at` / `between`), `policy.observe` and `policy.decide`;
- synchronous: one full scrape (`GET /health`, `GET /metrics` over the
  scraper's keep-alive connection, parse, rates) and then the decision, as
  if nothing ran in the background.

The scrape goes to `--url` (a running vLLM server) or, by default, to the
tests' stand-in in its own process (tests/support/exposition_server.py: HTTP/1.1 keep-alive, answering
with the /metrics text recorded from the real vLLM CPU server,
tests/fixtures/vllm_metrics_busy.txt), so it runs anywhere. The last two
lines pool every policy's cycles.

    python benchmarks/bench_live.py [--cycles 2000] [--url http://127.0.0.1:PORT]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from syncsafe.config import load_params
from syncsafe.control.live_signals import LiveSignals, SignalSettings, http_fetch
from syncsafe.control.policies import build_policy
from syncsafe.control.serving_model import load_calibration
from syncsafe.control.types import ClockState, LearnerReport

REPO = Path(__file__).resolve().parents[1]
STAND_IN = REPO / "tests" / "support" / "exposition_server.py"  # the recorded-exposition stand-in the tests use


@contextmanager
def stand_in_server():
    """The stand-in in its own process (as a real server is: no GIL shared with the scraper); yields its url."""
    proc = subprocess.Popen([sys.executable, str(STAND_IN)], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        if not url.startswith("http://"):
            raise SystemExit(f"the stand-in {STAND_IN} did not start (exit {proc.poll()})")
        yield url
    finally:
        proc.terminate()
        proc.wait()


def _stats(values_us: list[float]) -> str:
    v = np.asarray(values_us) / 1000.0
    return f"p50 {np.percentile(v, 50):6.3f} ms   p99 {np.percentile(v, 99):6.3f} ms   max {v.max():6.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default=str(REPO / "params.yaml"))
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--url", default=None, help="a running vLLM server; default: a local server of the recorded text")
    args = ap.parse_args()
    params = load_params(args.params)
    stack = ExitStack()
    url = args.url or stack.enter_context(stand_in_server())
    live = params.live
    cfg = SignalSettings(time_scale=live.time_scale, window_s=live.signal_window_s, capacity_seqs=live.capacity_seqs,
                         reference_rps=live.reference_rps, busy_pressure=live.busy_pressure)
    start = time.time()
    signals = LiveSignals(http_fetch(url, 1.0), start, cfg, live.scrape_interval_s, live.stale_after_s)
    for _ in range(50):  # a history like a running sidecar's: scrapes 1/50 s apart here
        signals.scrape_once()
        time.sleep(0.02)
    reports = [LearnerReport(i, 5.0, 4.9, 1024, 4) for i in range(params.train.islands)]
    calibration = load_calibration(params.control.calibrated.calibration)
    print(f"{args.cycles} cycles per policy, scrapes from {url if args.url else 'the recorded exposition'}")
    all_critical, all_full = [], []
    for name in params.control.policies:
        policy = build_policy(name, params.control, params.merge, 0, calibration,
                              live.scrape_interval_s * live.time_scale)
        critical, full = [], []
        last = 0.0
        for cycle in range(args.cycles):
            now = signals.at(0.0).t_s
            clock = ClockState(t_s=now, step=4 * (cycle + 1), steps_since_merge=4 + 4 * (cycle % 3),
                               min_h=params.control.min_h, max_h=params.control.max_h, cycle=cycle)
            t0 = time.perf_counter()
            policy.observe(signals.between(last, now))
            policy.decide(reports, signals.at(now), clock)
            critical.append((time.perf_counter() - t0) * 1e6)
            last = now
            t0 = time.perf_counter()
            signals.scrape_once()
            policy.observe(signals.between(last, signals.at(0.0).t_s))
            policy.decide(reports, signals.at(0.0), clock)
            full.append((time.perf_counter() - t0) * 1e6)
            last = signals.at(0.0).t_s
        print(f"{name:16s} critical path: {_stats(critical)}")
        print(f"{'':16s} scrape + decide: {_stats(full)}")
        all_critical += critical
        all_full += full
    print(f"{'every policy':16s} critical path: {_stats(all_critical)}")
    print(f"{'':16s} scrape + decide: {_stats(all_full)}")
    stack.close()


if __name__ == "__main__":
    main()
