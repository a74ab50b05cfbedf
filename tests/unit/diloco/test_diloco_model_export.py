"""Tiny Llama build, eval loss, and the Hugging Face export of the global model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from syncsafe.diloco.corpus import TextCorpus, eval_batches
from syncsafe.diloco.export import export_global_model, export_hf_model
from syncsafe.diloco.model import (
    TinyLlamaSpec,
    build_tiny_llama,
    count_parameters,
    eval_loss,
    llama_config,
)
from syncsafe.diloco.outer import OuterOptimizer


class VocabOnly:
    """Just what ``llama_config`` reads from a tokenizer: size and special ids."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2

    def __len__(self) -> int:
        return 2048


def test_default_spec_is_a_one_to_five_million_parameter_llama() -> None:
    config = llama_config(TinyLlamaSpec(), VocabOnly())
    embeddings = 2 * 2048 * 128  # untied input embedding + lm head
    per_layer = 4 * 128 * 128 + 3 * 128 * 344 + 2 * 128
    expected = embeddings + 4 * per_layer + 128
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert count_parameters(model) == expected == 1_315_968
    assert config.model_type == "llama"


def test_build_is_seeded_and_leaves_global_rng_alone(
    small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec
) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = build_tiny_llama(small_spec, small_tokenizer)
    assert torch.equal(torch.get_rng_state(), before)
    second = build_tiny_llama(small_spec, small_tokenizer)
    other_seed = build_tiny_llama(small_spec.model_copy(update={"seed": small_spec.seed + 1}), small_tokenizer)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other_seed.parameters()))
    assert first.config.vocab_size == len(small_tokenizer)
    assert first.config.eos_token_id == small_tokenizer.eos_token_id


def test_eval_loss_at_init_is_near_uniform(
    small_corpus: TextCorpus, small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec
) -> None:
    model = build_tiny_llama(small_spec, small_tokenizer).train()
    batches = eval_batches(small_corpus, small_tokenizer, seq_len=32, batch_size=4, max_batches=3)
    loss = eval_loss(model, batches)
    assert abs(loss - math.log(len(small_tokenizer))) < 0.3
    assert model.training  # mode restored
    assert eval_loss(model, batches) == loss


def perturb_in_place(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)


def assert_export_matches(directory: Path, reference: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> None:
    reloaded = AutoModelForCausalLM.from_pretrained(directory)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(directory)
    text = "def outer_step(global_params, pseudo_gradient):\n"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    assert reloaded_tokenizer(text)["input_ids"] == ids[0].tolist()
    reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, reference(input_ids=ids).logits, rtol=0, atol=0)


def test_export_reloads_with_identical_logits(
    small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec, tmp_path: Path
) -> None:
    model = build_tiny_llama(small_spec, small_tokenizer)
    target = export_hf_model(model, small_tokenizer, tmp_path / "export")
    assert_export_matches(target, model, small_tokenizer)

    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == config["torch_dtype"] == "float32"
    generation = json.loads((target / "generation_config.json").read_text())
    assert generation["eos_token_id"] == small_tokenizer.eos_token_id
    assert (target / "model.safetensors").is_file()
    assert json.loads((target / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


@pytest.mark.parametrize("tied", [False, True])
def test_export_writes_global_not_local_weights(
    small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec, tmp_path: Path, tied: bool
) -> None:
    spec = small_spec.model_copy(update={"tie_word_embeddings": tied})
    local = build_tiny_llama(spec, small_tokenizer)
    outer = OuterOptimizer(local, num_islands=2)
    global_model = build_tiny_llama(spec, small_tokenizer)  # equals the global snapshot
    perturb_in_place(local)  # inner steps since the last merge
    target = export_global_model(local, outer, small_tokenizer, tmp_path / "export")
    assert_export_matches(target, global_model, small_tokenizer)


def test_export_replaces_target_atomically(
    small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec, tmp_path: Path
) -> None:
    model = build_tiny_llama(small_spec, small_tokenizer)
    target = tmp_path / "export"
    export_hf_model(model, small_tokenizer, target)
    (target / "stale-file").write_text("from an older export")
    perturb_in_place(model)
    export_hf_model(model, small_tokenizer, target)
    assert not (target / "stale-file").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
    assert_export_matches(target, model, small_tokenizer)
