"""Benchmark: DiLoCo island loop vs a plain single-process training loop.

Trains fixed_h on the bursty regime (600 trace seconds) with the configured
islands, and runs a plain loop (one process, same model, batch, threads and
island-0 batches) for the same number of steps right before and right after
it. Prints tokens/s per island between merges vs the mean of the two plain
loops (target: at most 5 % overhead), merge wall time and bytes per merge.
Then one plain loop per island, all at once in their own processes: the
islands share the cores with each other, a single plain loop does not; the
overhead against these side-by-side loops is the loop's own (commands,
reports, waiting for the slowest island), without that contention.

The machine may be shared and noisy: `--reps N` repeats the whole
measurement and prints the median and the spread of the overhead; the last
line (`RESULT {...}`) is JSON, for interleaving runs of two code versions
(`PYTHONPATH=<tree>/src python benchmarks/bench_train.py --reps 1`, alternating trees).

    python benchmarks/bench_train.py [--params params.yaml] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml

os.environ.setdefault("SYNCSAFE_TRACKING", "off")

from syncsafe.config import load_params  # noqa: E402
from syncsafe.diloco.corpus import island_batches  # noqa: E402
from syncsafe.diloco.launch import train_regime  # noqa: E402
from syncsafe.diloco.model import build_tiny_llama, causal_lm_loss  # noqa: E402
from syncsafe.diloco.resources import model_spec, prepare_tokenizer  # noqa: E402
from syncsafe.diloco.run import timing_path, train_dir  # noqa: E402
from syncsafe.traces.stage import build_traces  # noqa: E402


def plain_loop(params, root: Path, steps: int, island: int = 0, start=None) -> float:
    """Tokens/s of a single-process AdamW loop on an island's batches (`start`: a barrier to wait at first)."""
    torch.set_num_threads(params.train.torch_threads)
    corpus, tokenizer = prepare_tokenizer(params, root)
    batches = island_batches(corpus, tokenizer, island, params.train.islands, params.train.seq_len,
                             params.train.batch_size, 0)
    model = build_tiny_llama(model_spec(params, 0), tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=params.train.inner_lr)
    if start is not None:
        start.wait()
    started = time.perf_counter()
    for step in range(steps):
        loss = causal_lm_loss(model, batches[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * batches.tokens_per_batch / (time.perf_counter() - started)


def _plain_in_process(params_path: str, root: str, steps: int, island: int, start, out) -> None:
    out.put(plain_loop(load_params(params_path), Path(root), steps, island, start))


def plain_loops_side_by_side(params, params_path: Path, root: Path, steps: int) -> float:
    """Mean tokens/s of one plain loop per island, all running at once in their own processes: the
    reference that shares the cores as the islands do, without any collective."""
    ctx = multiprocessing.get_context("spawn")
    n = params.train.islands
    start, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_plain_in_process, args=(str(params_path), str(root), steps, i, start, out))
             for i in range(n)]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates) / n


def measure(raw: dict) -> dict:
    """One repetition: plain loop, island run, plain loop (fresh temporary project)."""
    raw["seeds"] = [0]
    raw["regimes"] = {"bursty": raw["regimes"]["bursty"]}
    raw["replay"]["vllm"]["policies"] = ["fixed_h"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "params.yaml").write_text(yaml.safe_dump(raw))
        params = load_params(root / "params.yaml")
        build_traces(params, "bursty", root)
        prepare_tokenizer(params, root)
        steps = int(params.regimes["bursty"].duration_s // params.control.step_s)  # an upper bound of inner steps
        plain_before = plain_loop(params, root, steps)
        started = time.perf_counter()
        train_regime(params, root / "params.yaml", "bursty", root, policies=["fixed_h"], seeds=[0])
        launch_s = time.perf_counter() - started
        run = train_dir(root, "bursty", "fixed_h", 0)
        metrics = {**json.loads((run / "metrics.json").read_text()), **json.loads(timing_path(run).read_text())}
        plain_after = plain_loop(params, root, steps)
        side_by_side = plain_loops_side_by_side(params, root / "params.yaml", root, steps)
    plain = (plain_before + plain_after) / 2
    island = metrics["island_tokens_per_s"]
    return {"islands": metrics["islands"], "inner_steps": metrics["inner_steps"], "merges": metrics["n_merges"],
            "launch_s": launch_s, "plain_before": plain_before, "plain_after": plain_after, "island": island,
            "overhead_pct": 100 * (1 - island / plain), "merge_wall_ms": 1000 * metrics["merge_wall_s_mean"],
            "plain_side_by_side": side_by_side, "overhead_vs_side_by_side_pct": 100 * (1 - island / side_by_side),
            "bytes_per_merge": metrics["bytes_per_merge"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    raw = yaml.safe_load(Path(args.params).read_text())
    reps = []
    for rep in range(args.reps):
        m = measure(raw)
        reps.append(m)
        print(f"rep {rep}: islands {m['islands']}, inner steps {m['inner_steps']}, merges {m['merges']}, "
              f"stage wall (incl. process start, export) {m['launch_s']:.1f} s; plain loop {m['plain_before']:.0f} / "
              f"{m['plain_after']:.0f} tokens/s (before / after), island loop {m['island']:.0f} tokens/s per island: "
              f"{m['overhead_pct']:+.1f} % overhead; plain loops side by side {m['plain_side_by_side']:.0f} tokens/s "
              f"each ({m['overhead_vs_side_by_side_pct']:+.1f} % vs those); merge {m['merge_wall_ms']:.1f} ms", flush=True)
    overhead = np.array([m["overhead_pct"] for m in reps])
    print(f"overhead over {len(reps)} reps: median {np.median(overhead):+.1f} %, "
          f"range {overhead.min():+.1f} .. {overhead.max():+.1f} %")
    beside = np.array([m["overhead_vs_side_by_side_pct"] for m in reps])
    print(f"vs plain loops side by side: median {np.median(beside):+.1f} %, range {beside.min():+.1f} .. {beside.max():+.1f} %")
    print(f"bytes per merge:   {reps[-1]['bytes_per_merge']:,} (ring all-reduce 2n(W-1)/W)")
    print("RESULT " + json.dumps({"overhead_pct": overhead.tolist(), "reps": reps}))


if __name__ == "__main__":
    main()
