"""Benchmark: DiLoCo island loop vs a plain single-process training loop.

Trains fixed_h on the bursty regime (600 trace seconds: 120 inner steps per
island) with the configured islands, then runs a plain loop (one process,
same model, batch, threads and island-0 batches) for the same number of
steps. Prints tokens/s per island between merges vs the plain loop (target:
at most 5 % overhead), merge wall time and bytes per merge.

    python benchmarks/bench_train.py [--params params.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

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


def plain_loop(params, root: Path, steps: int) -> float:
    """Tokens/s of a single-process AdamW loop on island 0's batches."""
    torch.set_num_threads(params.train.torch_threads)
    corpus, tokenizer = prepare_tokenizer(params, root)
    batches = island_batches(corpus, tokenizer, 0, params.train.islands, params.train.seq_len, params.train.batch_size, 0)
    model = build_tiny_llama(model_spec(params, 0), tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=params.train.inner_lr)
    started = time.perf_counter()
    for step in range(steps):
        loss = causal_lm_loss(model, batches[step])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return steps * batches.tokens_per_batch / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    raw = yaml.safe_load(Path(args.params).read_text())
    raw["seeds"] = [0]
    raw["regimes"] = {"bursty": raw["regimes"]["bursty"]}
    raw["replay"]["vllm"]["policies"] = ["fixed_h"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "params.yaml").write_text(yaml.safe_dump(raw))
        params = load_params(root / "params.yaml")
        build_traces(params, "bursty", root)
        prepare_tokenizer(params, root)
        started = time.perf_counter()
        train_regime(params, root / "params.yaml", "bursty", root, policies=["fixed_h"], seeds=[0])
        launch_s = time.perf_counter() - started
        run = train_dir(root, "bursty", "fixed_h", 0)
        metrics = {**json.loads((run / "metrics.json").read_text()), **json.loads(timing_path(run).read_text())}
        steps = metrics["inner_steps"]
        plain = plain_loop(params, root, steps)
    island = metrics["island_tokens_per_s"]
    print(f"islands: {metrics['islands']}, inner steps: {steps}, merges: {metrics['n_merges']}, "
          f"stage wall (incl. process start, export): {launch_s:.1f} s")
    print(f"plain loop:        {plain:9.0f} tokens/s")
    print(f"island loop:       {island:9.0f} tokens/s per island ({100 * (1 - island / plain):+.1f} % overhead)")
    print(f"merge wall time:   {1000 * metrics['merge_wall_s_mean']:.1f} ms mean")
    print(f"bytes per merge:   {metrics['bytes_per_merge']:,} (ring all-reduce 2n(W-1)/W)")


if __name__ == "__main__":
    main()
