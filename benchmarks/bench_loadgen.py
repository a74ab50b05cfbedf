"""Benchmark: does the open-loop load generator keep time beside a real vLLM server doing merge work?

Starts the vLLM CPU server on the locally built tiny model with the merge
workload beside it (as the replay stage does), sends a Poisson request
stream at several rates while merge windows cover half of the wall time
(8 s windows every 16 s), and prints the send lag (actual send - scheduled
arrival) p50 / p99 / max and the E2E p95, per rate. `--placement split`
(the stage's default: the server and its merge work on their own CPUs, the
client on another) or `--placement none` (everything wherever the OS puts
it, as before the split). Target: send lag p99 <= 50 ms on a quiet machine.

    python benchmarks/bench_loadgen.py [--rates 10 20 40] [--seconds 32] [--placement split|none]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("SYNCSAFE_TRACKING", "off")

from syncsafe.config import load_params  # noqa: E402
from syncsafe.serving.interference import MergeInterference  # noqa: E402
from syncsafe.serving.loadgen import replay_requests  # noqa: E402
from syncsafe.serving.placement import CpuPlacement  # noqa: E402
from syncsafe.realarm.arm import build_untrained_model  # noqa: E402
from syncsafe.serving.vllm_server import VllmServer, resolve_python  # noqa: E402

WINDOW_S, PERIOD_S = 8.0, 16.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0, 40.0])
    ap.add_argument("--seconds", type=float, default=32.0)
    ap.add_argument("--placement", choices=["split", "none"], default="split")
    args = ap.parse_args()
    params = load_params(args.params)
    cfg = params.replay.vllm
    placement = CpuPlacement.split(cfg.client_cpus) if args.placement == "split" else None
    with tempfile.TemporaryDirectory() as tmp:
        model = build_untrained_model(params, Path(tmp))
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        numel = (model / "model.safetensors").stat().st_size // 4
        started = time.perf_counter()
        server = VllmServer(resolve_python(cfg.python), model, Path(tmp) / "server.log", cfg.server_args,
                            cfg.startup_timeout_s, cache_dir=Path("models/vllm-cache").resolve(), placement=placement)
        pinned = placement.pinned_client() if placement is not None else contextlib.nullcontext()
        with pinned, server, MergeInterference(cfg.interference, cfg.interference_workers, numel,
                                               placement=placement) as work:
            print(f"server healthy after {time.perf_counter() - started:.0f} s; placement "
                  f"{placement.record() if placement else 'none'}")
            print(f"{'rate/s':>7s} {'requests':>8s} {'lag p50 ms':>10s} {'lag p99 ms':>10s} {'lag max ms':>10s} "
                  f"{'e2e p95 ms':>10s} {'merge windows':>13s}")
            for rate in args.rates:
                rng = np.random.default_rng(0)
                n = rng.poisson(rate * args.seconds)
                requests = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, args.seconds, n)),
                                         "prompt_tokens": 48, "output_tokens": 24})
                start = time.time() + 1.0
                windows = [(start + t, start + t + WINDOW_S) for t in np.arange(0.0, args.seconds, PERIOD_S)]
                work.submit(windows)
                raw = replay_requests(server.base_url, server.served_name, requests, start, 1.0, vocab, seed=0)
                worked = work.collect(timeout_s=args.seconds + 60)
                lag = (raw["send_epoch"] - raw["scheduled_epoch"]) * 1000.0
                print(f"{rate:7.0f} {n:8d} {lag.median():10.2f} {lag.quantile(0.99):10.2f} {lag.max():10.2f} "
                      f"{raw['e2e_ms'].quantile(0.95):10.0f} {len(worked):13d}")


if __name__ == "__main__":
    main()
