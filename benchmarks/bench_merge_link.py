"""Benchmark: merge time against link rate and delay on two test hosts, next to the all-reduce cost model.

Brings up a fleet of two network namespaces (root only), and for every link
setting (rates x delays) runs real merges (`python -m syncsafe.fleet.merge_probe`:
the outer step over a gloo all-reduce between the hosts) on a payload of
`--floats` parameters (default: the tiny profile's model, 2,361,860 bytes per
merge). Prints a table: bytes per merge, link rate, delay, measured median
merge time, the cost model's time on the wire `8·2·n·(W−1)/W / rate + 2·(W−1)·delay`,
and their ratio; then fits the merge link model (fixed cost + efficiency) and,
with `--out`, writes it for `control.calibrated.merge_link`.

A delay needs the kernel's netem qdisc: where it is missing the delayed
settings are reported as not measurable, never run without their delay.

    sudo .venv/bin/python benchmarks/bench_merge_link.py [--rates 10 20 50 200] [--delays 0 5] [--out merge_link.json]

Measure alone on the machine: merge times taken beside other work are not evidence.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from syncsafe.control.merge_link import fit_merge_link, model_comm_s
from syncsafe.fleet import links, netns
from syncsafe.fleet.hosts import Fleet
from syncsafe.fleet.merge_probe import measure
from syncsafe.io import write_text

TINY_FLOATS = 590_464


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[10.0, 20.0, 50.0, 200.0], help="Mbit/s")
    ap.add_argument("--delays", type=float, nargs="+", default=[0.0, 5.0], help="ms each way")
    ap.add_argument("--floats", type=int, default=TINY_FLOATS, help="parameters per merge payload")
    ap.add_argument("--merges", type=int, default=7)
    ap.add_argument("--out", type=Path, help="write the fitted merge link model here")
    args = ap.parse_args()
    fleet = Fleet(name="ssbm")
    netns.down(fleet)
    netns.up(fleet)
    results, payload = [], 0
    try:
        netem = links.has_netem()
        print(f"kernel netem qdisc: {'yes' if netem else 'no (delays cannot be shaped here)'}")
        print(f"{'bytes/merge':>12} {'rate Mbit/s':>11} {'delay ms':>8} {'measured s':>10} {'model s':>8} {'ratio':>6}")
        settings = [(r, d) for d in args.delays for r in [*args.rates, None]]
        for rate, delay in settings:
            if delay > 0 and not netem:
                print(f"{'':>12} {rate or 'line':>11} {delay:>8g} {'not measurable: no netem':>26}")
                continue
            m, payload = measure(fleet, links.Shape(rate, delay), args.floats, merges=args.merges)
            model = model_comm_s(payload, len(fleet.hosts), rate, delay)
            ratio = f"{m.median_s / model:6.2f}" if model > 0 else f"{'-':>6}"
            print(f"{payload:>12,} {rate or 'line':>11} {delay:>8g} {m.median_s:>10.3f} {model:>8.3f} {ratio}")
            results.append(m)
    finally:
        netns.down(fleet)
    fitted = fit_merge_link(results, payload, len(fleet.hosts), link_mbit=max(args.rates),
                            delay_ms=0.0)
    print(f"fit over the rate-limited settings: fixed {fitted.fixed_s * 1e3:.1f} ms, efficiency "
          f"{fitted.efficiency:.2f} of the link rate; at {fitted.link_mbit:g} Mbit/s a merge takes "
          f"{fitted.merge_s(0):.3f} s free, {fitted.merge_s(0.5):.3f} s at network pressure 0.5")
    if args.out:
        write_text(args.out, fitted.model_dump_json(indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
