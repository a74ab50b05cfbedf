"""Island checkpoints: everything needed to resume training exactly, written atomically.

A checkpoint holds the island's local model state, the inner AdamW state, the
outer optimizer state (global parameters + Nesterov momentum), step counters,
RNG states (Python, NumPy, torch CPU and CUDA) and the controller's state as
an opaque JSON-able dict. Batches are indexed by step
(:class:`~syncsafe.diloco.corpus.IslandBatches`), so the counters are all the
data-loader state there is.

Files are written with :func:`~syncsafe.io.atomic_path`
(temp file in the same directory, fsync, ``os.replace``) and read with
``torch.load(weights_only=True)``; a truncated or malformed file raises
:class:`CheckpointError` naming it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from syncsafe.io import atomic_path

CHECKPOINT_FORMAT = "syncsafe.diloco.checkpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, corrupt, incomplete or from another format."""


@dataclass
class TrainingCheckpoint:
    """One island's resumable state."""

    island: int
    inner_step: int
    outer_step: int
    tokens_seen: int
    model_state: dict[str, torch.Tensor]
    inner_optimizer_state: dict[str, Any]
    outer_optimizer_state: dict[str, Any]
    rng_state: dict[str, Any]
    controller_state: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


_COUNTERS = ("island", "inner_step", "outer_step", "tokens_seen")
_STATES = ("model_state", "inner_optimizer_state", "outer_optimizer_state", "rng_state")
_JSON_FIELDS = ("controller_state", "extra")


# --------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU, and CUDA when present) RNG states, as tensors and scalars."""
    numpy_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": _python_state_to_tensor(random.getstate()),
        "numpy_key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
        "numpy_pos": int(numpy_state["state"]["pos"]),
        "numpy_has_gauss": int(numpy_state["has_gauss"]),
        "numpy_gauss": float(numpy_state["gauss"]),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(_python_state_from_tensor(state["python"]))
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": state["numpy_key"].numpy().astype(np.uint32), "pos": state["numpy_pos"]},
            "has_gauss": state["numpy_has_gauss"],
            "gauss": state["numpy_gauss"],
        }
    )
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def _python_state_to_tensor(state: tuple[Any, ...]) -> torch.Tensor:
    version, internal, gauss = state
    if version != 3 or gauss is not None:
        raise ValueError("unsupported Python random state")
    return torch.tensor(internal, dtype=torch.int64)


def _python_state_from_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (3, tuple(int(v) for v in tensor.tolist()), None)


# --------------------------------------------------------------------------- files


def save_checkpoint(path: Path, checkpoint: TrainingCheckpoint) -> Path:
    """Write ``checkpoint`` to ``path`` atomically; the JSON fields must be JSON-able."""
    payload: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION}
    payload.update({name: int(getattr(checkpoint, name)) for name in _COUNTERS})
    payload.update({name: getattr(checkpoint, name) for name in _STATES})
    for name in _JSON_FIELDS:
        try:
            payload[name] = json.dumps(getattr(checkpoint, name), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise TypeError(f"checkpoint {name} must be a JSON-able dict: {error}") from error
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return Path(path)


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> TrainingCheckpoint:
    """Read and validate a checkpoint written by :func:`save_checkpoint`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointError(f"checkpoint file {path} is corrupt or incomplete: {error}") from error
    return _checkpoint_from_payload(path, payload)


def _checkpoint_from_payload(path: Path, payload: Any) -> TrainingCheckpoint:
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint file {path} is not a syncsafe DiLoCo checkpoint")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"checkpoint file {path} has version {payload.get('version')!r}, expected {CHECKPOINT_VERSION}"
        )
    missing = [name for name in (*_COUNTERS, *_STATES, *_JSON_FIELDS) if name not in payload]
    if missing:
        raise CheckpointError(f"checkpoint file {path} is incomplete: missing {', '.join(missing)}")
    wrong_type = [name for name in _COUNTERS if not isinstance(payload[name], int)]
    wrong_type += [name for name in _STATES if not isinstance(payload[name], dict)]
    if wrong_type:
        raise CheckpointError(f"checkpoint file {path} has malformed fields: {', '.join(wrong_type)}")
    try:
        json_fields = {name: json.loads(payload[name]) for name in _JSON_FIELDS}
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"checkpoint file {path} has a malformed controller/extra state: {error}") from error
    return TrainingCheckpoint(
        **{name: payload[name] for name in (*_COUNTERS, *_STATES)},
        **json_fields,
    )
