"""The model each island trains: a tiny seeded Llama (cpu) or a pretrained HF model (gpu).

The cpu profile builds a ~1.3 M parameter ``LlamaForCausalLM`` from
:class:`TinyLlamaSpec` with a seeded random init, so every island starts from
the same weights without any download, and vLLM can serve the export (Llama
architecture). The gpu profile loads a pretrained model by Hugging Face name.

:func:`causal_lm_loss` is the training objective (mean next-token cross
entropy); :func:`eval_loss` averages it over held-out batches, weighted by
token count.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase


class TinyLlamaSpec(BaseModel):
    """Shape and init seed of the cpu-profile model (vocab comes from the tokenizer)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(4, gt=0)
    num_heads: int = Field(4, gt=0)
    num_kv_heads: int = Field(4, gt=0)
    intermediate_size: int = Field(344, gt=0)
    max_position_embeddings: int = Field(512, gt=0)
    rope_theta: float = Field(10_000.0, gt=0)
    rms_norm_eps: float = Field(1e-5, gt=0)
    initializer_range: float = Field(0.02, gt=0)
    tie_word_embeddings: bool = False
    seed: int = 0


def llama_config(spec: TinyLlamaSpec, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The ``LlamaConfig`` for ``spec`` with vocab and special-token ids from ``tokenizer``."""
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ValueError(
            f"hidden_size {spec.hidden_size} must divide into num_heads {spec.num_heads}, "
            f"which must divide into num_kv_heads {spec.num_kv_heads}"
        )
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.rms_norm_eps,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def generation_config_for(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_llama(spec: TinyLlamaSpec, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A randomly initialised Llama, identical for equal ``spec`` (the global RNG is untouched)."""
    config = llama_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.generation_config = generation_config_for(tokenizer)
    return model.to(torch.float32)


def load_pretrained_model(name: str, dtype: torch.dtype | str = "auto") -> PreTrainedModel:
    """gpu profile: a pretrained causal LM by Hugging Face name or local path."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name, dtype=dtype)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameter elements (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def causal_lm_loss(model: PreTrainedModel, input_ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross entropy of ``input_ids`` ``[batch, seq]`` (``mean`` or ``sum``)."""
    input_ids = input_ids.to(model.device)
    logits = model(input_ids=input_ids).logits[:, :-1, :]
    targets = input_ids[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction=reduction)


def eval_loss(model: PreTrainedModel, batches: Iterable[torch.Tensor]) -> float:
    """Mean token cross entropy over held-out ``batches`` (model left in its prior mode)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for batch in batches:
                total += causal_lm_loss(model, batch, reduction="sum").item()
                count += batch.size(0) * (batch.size(1) - 1)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("eval_loss needs at least one batch with seq_len >= 2")
    return total / count
