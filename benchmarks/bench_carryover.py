"""Benchmark: does one replay leave the real server faster or slower for the next? Carry-over, per server knob.

A seed's no-sync controls replay the same arrivals. If a replay changes the server for the next one (a prefix
cache still holding the previous replay's prompts, a pace still settling), a control's latency depends on what
was replayed before it; if the server's pace wanders on its own, identical controls disagree anyway. This
benchmark measures both on one fresh server per setting, on the replays' CPU placement and warmed up as the
stages warm it: no-sync replays of two seeds' first `--span-s` trace seconds in a fixed order that puts every
seed both after itself and after the other (A A B A B B A B), at the profile's pinned time scale. Printed per
replay: the seed, what preceded it, E2E and TTFT p95, the decode pace and the prefix-cache hit rate over the
replay (from the server's counters); then per setting the mean E2E p95 after the same seed and after the
other, each seed's spread, and the noise floor's drift test of the replays over their positions
(`evidence.controls_drift`). Each replay's requests are kept under `--root`. Results:
evidence/2026-12-06-server-wandering.md.

    .venv/bin/python benchmarks/bench_carryover.py [--profile cpu] [--regime bursty] [--span-s 60]

Each setting is the shipped `replay.vllm.server_args` with arguments added (`--setting NAME=ARGS` replaces the
built-in ones). Run it from the repository root, alone on the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capacity import REPO, bench_project  # noqa: E402

from syncsafe import localhttp, timebase  # noqa: E402
from syncsafe.artifacts.traces import read_requests  # noqa: E402
from syncsafe.control.live_signals import sum_samples  # noqa: E402
from syncsafe.profiles import compose_file  # noqa: E402
from syncsafe.serving.metrics import failed_mask  # noqa: E402
from syncsafe.realarm.arm import open_arm  # noqa: E402
from syncsafe.realarm.evidence import controls_drift  # noqa: E402
from syncsafe.realarm.warmup import decode_pace_ms  # noqa: E402

#: name -> server arguments added to the shipped ones (a flag given here replaces the shipped value).
SETTINGS: dict[str, list[str]] = {
    "shipped": [],
    "no prefix caching": ["--no-enable-prefix-caching"],
}
#: Replay order over two seeds (0 = A, 1 = B): each seed after itself and after the other.
ORDER = [0, 0, 1, 0, 1, 1, 0, 1]
COUNTERS = {"vllm:prefix_cache_hits_total": "hits", "vllm:prefix_cache_queries_total": "queries"}


def counters(base_url: str) -> dict[str, float]:
    with localhttp.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        found = sum_samples(resp.read().decode(), COUNTERS)
    return {COUNTERS[k]: v for k, v in found.items()}


def p95(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.percentile(values, 95)) if values.size else float("nan")


def measure(root: Path, raw: dict, regime: str, extra: list[str], span_s: float) -> list[dict]:
    params = bench_project(root, raw, regime, extra)
    scale = params.replay.vllm.pinned_time_scale(regime) or 1.0
    seeds = params.seeds[:2]
    spans = {s: (r := read_requests(root, regime, s))[r["arrival_s"] < span_s] for s in seeds}
    rows = []
    with open_arm(params, root, Path("server.log")) as arm:
        arm.warm_up()
        before = None
        for position, which in enumerate(ORDER):
            seed = seeds[which]
            start = counters(arm.server.base_url)
            res = arm.send(spans[seed], timebase.now() + 1.0, scale, seed)
            end = counters(arm.server.base_url)
            res.to_parquet(root / f"replay-{position}-seed-{seed}.parquet")  # for the drift test, and offline
            ok = res[~failed_mask(res)]
            queries = end.get("queries", 0) - start.get("queries", 0)
            rows.append({"seed": seed, "after": "-" if before is None else ("same" if before == seed else "other"),
                         "e2e_p95_ms": p95(ok["e2e_ms"].to_numpy(dtype=float)),
                         "ttft_p95_ms": p95(ok["ttft_ms"].to_numpy(dtype=float)),
                         "pace_ms": decode_pace_ms(res) or float("nan"),
                         "hit_rate": (end.get("hits", 0) - start.get("hits", 0)) / queries if queries else float("nan"),
                         "requests": len(res)})
            before = seed
            r = rows[-1]
            print(f"  seed {seed} after {r['after']}: E2E p95 {r['e2e_p95_ms']:.0f} ms, TTFT p95 "
                  f"{r['ttft_p95_ms']:.1f} ms, pace {r['pace_ms']:.2f} ms/token, prefix hits {r['hit_rate']:.0%}",
                  flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu", help="profile overlay of params.yaml (cpu: none)")
    parser.add_argument("--regime", default="bursty")
    parser.add_argument("--span-s", type=float, default=60.0, help="trace seconds of each seed replayed")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench-carryover"))
    parser.add_argument("--client-cpus", type=int, default=None,
                        help="replay.vllm.client_cpus (as many as the machine has: no split, the server niced)")
    parser.add_argument("--setting", action="append", default=[],
                        help="NAME=ARGS (space-separated server arguments), instead of the built-in settings")
    args = parser.parse_args()
    raw = compose_file(REPO / "params.yaml", [args.profile] if args.profile != "cpu" else [])
    raw["replay"]["vllm"]["python"] = str(REPO / raw["replay"]["vllm"]["python"])
    if args.client_cpus is not None:
        raw["replay"]["vllm"]["client_cpus"] = args.client_cpus
    chosen = {k: v.split() for k, v in (s.split("=", 1) for s in args.setting)} if args.setting else SETTINGS
    summary = {}
    for i, (name, extra) in enumerate(chosen.items()):
        print(f"{name}:", flush=True)
        rows = measure(args.root / f"setting-{i}", raw, args.regime, extra, args.span_s)
        summary[name] = rows
    print(f"\n| setting | E2E p95 after same seed (ms) | after the other (ms) | controls' spread per seed | "
          "prefix hits |")
    print("|---|---|---|---|---|")
    for name, rows in summary.items():
        same = [r["e2e_p95_ms"] for r in rows if r["after"] == "same"]
        other = [r["e2e_p95_ms"] for r in rows if r["after"] == "other"]
        spreads = []
        for seed in sorted({r["seed"] for r in rows}):
            v = np.array([r["e2e_p95_ms"] for r in rows if r["seed"] == seed])
            spreads.append(f"{(v.max() - v.min()) / np.median(v):.0%}")
        rates = [r["hit_rate"] for r in rows if np.isfinite(r["hit_rate"])]
        hits = f"{np.mean(rates):.0%}" if rates else "off"
        print(f"| {name} | {np.mean(same):.0f} | {np.mean(other):.0f} | {' / '.join(spreads)} | {hits} |")
    for i, name in enumerate(summary):
        found = {}
        for path in (args.root / f"setting-{i}").glob("replay-*-seed-*.parquet"):
            _, position, _, seed = path.stem.split("-")
            found.setdefault(int(seed), []).append((int(position), pd.read_parquet(path)))
        test = controls_drift(found, 999, (i,))
        print(f"{name}: {test.describe() if test else 'not tested'}")

if __name__ == "__main__":
    main()
