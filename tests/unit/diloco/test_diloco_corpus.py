"""Corpus: deterministic split, disjoint island shards, step-indexed batches."""

from __future__ import annotations

import importlib.util
from collections import Counter
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from syncsafe.diloco.corpus import (
    DEFAULT_MAX_BYTES,
    IslandBatches,
    MissingDependencyError,
    TextCorpus,
    build_stdlib_corpus,
    encode_documents,
    eval_batches,
    island_batches,
    stream_hf_island_batches,
    truncate_to_bytes,
)


def chunk_keys(chunks) -> set[tuple[str, int]]:
    return {(chunk.module, chunk.index) for chunk in chunks}


def test_corpus_is_deterministic_and_capped(small_corpus: TextCorpus, small_corpus_options: dict[str, Any]) -> None:
    again = build_stdlib_corpus(**small_corpus_options)
    assert again == small_corpus
    assert again.fingerprint == small_corpus.fingerprint
    cap = small_corpus_options["max_bytes"]
    total_bytes = sum(len(c.text.encode()) for c in (*small_corpus.train, *small_corpus.eval))
    assert cap * 0.9 < total_bytes <= cap


def test_fingerprint_tracks_the_split(small_corpus: TextCorpus, small_corpus_options: dict[str, Any]) -> None:
    other = build_stdlib_corpus(**{**small_corpus_options, "eval_fraction": 0.2})
    assert other.fingerprint != small_corpus.fingerprint


def test_train_and_eval_are_disjoint_and_nonempty(small_corpus: TextCorpus) -> None:
    assert small_corpus.train and small_corpus.eval
    assert not chunk_keys(small_corpus.train) & chunk_keys(small_corpus.eval)
    assert not {c.text for c in small_corpus.train} & {c.text for c in small_corpus.eval}


@pytest.mark.parametrize("num_islands", [2, 3, 4])
def test_island_shards_are_disjoint_and_cover_train(small_corpus: TextCorpus, num_islands: int) -> None:
    shards = [chunk_keys(small_corpus.island_shard(i, num_islands)) for i in range(num_islands)]
    assert all(shards)
    counts = Counter(key for shard in shards for key in shard)
    assert set(counts.values()) == {1}
    assert set(counts) == chunk_keys(small_corpus.train)


def test_island_index_is_validated(small_corpus: TextCorpus) -> None:
    with pytest.raises(ValueError, match="island"):
        small_corpus.island_shard(3, 3)


def test_truncation_keeps_whole_lines() -> None:
    text = "alpha\nbeta\ngamma\n"
    assert truncate_to_bytes(text, 11) == "alpha\nbeta\n"
    assert truncate_to_bytes(text, 100) == text


def synthetic_batches(seed: int, island: int = 0) -> IslandBatches:
    return IslandBatches(torch.arange(1000), seq_len=16, batch_size=4, seed=seed, island=island)


def test_batches_by_step_are_deterministic_across_epochs() -> None:
    first, second = synthetic_batches(seed=3), synthetic_batches(seed=3)
    steps_per_epoch = first.windows_per_epoch // first.batch_size
    for step in (0, 1, steps_per_epoch + 2, 5 * steps_per_epoch):
        assert torch.equal(first[step], second[step])
    assert first[0].shape == (4, 16) and first[0].dtype == torch.long


def test_resume_from_a_step_sees_the_same_batches() -> None:
    batches = synthetic_batches(seed=3)
    uninterrupted = [batches[step] for step in range(12)]
    resumed = synthetic_batches(seed=3).iter_from(7)
    for step in range(7, 12):
        assert torch.equal(next(resumed), uninterrupted[step])


def test_one_epoch_visits_every_window_once() -> None:
    batches = synthetic_batches(seed=5)
    windows = [batches.window(sample) for sample in range(batches.windows_per_epoch)]
    starts = sorted(int(w[0]) for w in windows)
    assert len(set(starts)) == batches.windows_per_epoch
    assert all(int(w[-1]) - int(w[0]) == 15 for w in windows)  # contiguous tokens


def test_seed_and_island_change_the_order() -> None:
    assert not torch.equal(synthetic_batches(seed=1)[0], synthetic_batches(seed=2)[0])
    assert not torch.equal(synthetic_batches(seed=1, island=0)[0], synthetic_batches(seed=1, island=1)[0])


def test_island_batches_come_from_the_island_shard(
    small_corpus: TextCorpus, small_tokenizer: PreTrainedTokenizerFast
) -> None:
    island0 = island_batches(small_corpus, small_tokenizer, 0, 2, seq_len=32, batch_size=2, seed=0)
    again = island_batches(small_corpus, small_tokenizer, 0, 2, seq_len=32, batch_size=2, seed=0)
    island1 = island_batches(small_corpus, small_tokenizer, 1, 2, seq_len=32, batch_size=2, seed=0)
    assert torch.equal(island0[4], again[4])
    assert not torch.equal(island0.tokens[:1000], island1.tokens[:1000])
    assert int(island0.tokens.max()) < len(small_tokenizer)
    shard_text = [c.text for c in small_corpus.island_shard(0, 2)]
    assert torch.equal(island0.tokens, encode_documents(small_tokenizer, shard_text))


def test_documents_are_framed_by_bos_and_eos(small_tokenizer: PreTrainedTokenizerFast) -> None:
    tokens = encode_documents(small_tokenizer, ["x = 1\n", "y = 2\n"]).tolist()
    bos, eos = small_tokenizer.bos_token_id, small_tokenizer.eos_token_id
    assert tokens[0] == bos and tokens[-1] == eos and tokens.count(eos) == 2 and tokens.count(bos) == 2


def test_eval_batches_are_fixed(small_corpus: TextCorpus, small_tokenizer: PreTrainedTokenizerFast) -> None:
    batches = eval_batches(small_corpus, small_tokenizer, seq_len=32, batch_size=4, max_batches=3)
    again = eval_batches(small_corpus, small_tokenizer, seq_len=32, batch_size=4, max_batches=3)
    assert len(batches) == 3 and all(b.shape == (4, 32) for b in batches)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_gpu_data_source_names_the_missing_package(small_tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(MissingDependencyError, match="'datasets'"):
        stream_hf_island_batches("HuggingFaceFW/fineweb-edu", small_tokenizer, 0, 8, seq_len=128, batch_size=4)


def test_default_corpus_spans_many_modules_within_the_cap() -> None:
    corpus = build_stdlib_corpus()
    modules = {chunk.module for chunk in (*corpus.train, *corpus.eval)}
    total_bytes = sum(len(c.text.encode()) for c in (*corpus.train, *corpus.eval))
    assert len(modules) > 20
    assert DEFAULT_MAX_BYTES * 0.9 < total_bytes <= DEFAULT_MAX_BYTES
    assert 0.02 < len(corpus.eval) / (len(corpus.train) + len(corpus.eval)) < 0.1
