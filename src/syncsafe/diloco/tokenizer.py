"""The cpu-profile tokenizer: byte-level BPE trained locally on the train corpus.

Byte-level BPE covers every input (no unknown token), round-trips text
exactly, and needs nothing from a hub. The result is wrapped as a
``transformers.PreTrainedTokenizerFast`` with ``<s>`` / ``</s>`` / ``<pad>``
so it is saved next to the model in the Hugging Face export and vLLM serves
it unchanged. Like Llama tokenizers, encoding prepends ``<s>``.

Building is cached: :func:`load_or_build_tokenizer` reuses a directory whose
recorded fingerprint (training text, vocab size, special tokens, library
version) matches, and otherwise rebuilds it atomically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from syncsafe.io import replace_directory

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
DEFAULT_VOCAB_SIZE = 2048
#: Long enough for whole corpus chunks; the model's context is enforced by the batcher.
MODEL_MAX_LENGTH = 1_000_000
FINGERPRINT_FILE = "syncsafe_tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: Bump when the construction below changes, so stale caches are rebuilt.
TOKENIZER_FORMAT_VERSION = 1


def train_bpe_tokenizer(
    texts: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts`` (deterministic for equal inputs)."""
    minimum_vocab = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < minimum_vocab:
        raise ValueError(f"vocab_size must be >= {minimum_vocab} (bytes + special tokens), got {vocab_size}")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, backend.token_to_id(BOS_TOKEN))],
    )
    return wrap_tokenizer(backend)


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a ``tokenizers.Tokenizer`` for ``transformers`` with bos/eos/pad set."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """``save_pretrained`` plus a portable class name.

    transformers v5 records ``TokenizersBackend``, which older releases (as a
    vLLM image may pin) cannot resolve; ``PreTrainedTokenizerFast`` loads in both.
    """
    tokenizer.save_pretrained(directory)
    config_path = Path(directory) / TOKENIZER_CONFIG_FILE
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def tokenizer_fingerprint(corpus_fingerprint: str, vocab_size: int, min_frequency: int = 2) -> str:
    """What a cached tokenizer must match to be reused."""
    recipe = {
        "corpus": corpus_fingerprint,
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "special_tokens": list(SPECIAL_TOKENS),
        "tokenizers": tokenizers.__version__,
        "format": TOKENIZER_FORMAT_VERSION,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def read_cached_fingerprint(directory: Path) -> str | None:
    """The fingerprint recorded in a tokenizer directory, or None if absent/unreadable."""
    try:
        return json.loads((Path(directory) / FINGERPRINT_FILE).read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_or_build_tokenizer(
    directory: Path,
    texts: Sequence[str],
    corpus_fingerprint: str,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
) -> PreTrainedTokenizerFast:
    """Reuse the tokenizer in ``directory`` if its fingerprint matches, else train and save it.

    Either way the tokenizer returned is the one read back from ``directory``: whichever island process
    trained it, every process (and so every export) holds the same object as the ones that reused it."""
    directory = Path(directory)
    fingerprint = tokenizer_fingerprint(corpus_fingerprint, vocab_size, min_frequency)
    if read_cached_fingerprint(directory) == fingerprint:
        return PreTrainedTokenizerFast.from_pretrained(directory)
    tokenizer = train_bpe_tokenizer(texts, vocab_size=vocab_size, min_frequency=min_frequency)

    def write(tmp_dir: Path) -> None:
        save_tokenizer(tokenizer, tmp_dir)
        (tmp_dir / FINGERPRINT_FILE).write_text(json.dumps({"fingerprint": fingerprint}, indent=2) + "\n")

    replace_directory(directory, write)
    return PreTrainedTokenizerFast.from_pretrained(directory)
