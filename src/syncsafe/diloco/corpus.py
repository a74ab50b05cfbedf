"""Training text for DiLoCo islands: an offline corpus (cpu) and a HF stream (gpu).

cpu profile: the corpus is drawn from the Python installation's own standard
library sources, so it exists offline on every machine that can run the
pipeline. A fixed, sorted list of pure-Python modules is read, capped at a
byte budget, cut into chunks at line boundaries, and split deterministically
into held-out eval chunks (by a stable hash of module name and chunk index)
and train chunks. Train chunks are dealt round-robin into one disjoint shard
per island. The same CPython version gives byte-identical text; other
versions differ only where the stdlib sources themselves changed (the corpus
fingerprint records which text a run used).

Batches are addressed by step number (:class:`IslandBatches` is indexable),
so a run resumed at step ``s`` sees exactly the batches an uninterrupted run
would have seen, and reproduces its losses.

gpu profile: :func:`stream_hf_island_batches` streams a Hugging Face dataset,
one shard per island, and tokenizes it with the model's tokenizer.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

#: Pure-Python stdlib modules present (as ``name.py`` or ``name/__init__.py``)
#: from CPython 3.11 on. Sorted; modules missing on an installation are skipped.
STDLIB_MODULES: tuple[str, ...] = (
    "_pydecimal", "argparse", "ast", "base64", "bdb", "bisect", "calendar", "cmd",
    "code", "codecs", "collections", "colorsys", "configparser", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "difflib", "dis", "doctest",
    "email._header_value_parser", "email.message", "enum", "fnmatch", "fractions",
    "ftplib", "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac",
    "html.parser", "http.client", "http.server", "imaplib", "inspect", "ipaddress",
    "json", "json.decoder", "json.encoder", "logging", "logging.handlers", "mailbox",
    "netrc", "numbers", "opcode", "operator", "optparse", "os", "pathlib", "pdb",
    "pickle", "pickletools", "platform", "plistlib", "poplib", "pprint", "profile",
    "pstats", "queue", "quopri", "random", "re._compiler", "re._parser", "reprlib",
    "sched", "secrets", "selectors", "shlex", "shutil", "smtplib", "socket",
    "socketserver", "ssl", "statistics", "string", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "tokenize", "trace", "traceback", "types",
    "typing", "unittest.case", "unittest.mock", "urllib.parse", "urllib.request",
    "uuid", "warnings", "weakref", "zipapp", "zipfile",
)

DEFAULT_MAX_BYTES = 3_000_000
DEFAULT_CHUNK_CHARS = 2048
DEFAULT_EVAL_FRACTION = 0.05


class MissingDependencyError(ImportError):
    """An optional package needed by the selected profile is not installed."""


@dataclass(frozen=True)
class CorpusChunk:
    """A piece of one source module, the unit of the train/eval split and sharding."""

    module: str
    index: int
    text: str


@dataclass(frozen=True)
class TextCorpus:
    """Train and held-out eval chunks, plus a fingerprint of their exact text."""

    train: tuple[CorpusChunk, ...]
    eval: tuple[CorpusChunk, ...]
    fingerprint: str

    def train_texts(self) -> list[str]:
        return [chunk.text for chunk in self.train]

    def eval_texts(self) -> list[str]:
        return [chunk.text for chunk in self.eval]

    def island_shard(self, island: int, num_islands: int) -> tuple[CorpusChunk, ...]:
        """The train chunks of ``island``: every ``num_islands``-th chunk, offset ``island``."""
        return shard_round_robin(self.train, island, num_islands)


# --------------------------------------------------------------------------- corpus


def stdlib_directory() -> Path:
    """Where this interpreter's standard library sources live."""
    return Path(sysconfig.get_paths()["stdlib"])


def module_source_path(stdlib_dir: Path, module: str) -> Path | None:
    """The source file of a dotted stdlib module name, or None if absent."""
    relative = Path(*module.split("."))
    for candidate in (stdlib_dir / relative.with_suffix(".py"), stdlib_dir / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def read_stdlib_documents(
    modules: Sequence[str] = STDLIB_MODULES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    stdlib_dir: Path | None = None,
) -> list[tuple[str, str]]:
    """``(module, text)`` pairs in sorted module order, at most ``max_bytes`` UTF-8 bytes.

    The document that exhausts the budget is cut at a line boundary and is the last one.
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    root = stdlib_dir if stdlib_dir is not None else stdlib_directory()
    documents: list[tuple[str, str]] = []
    budget = max_bytes
    for module in sorted(modules):
        path = module_source_path(root, module)
        if path is None:
            continue
        full_text = path.read_text(encoding="utf-8").replace("\r\n", "\n")
        text = truncate_to_bytes(full_text, budget)
        if text:
            documents.append((module, text))
            budget -= len(text.encode("utf-8"))
        if text != full_text:
            break
    if not documents:
        raise FileNotFoundError(f"none of the corpus modules were found under {root}")
    return documents


def truncate_to_bytes(text: str, max_bytes: int) -> str:
    """The longest prefix of whole lines of ``text`` that fits in ``max_bytes``."""
    if len(text.encode("utf-8")) <= max_bytes:
        return text
    kept: list[str] = []
    used = 0
    for line in split_lines(text):
        size = len(line.encode("utf-8"))
        if used + size > max_bytes:
            break
        kept.append(line)
        used += size
    return "".join(kept)


def split_lines(text: str) -> list[str]:
    """Lines ending in ``\\n`` (kept); unlike ``str.splitlines``, form feeds etc. do not split."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def split_into_chunks(module: str, text: str, chunk_chars: int) -> list[CorpusChunk]:
    """Cut a document into chunks of about ``chunk_chars`` characters at line ends."""
    if chunk_chars <= 0:
        raise ValueError(f"chunk_chars must be positive, got {chunk_chars}")
    chunks: list[CorpusChunk] = []
    current: list[str] = []
    size = 0
    for line in split_lines(text):
        current.append(line)
        size += len(line)
        if size >= chunk_chars:
            chunks.append(CorpusChunk(module, len(chunks), "".join(current)))
            current, size = [], 0
    if current:
        chunks.append(CorpusChunk(module, len(chunks), "".join(current)))
    return chunks


def is_eval_chunk(chunk: CorpusChunk, eval_fraction: float) -> bool:
    """Stable held-out assignment: a hash of (module, index), independent of other chunks."""
    digest = hashlib.sha256(f"{chunk.module}:{chunk.index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def shard_round_robin(chunks: Sequence[CorpusChunk], island: int, num_islands: int) -> tuple[CorpusChunk, ...]:
    """Deal ``chunks`` into ``num_islands`` disjoint shards; return shard ``island``."""
    validate_island(island, num_islands)
    return tuple(chunks[island::num_islands])


def validate_island(island: int, num_islands: int) -> None:
    if num_islands < 1:
        raise ValueError(f"num_islands must be >= 1, got {num_islands}")
    if not 0 <= island < num_islands:
        raise ValueError(f"island must be in [0, {num_islands}), got {island}")


def corpus_fingerprint(train: Sequence[CorpusChunk], held_out: Sequence[CorpusChunk]) -> str:
    """sha256 over the split and the exact text of every chunk."""
    digest = hashlib.sha256()
    for split, chunks in (("train", train), ("eval", held_out)):
        for chunk in chunks:
            digest.update(f"{split}\0{chunk.module}\0{chunk.index}\0".encode())
            digest.update(chunk.text.encode("utf-8"))
            digest.update(b"\0")
    return digest.hexdigest()


def build_stdlib_corpus(
    max_bytes: int = DEFAULT_MAX_BYTES,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    modules: Sequence[str] = STDLIB_MODULES,
    stdlib_dir: Path | None = None,
) -> TextCorpus:
    """The cpu-profile corpus: stdlib sources, chunked and split into train / eval."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    chunks = [
        chunk
        for module, text in read_stdlib_documents(modules, max_bytes, stdlib_dir)
        for chunk in split_into_chunks(module, text, chunk_chars)
    ]
    held_out = tuple(chunk for chunk in chunks if is_eval_chunk(chunk, eval_fraction))
    train = tuple(chunk for chunk in chunks if not is_eval_chunk(chunk, eval_fraction))
    if not train or not held_out:
        raise ValueError(
            f"corpus split is degenerate ({len(train)} train / {len(held_out)} eval chunks); "
            "raise max_bytes or lower chunk_chars"
        )
    return TextCorpus(train=train, eval=held_out, fingerprint=corpus_fingerprint(train, held_out))


# --------------------------------------------------------------------------- tokens


def encode_documents(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> torch.Tensor:
    """One flat LongTensor: each text tokenized (with the tokenizer's own BOS) then EOS."""
    encoded = tokenizer(list(texts), add_special_tokens=True, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    flat: list[int] = []
    for ids in encoded:
        flat.extend(ids)
        if eos is not None and (not ids or ids[-1] != eos):
            flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


class IslandBatches:
    """Deterministic ``[batch_size, seq_len]`` token batches of one island, indexed by step.

    The token stream is cut into ``seq_len`` windows. Each epoch (one pass over
    the windows) uses its own window offset and order, drawn from
    ``numpy.random.SeedSequence([seed, island, epoch])``. ``batches[step]`` is a
    pure function of (tokens, seed, island, step): resuming at a step needs no
    iterator state.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, seed: int, island: int) -> None:
        if seq_len < 2 or batch_size < 1:
            raise ValueError(f"need seq_len >= 2 and batch_size >= 1, got {seq_len}, {batch_size}")
        self.tokens = tokens.to(torch.long).reshape(-1)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.island = island
        # Windows start at offset + w * seq_len with offset < seq_len, so this
        # many windows fit whatever the epoch's offset is.
        self.windows_per_epoch = (self.tokens.numel() - seq_len + 1) // seq_len
        if self.windows_per_epoch < 1:
            raise ValueError(
                f"island {island} has {self.tokens.numel()} tokens, too few for one window of {seq_len}"
            )
        self._epoch_plan = lru_cache(maxsize=4)(self._plan_epoch)

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    def _plan_epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.island, epoch]))
        offset = int(rng.integers(0, self.seq_len))
        order = rng.permutation(self.windows_per_epoch)
        return offset, order

    def window(self, sample: int) -> torch.Tensor:
        """The ``sample``-th training window of this island (global sample counter)."""
        epoch, position = divmod(sample, self.windows_per_epoch)
        offset, order = self._epoch_plan(epoch)
        start = offset + int(order[position]) * self.seq_len
        return self.tokens[start : start + self.seq_len]

    def __getitem__(self, step: int) -> torch.Tensor:
        if step < 0:
            raise IndexError(f"step must be >= 0, got {step}")
        first = step * self.batch_size
        return torch.stack([self.window(first + row) for row in range(self.batch_size)])

    def iter_from(self, start_step: int = 0) -> Iterator[torch.Tensor]:
        """Endless batches from ``start_step`` on (as an interrupted run would have seen them)."""
        step = start_step
        while True:
            yield self[step]
            step += 1


def island_batches(
    corpus: TextCorpus,
    tokenizer: PreTrainedTokenizerBase,
    island: int,
    num_islands: int,
    seq_len: int,
    batch_size: int,
    seed: int,
) -> IslandBatches:
    """Step-indexed batches over ``island``'s disjoint shard of the train corpus."""
    shard = corpus.island_shard(island, num_islands)
    tokens = encode_documents(tokenizer, [chunk.text for chunk in shard])
    return IslandBatches(tokens, seq_len=seq_len, batch_size=batch_size, seed=seed, island=island)


def sequential_batches(tokens: torch.Tensor, seq_len: int, batch_size: int, max_batches: int | None = None) -> list[torch.Tensor]:
    """Non-overlapping windows in order, grouped into full batches (for evaluation)."""
    num_windows = tokens.numel() // seq_len
    windows = tokens[: num_windows * seq_len].reshape(num_windows, seq_len)
    batches = [windows[i : i + batch_size] for i in range(0, num_windows - batch_size + 1, batch_size)]
    return batches if max_batches is None else batches[:max_batches]


def eval_batches(
    corpus: TextCorpus,
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
) -> list[torch.Tensor]:
    """Held-out batches, identical for every island and every run on the same corpus."""
    tokens = encode_documents(tokenizer, corpus.eval_texts())
    batches = sequential_batches(tokens, seq_len, batch_size, max_batches)
    if not batches:
        raise ValueError(f"held-out text ({tokens.numel()} tokens) is too small for one {batch_size}x{seq_len} batch")
    return batches


# --------------------------------------------------------------------------- gpu profile


def import_datasets() -> Any:
    """The ``datasets`` package, or a clear error naming it."""
    try:
        import datasets
    except ImportError as error:
        raise MissingDependencyError(
            "the gpu-profile data source needs the 'datasets' package (pip install datasets)"
        ) from error
    return datasets


def stream_hf_island_batches(
    dataset_name: str,
    tokenizer: PreTrainedTokenizerBase,
    island: int,
    num_islands: int,
    seq_len: int,
    batch_size: int,
    split: str = "train",
    config_name: str | None = None,
    text_field: str = "text",
    start_step: int = 0,
) -> Iterator[torch.Tensor]:
    """Stream ``[batch_size, seq_len]`` batches of island ``island`` from a HF dataset.

    The stream is sharded per island with ``.shard(num_shards=num_islands,
    index=island)`` when the dataset's file shards divide evenly, otherwise
    with ``datasets.distributed.split_dataset_by_node`` (one example in
    ``num_islands``). Documents are tokenized and packed into windows; the
    stream order is fixed (no shuffle), so resuming skips ``start_step``
    batches and reproduces the rest. Raises :class:`MissingDependencyError`
    at call time when ``datasets`` is not installed.
    """
    validate_island(island, num_islands)
    datasets = import_datasets()
    stream = datasets.load_dataset(dataset_name, config_name, split=split, streaming=True)
    stream = _shard_stream(stream, island, num_islands)
    texts = (example[text_field] for example in stream)
    return pack_batches(tokenizer, texts, seq_len, batch_size, start_step)


def pack_batches(
    tokenizer: PreTrainedTokenizerBase,
    texts: Iterable[str],
    seq_len: int,
    batch_size: int,
    start_step: int = 0,
) -> Iterator[torch.Tensor]:
    """Tokenize a stream of documents and pack it into ``[batch_size, seq_len]`` batches.

    Batches before ``start_step`` are produced and dropped, so a resumed
    stream continues exactly where an uninterrupted one would be.
    """
    batch_tokens = batch_size * seq_len
    buffer: list[int] = []
    step = 0
    for text in texts:
        buffer.extend(encode_documents(tokenizer, [text]).tolist())
        while len(buffer) >= batch_tokens:
            batch, buffer = buffer[:batch_tokens], buffer[batch_tokens:]
            if step >= start_step:
                yield torch.tensor(batch, dtype=torch.long).reshape(batch_size, seq_len)
            step += 1


def _shard_stream(stream: Any, island: int, num_islands: int) -> Any:
    n_shards = getattr(stream, "n_shards", 0) or 0
    if n_shards >= num_islands and n_shards % num_islands == 0:
        return stream.shard(num_shards=num_islands, index=island)
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(stream, rank=island, world_size=num_islands)
