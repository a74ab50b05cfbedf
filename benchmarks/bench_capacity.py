"""Benchmark: the real vLLM CPU server's capacity for bursty's token mix, per server knob, in one run.

Each setting is the shipped `replay.vllm.server_args` with some arguments added or replaced (`SETTINGS`, or
`--setting NAME=ARGS` given on the command line). For each, in turn, on one machine: a fresh server on the
replays' CPU placement (serving the untrained tiny model of the profile's architecture), warmed up until its
decode pace is stable, then the profile stage's own capacity measurement (`server_profile.measure_capacity`:
the search, its retries and its confirmation) for the regime's token mix. Printed: per setting the capacity
(requests/s, the confirmed lower bound), the light-load TTFT p95, the probes and the seconds it took, and the
capacity as a multiple of the first setting's.

    .venv/bin/python benchmarks/bench_capacity.py [--profile tiny] [--regime bursty] [--root /tmp/bench-capacity]

A knob that changes what a replay measures does not belong here: `--stream-interval N` sends the first token
and the last at once (TTFT and E2E keep their meaning; output tokens come from the usage chunk). Run it from the
repository root, alone on the machine: capacities measured beside other work are not evidence.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import yaml

from syncsafe.artifacts.traces import read_requests
from syncsafe.config import Params, load_params
from syncsafe.profiles import compose_file
from syncsafe.realarm.capacity import token_mix
from syncsafe.realarm.arm import open_arm
from syncsafe.realarm.server_profile import measure_capacity
from syncsafe.traces.stage import build_traces

REPO = Path(__file__).resolve().parents[1]
#: name -> server arguments set on top of the shipped ones (a flag given here replaces the shipped value).
SETTINGS: dict[str, list[str]] = {
    "shipped": [],
    "stream-interval 8": ["--stream-interval", "8"],
    "stream-interval 8, max-num-seqs 64": ["--stream-interval", "8", "--max-num-seqs", "64"],
}


def with_args(shipped: list[str], extra: list[str]) -> list[str]:
    """`shipped` with every flag of `extra` set: a flag with a value replaces the shipped value (or is appended),
    a flag without one (`--no-enable-prefix-caching`) is appended once."""
    out = list(shipped)
    i = 0
    while i < len(extra):
        flag = extra[i]
        if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            if flag in out:
                out[out.index(flag) + 1] = extra[i + 1]
            else:
                out += [flag, extra[i + 1]]
            i += 2
        else:
            out += [] if flag in out else [flag]
            i += 1
    return out


def bench_project(root: Path, raw: dict, regime: str, extra: list[str]) -> Params:
    """A fresh project under `root`: params `raw` with `extra` server arguments, and `regime`'s traces built."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    raw = {**raw, "replay": {**raw["replay"], "vllm": {**raw["replay"]["vllm"]}}}
    raw["replay"]["vllm"]["server_args"] = with_args(raw["replay"]["vllm"]["server_args"], extra)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(root / "params.yaml")
    build_traces(params, regime, root)
    return params


def measure(root: Path, raw: dict, regime: str, extra: list[str]) -> dict[str, float]:
    params = bench_project(root, raw, regime, extra)
    mix = token_mix([read_requests(root, regime, s) for s in params.seeds])
    started = time.monotonic()
    with open_arm(params, root, Path("server.log")) as arm:
        warmed = time.monotonic()
        arm.warm_up()
        measuring = time.monotonic()
        measured = measure_capacity(params, mix, None, arm)
    return {"capacity_rps": measured.capacity_rps, "light_ttft_p95_ms": measured.probes[0].ttft_p95_ms or 0.0,
            "probes": len(measured.probes), "start_s": warmed - started, "warmup_s": measuring - warmed,
            "capacity_s": time.monotonic() - measuring}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="tiny", help="profile overlay of params.yaml (tiny: a short warm-up)")
    parser.add_argument("--regime", default="bursty")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench-capacity"))
    parser.add_argument("--setting", action="append", default=[],
                        help="NAME=ARGS (space-separated server arguments), instead of the built-in settings")
    args = parser.parse_args()
    raw = compose_file(REPO / "params.yaml", [args.profile] if args.profile != "cpu" else [])
    raw["replay"]["vllm"]["python"] = str(REPO / raw["replay"]["vllm"]["python"])
    for regime in raw["regimes"].values():
        if regime.get("kind") == "trace":
            regime["path"] = str(REPO / regime["path"])
    settings = dict(s.split("=", 1) for s in args.setting) if args.setting else None
    chosen = {k: v.split() for k, v in settings.items()} if settings else SETTINGS
    results = {}
    for i, (name, extra) in enumerate(chosen.items()):
        results[name] = measure(args.root / f"setting-{i}", raw, args.regime, extra)
        r = results[name]
        print(f"{name}: capacity {r['capacity_rps']:.3g} req/s ({r['probes']} probes, light TTFT p95 "
              f"{r['light_ttft_p95_ms']:.0f} ms); start {r['start_s']:.0f} s, warm-up {r['warmup_s']:.0f} s, "
              f"capacity {r['capacity_s']:.0f} s", flush=True)
    base = next(iter(results.values()))["capacity_rps"]
    print(f"\n| setting | {args.regime} capacity (req/s) | x first | light TTFT p95 (ms) | probes |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['capacity_rps']:.3g} | {r['capacity_rps'] / base:.2f} | {r['light_ttft_p95_ms']:.0f} "
              f"| {r['probes']} |")


if __name__ == "__main__":
    main()
