"""Hugging Face export of the merged (global) model, for ``transformers`` and vLLM.

The export directory holds ``config.json`` (architecture ``LlamaForCausalLM``
for the cpu profile, dtype recorded under both ``dtype`` and the older
``torch_dtype`` key that vLLM and transformers<4.56 read),
``model.safetensors``, ``generation_config.json`` and the tokenizer files. It
is built in a temporary sibling directory and renamed over the target, so a
reader never sees a partial export.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from syncsafe.io import replace_directory
from syncsafe.diloco.outer import OuterOptimizer
from syncsafe.diloco.tokenizer import save_tokenizer

CONFIG_FILE = "config.json"


def export_hf_model(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    target_dir: Path,
    global_state: Mapping[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Save ``model``'s architecture with its weights, or ``global_state``, into ``target_dir``.

    ``global_state`` maps every parameter name of ``model`` to a tensor (e.g.
    :meth:`OuterOptimizer.global_state_dict`). Weights are copied to CPU in
    ``dtype`` (default: the model's dtype); the training model is not
    modified. Returns the target directory.
    """
    dtype = dtype if dtype is not None else model.dtype
    state = export_state_dict(model, global_state, dtype)
    dtype_name = str(dtype).removeprefix("torch.")

    def write(tmp_dir: Path) -> None:
        save_model_safetensors(model, tmp_dir, state)
        save_tokenizer(tokenizer, tmp_dir)
        record_dtype(tmp_dir / CONFIG_FILE, dtype_name)

    return replace_directory(Path(target_dir), write)


def export_global_model(
    model: PreTrainedModel,
    outer: OuterOptimizer,
    tokenizer: PreTrainedTokenizerBase,
    target_dir: Path,
    dtype: torch.dtype | None = None,
) -> Path:
    """Export the outer optimizer's global parameters in ``model``'s architecture."""
    return export_hf_model(model, tokenizer, target_dir, global_state=outer.global_state_dict(), dtype=dtype)


def export_state_dict(
    model: PreTrainedModel, global_state: Mapping[str, torch.Tensor] | None, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """CPU copies of ``model.state_dict()`` in ``dtype``, parameters replaced from ``global_state``."""
    overrides = parameter_overrides(model, global_state) if global_state is not None else {}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        source = overrides.get(name, tensor)
        target_dtype = dtype if tensor.is_floating_point() else tensor.dtype
        state[name] = source.detach().to(device="cpu", dtype=target_dtype).clone()
    return state


def parameter_overrides(model: PreTrainedModel, global_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``global_state`` extended to every alias of a tied parameter (e.g. ``lm_head.weight``)."""
    canonical = {name for name, _ in model.named_parameters()}
    if set(global_state) != canonical:
        difference = sorted(set(global_state) ^ canonical)
        raise ValueError(f"global_state does not match the model's parameters: {difference[:5]}")
    first_name_of: dict[int, str] = {}
    overrides: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        first_name = first_name_of.setdefault(id(parameter), name)
        overrides[name] = global_state[first_name]
    return overrides


def save_model_safetensors(model: PreTrainedModel, directory: Path, state: dict[str, torch.Tensor]) -> None:
    """``save_pretrained(state_dict=state)`` as safetensors on any transformers version.

    transformers v5 dropped the ``safe_serialization`` flag (always safetensors).
    """
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        model.save_pretrained(directory, state_dict=state, safe_serialization=True)
    else:
        model.save_pretrained(directory, state_dict=state)
    if not (directory / "model.safetensors").is_file():
        raise RuntimeError(f"save_pretrained wrote no model.safetensors into {directory}")


def record_dtype(config_path: Path, dtype_name: str) -> None:
    """Make sure ``config.json`` names the weights' dtype under both keys readers use."""
    config = json.loads(config_path.read_text())
    config["dtype"] = dtype_name
    config["torch_dtype"] = dtype_name
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
