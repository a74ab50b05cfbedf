"""Benchmark: a vLLM CPU server's start and per-request latency, with and without graph capture.

For each setting (the shipped `replay.vllm.server_args` of the tiny profile, then the same with
`--enforce-eager`) a fresh project serves the tiny untrained model with its own empty compile
cache, on the split CPU placement the replays use: seconds from launch to a healthy server, then
`--requests` sequential completions (48 prompt tokens, 24 output tokens, the first five left out as
warm-up) and their median and minimum E2E. The tests serve eagerly where the server's speed is not
what they check (`tests/support/vllm_env.py`); this is where that trade is measured.

    .venv/bin/python benchmarks/bench_vllm_start.py [--requests 30] [--root /tmp/bench-vllm-start]

Run it from the repository root (`replay.vllm.python` is relative to it).

Measure alone on the machine: latencies taken beside other work are not evidence.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from syncsafe.config import load_params
from syncsafe.profiles import compose_file
from syncsafe.serving.placement import CpuPlacement
from syncsafe.realarm.arm import build_untrained_model
from syncsafe.serving.vllm_server import VllmServer, resolve_python

REPO = Path(__file__).resolve().parents[1]
WARMUP_REQUESTS = 5


def measure(root: Path, extra_args: list[str], n_requests: int) -> dict[str, float]:
    """Start-up seconds and sequential E2E (ms) of one server start in a fresh project at `root`."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump(compose_file(REPO / "params.yaml", ["tiny"])))
    params = load_params(root / "params.yaml")
    model = build_untrained_model(params, root)
    placement = CpuPlacement.split(params.replay.vllm.client_cpus)
    server = VllmServer(resolve_python(params.replay.vllm.python), model, root / "server.log",
                        [*params.replay.vllm.server_args, *extra_args], 900, cache_dir=root / "vllm-cache",
                        placement=placement, scratch_root=root)
    started = time.monotonic()
    with placement.pinned_client(), server:
        ready_s = time.monotonic() - started
        body = {"model": server.served_name, "prompt": list(range(3, 51)), "max_tokens": 24, "ignore_eos": True,
                "temperature": 0.0}
        request = urllib.request.Request(f"{server.base_url}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        e2e_ms = []
        for _ in range(n_requests):
            sent = time.monotonic()
            with urllib.request.urlopen(request, timeout=60) as reply:  # raises on an HTTP error
                reply.read()
            e2e_ms.append((time.monotonic() - sent) * 1000.0)
    kept = e2e_ms[WARMUP_REQUESTS:]
    return {"ready_s": ready_s, "median_ms": statistics.median(kept), "min_ms": min(kept)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--root", type=Path, default=Path("/tmp/bench-vllm-start"))
    args = ap.parse_args()
    if args.requests <= WARMUP_REQUESTS:
        ap.error(f"--requests must exceed the {WARMUP_REQUESTS} warm-up requests")
    print("| server | start s | E2E median ms | E2E min ms |\n|---|---|---|---|")
    for name, extra in (("graph capture (shipped)", []), ("--enforce-eager", ["--enforce-eager"])):
        got = measure(args.root / name.split()[0].strip("-"), extra, args.requests)
        print(f"| {name} | {got['ready_s']:.1f} | {got['median_ms']:.1f} | {got['min_ms']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
