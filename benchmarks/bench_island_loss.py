"""Benchmark: how long a lost island on another host takes to be named, killed or cut off.

Two test hosts (network namespaces, root only) train the tiny profile's
fixed_h run as two nodes. Host b's island holds at inner step 10 (the
`hold` drill); then either its process is SIGKILLed or host b's link is cut
(`ip link set ... down`). Measured from that moment: when host a's train stage
exits (3, naming the island on host b) and when host b's does. Repeats
`--reps` times per fault and prints each and the median, against
`train.heartbeat_timeout_s` and `train.collective_timeout_s`.

    sudo .venv/bin/python benchmarks/bench_island_loss.py [--reps 3] [--heartbeat-timeout-s 10]

Measure alone on the machine: detection times taken beside other work are not evidence.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from syncsafe.config import load_params
from syncsafe.fleet import links, netns, training
from syncsafe.fleet.hosts import Fleet
from syncsafe.profiles import compose_file
from syncsafe.traces.stage import build_traces

REPO = Path(__file__).resolve().parents[1]


def project(root: Path, heartbeat_s: float, collective_s: float) -> Path:
    raw = compose_file(REPO / "params.yaml", ["tiny"])
    raw["control"]["policies"] = ["fixed_h"]
    raw["analysis"]["primary"]["policy"] = "fixed_h"
    raw["train"].update({"heartbeat_timeout_s": heartbeat_s, "collective_timeout_s": collective_s})
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    build_traces(load_params(path), "bursty", root)
    return path


def drill(fleet: Fleet, fault: str, heartbeat_s: float, collective_s: float, port: int) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory(prefix="syncsafe-bench-loss-") as tmp:
        root = Path(tmp)
        path = project(root, heartbeat_s, collective_s)
        mark = root / "ready"
        env = {**os.environ, "SYNCSAFE_TRACKING": "off"}
        procs = training.start_nodes(fleet, path, root, port, env,
                                     {"b": {"SYNCSAFE_FAULT": "any:10:hold", "SYNCSAFE_FAULT_MARK": str(mark)}})
        deadline = time.monotonic() + 300
        while not mark.exists():
            if time.monotonic() > deadline:
                raise RuntimeError("the drill never reached its step")
            time.sleep(0.05)
        struck = time.monotonic()
        if fault == "kill":
            training.islands_on(fleet, "b")[0].kill()
        else:
            links.cut(fleet, "b")
        exited: dict[str, float] = {}
        while len(exited) < 2 and time.monotonic() < struck + 300:
            for host, p in procs.items():
                if host not in exited and p.poll() is not None:
                    exited[host] = time.monotonic() - struck
            time.sleep(0.05)
        line = procs["a"].stderr.read().strip().splitlines()[-1]
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        links.restore(fleet, "b")
        return exited.get("a", float("nan")), exited.get("b", float("nan")), line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--faults", nargs="+", choices=["kill", "cut"], default=["kill", "cut"])
    ap.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    ap.add_argument("--collective-timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    fleet = Fleet(name="ssbl")
    netns.down(fleet)
    netns.up(fleet)
    port = 29700
    try:
        for fault in args.faults:
            a_times, b_times = [], []
            for rep in range(args.reps):
                port += 1
                a, b, line = drill(fleet, fault, args.heartbeat_timeout_s, args.collective_timeout_s, port)
                a_times.append(a)
                b_times.append(b)
                print(f"{fault} #{rep}: host a's stage exited after {a:.1f} s, host b's after {b:.1f} s; a said: {line}")
            print(f"{fault}: median {statistics.median(a_times):.1f} s on host a, {statistics.median(b_times):.1f} s "
                  f"on host b (heartbeat timeout {args.heartbeat_timeout_s:g} s, collective timeout "
                  f"{args.collective_timeout_s:g} s)")
    finally:
        netns.down(fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
