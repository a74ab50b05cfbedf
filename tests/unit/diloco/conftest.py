"""Shared fixtures for the DiLoCo tests: a small offline corpus, tokenizer and model."""

from __future__ import annotations

import os
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from syncsafe.diloco.corpus import TextCorpus, build_stdlib_corpus  # noqa: E402
from syncsafe.diloco.model import TinyLlamaSpec  # noqa: E402
from syncsafe.diloco.tokenizer import train_bpe_tokenizer  # noqa: E402

SMALL_CORPUS_BYTES = 200_000
SMALL_VOCAB = 512
#: A model small enough for many forward passes in a test.
SMALL_SPEC = TinyLlamaSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64,
                           max_position_embeddings=64, seed=7)


@pytest.fixture(scope="session")
def small_corpus_options() -> dict[str, Any]:
    return {"max_bytes": SMALL_CORPUS_BYTES, "chunk_chars": 1024, "eval_fraction": 0.1}


@pytest.fixture(scope="session")
def small_corpus(small_corpus_options: dict[str, Any]) -> TextCorpus:
    return build_stdlib_corpus(**small_corpus_options)


@pytest.fixture(scope="session")
def small_vocab() -> int:
    return SMALL_VOCAB


@pytest.fixture(scope="session")
def small_tokenizer(small_corpus: TextCorpus, small_vocab: int) -> PreTrainedTokenizerFast:
    return train_bpe_tokenizer(small_corpus.train_texts(), vocab_size=small_vocab)


@pytest.fixture(scope="session")
def small_spec() -> TinyLlamaSpec:
    return SMALL_SPEC
