"""Tokenizer: exact round trip, deterministic training, special tokens, cache reuse."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import syncsafe.diloco.tokenizer as tokenizer_module
from syncsafe.diloco.corpus import TextCorpus
from syncsafe.diloco.tokenizer import (
    FINGERPRINT_FILE,
    load_or_build_tokenizer,
    save_tokenizer,
    train_bpe_tokenizer,
)

SAMPLES = [
    "def merge(island, weight=1.0):\n    return global_ - local  # pseudo-gradient\n",
    "  leading spaces,\ttabs and trailing  \n\n",
    "unicode: héllo wörld ✓ 漢字 🙂",
    "",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip_is_exact(small_tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = small_tokenizer(text)["input_ids"]
    assert ids[0] == small_tokenizer.bos_token_id
    assert small_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_special_tokens_and_vocab(small_tokenizer: PreTrainedTokenizerFast, small_vocab: int) -> None:
    assert len(small_tokenizer) == small_vocab
    assert (small_tokenizer.bos_token, small_tokenizer.eos_token, small_tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert {small_tokenizer.bos_token_id, small_tokenizer.eos_token_id, small_tokenizer.pad_token_id} == {0, 1, 2}
    assert small_tokenizer.unk_token_id is None  # byte-level: nothing is unknown


def test_training_is_deterministic(
    small_corpus: TextCorpus, small_tokenizer: PreTrainedTokenizerFast, small_vocab: int
) -> None:
    again = train_bpe_tokenizer(small_corpus.train_texts(), vocab_size=small_vocab)
    assert again.get_vocab() == small_tokenizer.get_vocab()
    assert again.backend_tokenizer.to_str() == small_tokenizer.backend_tokenizer.to_str()


def test_too_small_vocab_is_rejected(small_corpus: TextCorpus) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(small_corpus.train_texts()[:5], vocab_size=100)


def test_saved_tokenizer_reloads_with_auto_tokenizer(small_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    save_tokenizer(small_tokenizer, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for text in SAMPLES:
        assert reloaded(text)["input_ids"] == small_tokenizer(text)["input_ids"]
    assert reloaded.pad_token_id == small_tokenizer.pad_token_id


def test_cache_is_reused_when_fingerprint_matches(
    small_corpus: TextCorpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = small_corpus.train_texts()[:40]
    directory = tmp_path / "tokenizer"
    built = load_or_build_tokenizer(directory, texts, small_corpus.fingerprint, vocab_size=400)
    assert (directory / FINGERPRINT_FILE).is_file()

    def refuse_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenizer was retrained although the cache matches")

    monkeypatch.setattr(tokenizer_module, "train_bpe_tokenizer", refuse_training)
    cached = load_or_build_tokenizer(directory, texts, small_corpus.fingerprint, vocab_size=400)
    assert cached.get_vocab() == built.get_vocab()
    monkeypatch.undo()

    rebuilt = load_or_build_tokenizer(directory, texts, small_corpus.fingerprint, vocab_size=420)
    assert len(rebuilt) == 420
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer"]  # no temp siblings left behind
