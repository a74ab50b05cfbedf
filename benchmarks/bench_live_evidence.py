"""Benchmark: live policy vs live matched random on the real vLLM CPU server (issue 15's evidence).

Per regime and seed, `syncsafe live`'s four runs on the same arrivals (the
live policy, its matched-random draw, training without merges, no training;
interleaved order), then the report's live section: SLO violation rates per
condition, sync-excess, the compute-interference share (training without
merges vs no training) and the exact within-seed rank test's p.

Every setting is params.yaml's except the ones this runner names and prints:
`live.enabled: true`, `live.regimes`, `live.seeds` (and `--policy` if given).
It writes data/, runs/ and models/ under `--root`: run it in a copy of the
tree, never in a shared checkout, e.g.

    rsync -a --exclude '.venv*' --exclude data --exclude runs --exclude reports --exclude mlflow.db ./ /tmp/live-ev/
    ln -s $PWD/.venv $PWD/.venv-vllm /tmp/live-ev/ && cd /tmp/live-ev
    SYNCSAFE_TRACKING=off PYTHONPATH=src nice .venv/bin/python benchmarks/bench_live_evidence.py \\
        --regime bursty --regime azure_conv --seeds 5

`--report-only` prints the table of runs already under `--root`; `--out FILE`
also writes the command, the settings and the table there (Markdown).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import yaml

os.environ.setdefault("SYNCSAFE_TRACKING", "off")

from syncsafe import io  # noqa: E402
from syncsafe.analysis.live import live_section, read_live_index  # noqa: E402
from syncsafe.config import load_params  # noqa: E402

SERVER_START_S = 120.0  # a vLLM CPU server's start on a loaded 2-core machine, roughly
RUN_OVERHEAD_S = 12.0  # per live run: island processes, lead time, drain, outputs (roughly)


def wall_estimate_s(params, regimes: list[str], seeds: list[int]) -> float:
    """Rough wall seconds: per regime one server start and warmup, per seed four live runs."""
    live = params.live
    per_run = live.duration_s / live.time_scale + RUN_OVERHEAD_S
    per_regime = SERVER_START_S + live.warmup_s / live.time_scale + 4 * per_run * len(seeds)
    return len(regimes) * per_regime


def prepare(root: Path, source: Path, regimes: list[str], seeds: list[int], policy: str | None) -> Path:
    """params.yaml under root with live on for the named regimes and seeds; traces and the served export built."""
    raw = yaml.safe_load(source.read_text())
    raw["live"] = {**raw.get("live", {}), "enabled": True, "regimes": regimes, "seeds": seeds}
    if policy:
        raw["live"]["policy"] = policy
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    params = load_params(path)
    from syncsafe.diloco.launch import train_regime
    from syncsafe.realarm.design import vllm_controllers, vllm_seeds
    from syncsafe.realarm.arm import served_model
    from syncsafe.traces.stage import build_traces

    for regime in sorted({*regimes, *params.replay.vllm.regimes[:1]}):
        build_traces(params, regime, root)
    if params.replay.vllm.model is None:  # the trained export the server serves (as the vLLM replay does)
        train_regime(params, path, params.replay.vllm.regimes[0], root, resume=True,
                     policies=vllm_controllers(params)[:1], seeds=vllm_seeds(params)[:1])
    print(f"served model: {served_model(params, root)}", flush=True)
    return path


def settings_line(params, regimes: list[str], seeds: list[int]) -> str:
    live = params.live
    return (f"policy {live.policy}, regimes {regimes}{f', seeds {seeds}' if seeds else ''}, duration_s {live.duration_s}, "
            f"time_scale {live.time_scale}, warmup_s {live.warmup_s}, scrape_interval_s {live.scrape_interval_s}, "
            f"islands {params.train.islands}, control step_s {params.control.step_s} min_h {params.control.min_h} "
            f"max_h {params.control.max_h}, merge window_s {params.merge.window_s}, "
            f"SLO x{params.replay.slo.multiplier} of each seed's training-without-merges p95")


def command_line() -> str:
    return "python benchmarks/bench_live_evidence.py " + shlex.join(sys.argv[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--regime", action="append", help="regime (repeatable); default: bursty and azure_conv")
    ap.add_argument("--seeds", type=int, default=5, help="how many seeds: first-seed .. first-seed + N - 1")
    ap.add_argument("--first-seed", type=int, default=0, help="more seeds into the same --root: the table joins them")
    ap.add_argument("--policy", default=None, help="live policy; default: live.policy")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="also write command, settings and table here")
    args = ap.parse_args()
    root = args.root.resolve()
    regimes = args.regime or ["bursty", "azure_conv"]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if not args.report_only:
        from syncsafe.live.sidecar import run_live

        root.mkdir(parents=True, exist_ok=True)
        with open(root / "commands.txt", "a") as log:  # every run into this root, for the --out file
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: {command_line()}\n")
        path = prepare(root, args.params, regimes, seeds, args.policy)
        params = load_params(path)
        live = params.live
        print(f"settings: {settings_line(params, regimes, seeds)}", flush=True)
        print(f"estimated wall time: {wall_estimate_s(params, regimes, seeds) / 60:.0f} min", flush=True)
        for regime in regimes:
            started = time.time()
            run_live(params, path, regime, live.policy, seeds, root)
            print(f"{regime}: {len(seeds)} seeds x 4 live runs in {time.time() - started:.0f} s", flush=True)
    params = load_params(root / "params.yaml")
    section = live_section(root, params.analysis.alpha)
    print(section)
    if args.out is not None:
        commands = (root / "commands.txt").read_text() if (root / "commands.txt").is_file() else command_line() + "\n"
        index = read_live_index(root)
        ran = {r: sorted(int(s) for s in index[index["regime"] == r]["seed"].unique()) for r in sorted(set(index["regime"]))}
        io.write_text(args.out, f"# Live evidence\n\nRuns (joined under one --root):\n\n```\n{commands}```\n\n"
                                f"Settings: {settings_line(params, list(ran), [])}; seeds run: {ran}\n\n{section}\n")


if __name__ == "__main__":
    main()
