"""Where the gpu profile's model and dataset come from: a local directory or a Hugging Face hub id.

- `resolve_model(name, key)`: a local directory as is; a hub id through the
  local Hugging Face cache (no network: `local_files_only`), so an offline
  node serves and trains what was downloaded before. A name that is neither
  raises `BadInput` naming the params key and the id.
- `local_documents(directory, text_field)`: the documents of a local dataset
  directory, in a fixed order: `*.jsonl` (one JSON object per line, its
  `text_field`), `*.parquet` (the `text_field` column) and `*.txt` (one
  document per file), files sorted by name. `local_island_texts` shards them
  round-robin, one shard per island (the last shard held out for eval, as for
  a streamed hub dataset), repeating the directory epoch after epoch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from syncsafe.config import Params
from syncsafe.errors import BadInput

DOCUMENT_SUFFIXES = (".jsonl", ".parquet", ".txt")


def resolve_model(name: str, key: str = "train.hub.model") -> str:
    """A local model directory for `name`: the directory itself, or the hub id's snapshot in the local cache."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{key}: {name} is a directory without config.json (not a Hugging Face model)")
        return str(path)
    if path.is_absolute() or name.startswith((".", "~")) or name.count("/") != 1:
        raise BadInput(f"{key}: {name!r} is neither a model directory nor a hub id (owner/name)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        raise BadInput(
            f"{key}: hub model {name!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and "
            f"nothing is downloaded at run time; fetch it first (`hf download {name}`) or give a local directory"
        ) from None
    if not (snapshot / "config.json").is_file():
        raise BadInput(f"{key}: cached snapshot of {name!r} at {snapshot} has no config.json")
    return str(snapshot)


def check_hub_inputs(params: Params) -> None:
    """BadInput now, naming the key, for whatever an island of `train.source: hub` would fail to load: the
    model (`resolve_model`), a local dataset directory without documents, or a hub dataset without the
    `datasets` package to stream it."""
    hub = params.train.hub
    resolve_model(hub.model)
    if is_local_dataset(hub.dataset):
        next(local_documents(hub.dataset, hub.text_field))
        return
    import importlib.util

    if importlib.util.find_spec("datasets") is None:
        raise BadInput(f"train.hub.dataset: streaming hub dataset {hub.dataset!r} needs the `datasets` package, "
                       "which is not installed (or give a local dataset directory)")


def is_local_dataset(name: str) -> bool:
    return Path(name).expanduser().is_dir()


def local_documents(directory: str | Path, text_field: str = "text") -> Iterator[str]:
    """Every document of a local dataset directory, in file-name order (see the module docstring)."""
    root = Path(directory).expanduser()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in DOCUMENT_SUFFIXES)
    if not files:
        raise BadInput(f"train.hub.dataset: {root} holds no {', '.join(DOCUMENT_SUFFIXES)} files")
    for path in files:
        if path.suffix == ".txt":
            yield path.read_text(encoding="utf-8", errors="replace")
        elif path.suffix == ".jsonl":
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    record = json.loads(line)
                    if text_field not in record:
                        raise BadInput(f"{path}:{n}: no {text_field!r} field (train.hub.text_field)")
                    yield str(record[text_field])
        else:
            import pandas as pd

            frame = pd.read_parquet(path)
            if text_field not in frame.columns:
                raise BadInput(f"{path}: no {text_field!r} column (train.hub.text_field); found {list(frame.columns)}")
            yield from (str(t) for t in frame[text_field])


def local_island_texts(directory: str | Path, shard: int, shards: int, text_field: str = "text") -> Iterator[str]:
    """Documents `shard`, `shard + shards`, ... of the directory, epoch after epoch: one island's share."""
    while True:
        seen = 0
        for text in islice(local_documents(directory, text_field), shard, None, shards):
            seen += 1
            yield text
        if not seen:
            raise BadInput(f"train.hub.dataset: {directory} has fewer than {shard + 1} documents; "
                           f"each of {shards} shards (islands + eval) needs one")
