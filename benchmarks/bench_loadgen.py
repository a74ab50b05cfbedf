"""Benchmark: arrival-time accuracy of the open-loop load generator against a real vLLM server.

Starts the vLLM CPU server on the locally built tiny model, sends a Poisson
request stream at several rates (no merge work beside it) and prints the
send lag (actual send − scheduled arrival) p50 / p99 / max, and how many
requests were in flight at once.

    python benchmarks/bench_loadgen.py [--rates 5 20 50] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

os.environ.setdefault("SYNCSAFE_TRACKING", "off")

from syncsafe.config import load_params  # noqa: E402
from syncsafe.serving.loadgen import replay_requests  # noqa: E402
from syncsafe.serving.vllm_replay import build_untrained_model  # noqa: E402
from syncsafe.serving.vllm_server import VllmServer, resolve_python  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--rates", type=float, nargs="+", default=[5.0, 20.0, 50.0])
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    params = load_params(args.params)
    cfg = params.replay.vllm
    with tempfile.TemporaryDirectory() as tmp:
        model = build_untrained_model(params, Path(tmp))
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        started = time.perf_counter()
        with VllmServer(resolve_python(cfg.python), model, Path(tmp) / "server.log",
                        cfg.server_args, cfg.startup_timeout_s, cache_dir=Path("models/vllm-cache").resolve()) as server:
            print(f"server healthy after {time.perf_counter() - started:.0f} s")
            print(f"{'rate/s':>7s} {'requests':>8s} {'lag p50 ms':>10s} {'lag p99 ms':>10s} {'lag max ms':>10s} {'e2e p95 ms':>10s}")
            for rate in args.rates:
                rng = np.random.default_rng(0)
                n = rng.poisson(rate * args.seconds)
                requests = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, args.seconds, n)),
                                         "prompt_tokens": 48, "output_tokens": 24})
                start = time.time() + 1.0
                raw = replay_requests(server.base_url, server.served_name, requests, start, 1.0, vocab, seed=0)
                lag = (raw["send_epoch"] - raw["scheduled_epoch"]) * 1000.0
                print(f"{rate:7.0f} {n:8d} {lag.median():10.2f} {lag.quantile(0.99):10.2f} {lag.max():10.2f} "
                      f"{raw['e2e_ms'].quantile(0.95):10.0f}")


if __name__ == "__main__":
    main()
