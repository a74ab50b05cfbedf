"""Model, tokenizer and data for a training process, per `train.source`.

- builtin: the offline stdlib corpus, a byte-level BPE tokenizer trained on it
  (cached under `models/tokenizer`, keyed by corpus and vocab size) and a
  tiny Llama built from `train.model`, seeded by the run's seed so every
  island starts from the same weights.
- hub: a Hugging Face model and tokenizer (hub id through the local cache,
  or a local directory) and a streamed hub dataset or a local dataset
  directory, island i reading shard i of M+1 (shard M is held out for eval).
"""

from __future__ import annotations

import fcntl
from pathlib import Path

import torch

from syncsafe.artifacts import layout
from syncsafe.config import Params
from syncsafe.diloco.corpus import (build_stdlib_corpus, eval_batches, island_batches, pack_batches,
                                    stream_hf_island_batches)
from syncsafe.diloco.islands import step_batches
from syncsafe.diloco.model import TinyLlamaSpec, build_tiny_llama, load_pretrained_model
from syncsafe.diloco.run import Resources, World
from syncsafe.diloco.tokenizer import load_or_build_tokenizer

TOKENIZER_DIR = layout.TOKENIZER_CACHE


def model_spec(params: Params, seed: int) -> TinyLlamaSpec:
    m = params.train.model
    return TinyLlamaSpec(hidden_size=m.hidden_size, num_layers=m.num_layers, num_heads=m.num_heads,
                         num_kv_heads=m.num_heads, intermediate_size=m.intermediate_size,
                         max_position_embeddings=m.max_position_embeddings, seed=seed)


def prepare_tokenizer(params: Params, root: Path):
    """Build (or reuse) the builtin source's corpus and tokenizer; returns both.

    Concurrent callers (parallel train tasks of a DAG) serialize on a lock
    file beside the cache, so one builds and the others reuse.
    """
    corpus = build_stdlib_corpus(max_bytes=params.train.corpus_bytes)
    cache = Path(root) / TOKENIZER_DIR
    cache.parent.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / ".tokenizer.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tokenizer = load_or_build_tokenizer(cache, corpus.train_texts(), corpus.fingerprint,
                                            vocab_size=params.train.vocab_size)
    return corpus, tokenizer


def builtin_resources(params: Params, root: Path, world: World) -> Resources:
    cfg = params.train
    corpus, tokenizer = prepare_tokenizer(params, root)
    held_out = eval_batches(corpus, tokenizer, cfg.seq_len, cfg.batch_size, max_batches=cfg.eval_batches)
    shards: dict[tuple[int, int, int], object] = {}

    def batches_for(island_id: int, num_islands: int, seed: int, start_step: int):
        key = (island_id, num_islands, seed)
        if key not in shards:
            shards[key] = island_batches(corpus, tokenizer, island_id, num_islands, cfg.seq_len, cfg.batch_size, seed)
        return step_batches(shards[key])

    return Resources(tokenizer=tokenizer, build_model=lambda seed: build_tiny_llama(model_spec(params, seed), tokenizer),
                     batches_for=batches_for, eval_batches=held_out)


def hub_resources(params: Params, world: World) -> Resources:
    """`train.source: hub`: a Hugging Face model and dataset, each a hub id (through the local cache) or a local
    directory (`syncsafe.diloco.hub`); bfloat16 on CUDA, float32 when `train.device: cpu` rehearses the path."""
    from transformers import AutoTokenizer

    from syncsafe.diloco.hub import is_local_dataset, local_island_texts, resolve_model

    cfg, hub = params.train, params.train.hub
    model_dir = resolve_model(hub.model)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.bfloat16 if world.device.type == "cuda" else torch.float32

    def stream(shard: int, shards: int, start_step: int):
        if is_local_dataset(hub.dataset):
            texts = local_island_texts(hub.dataset, shard, shards, hub.text_field)
            return pack_batches(tokenizer, texts, cfg.seq_len, cfg.batch_size, start_step)
        return stream_hf_island_batches(hub.dataset, tokenizer, shard, shards, cfg.seq_len, cfg.batch_size,
                                        config_name=hub.dataset_config, text_field=hub.text_field, start_step=start_step)

    held_out_stream = stream(world.num_islands, world.num_islands + 1, 0)
    held_out = [next(held_out_stream) for _ in range(cfg.eval_batches)]

    def build_model(seed: int):
        torch.manual_seed(seed)
        return load_pretrained_model(model_dir, dtype=dtype).to(world.device)

    def batches_for(island_id: int, num_islands: int, seed: int, start_step: int):
        return step_batches(stream(island_id, num_islands + 1, start_step), start=start_step)

    return Resources(tokenizer=tokenizer, build_model=build_model, batches_for=batches_for, eval_batches=held_out)
