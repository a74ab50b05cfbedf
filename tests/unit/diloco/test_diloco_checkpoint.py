"""Checkpoints: round trip, exact resume of losses, and clear errors for bad files."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from syncsafe.diloco.checkpoint import (
    CheckpointError,
    TrainingCheckpoint,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from syncsafe.diloco.corpus import IslandBatches, TextCorpus, island_batches
from syncsafe.diloco.model import TinyLlamaSpec, build_tiny_llama, causal_lm_loss
from syncsafe.diloco.outer import OuterOptimizer

NUM_ISLANDS = 2
CONTROLLER_STATE = {"policy": "pressure_gate", "last_merge_s": 12.5, "ewma": [0.1, 0.2], "decisions": 3}


@dataclass
class Island:
    """One island's training objects (single process: the merge all-reduce is the identity)."""

    model: torch.nn.Module
    inner: torch.optim.AdamW
    outer: OuterOptimizer
    batches: IslandBatches
    inner_step: int = 0
    outer_step: int = 0
    tokens_seen: int = 0

    def train(self, steps: int, merge_every: int = 2) -> list[float]:
        """Inner AdamW steps with a merge every ``merge_every`` steps; returns the losses."""
        losses = []
        for _ in range(steps):
            loss = causal_lm_loss(self.model, self.batches[self.inner_step])
            loss.backward()
            self.inner.step()
            self.inner.zero_grad()
            losses.append(loss.item())
            self.inner_step += 1
            self.tokens_seen += self.batches.tokens_per_batch
            if self.inner_step % merge_every == 0:
                self.outer.merge(self.model, lambda t: t, weight=float(self.tokens_seen))
                self.outer_step += 1
        return losses

    def checkpoint(self) -> TrainingCheckpoint:
        return TrainingCheckpoint(
            island=0,
            inner_step=self.inner_step,
            outer_step=self.outer_step,
            tokens_seen=self.tokens_seen,
            model_state=self.model.state_dict(),
            inner_optimizer_state=self.inner.state_dict(),
            outer_optimizer_state=self.outer.state_dict(),
            rng_state=capture_rng_state(),
            controller_state=CONTROLLER_STATE,
        )


def new_island(spec: TinyLlamaSpec, tokenizer: PreTrainedTokenizerFast, corpus: TextCorpus) -> Island:
    model = build_tiny_llama(spec, tokenizer)
    return Island(
        model=model,
        inner=torch.optim.AdamW(model.parameters(), lr=3e-3),
        outer=OuterOptimizer(model, num_islands=NUM_ISLANDS),
        batches=island_batches(corpus, tokenizer, 0, NUM_ISLANDS, seq_len=32, batch_size=2, seed=11),
    )


def resume_island(path: Path, spec: TinyLlamaSpec, tokenizer: PreTrainedTokenizerFast, corpus: TextCorpus) -> Island:
    checkpoint = load_checkpoint(path)
    island = new_island(spec, tokenizer, corpus)
    island.model.load_state_dict(checkpoint.model_state)
    island.inner.load_state_dict(checkpoint.inner_optimizer_state)
    island.outer.load_state_dict(checkpoint.outer_optimizer_state)
    restore_rng_state(checkpoint.rng_state)
    island.inner_step, island.outer_step = checkpoint.inner_step, checkpoint.outer_step
    island.tokens_seen = checkpoint.tokens_seen
    return island


def test_resume_reproduces_losses(
    small_corpus: TextCorpus, small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec, tmp_path: Path
) -> None:
    island = new_island(small_spec, small_tokenizer, small_corpus)
    island.train(3)
    path = save_checkpoint(tmp_path / "island-0.pt", island.checkpoint())
    uninterrupted = island.train(3)

    resumed = resume_island(path, small_spec, small_tokenizer, small_corpus)
    assert (resumed.inner_step, resumed.outer_step) == (3, 1)
    assert resumed.train(3) == uninterrupted
    assert torch.equal(resumed.outer.global_flat, island.outer.global_flat)


def test_round_trip_keeps_every_field(
    small_tokenizer: PreTrainedTokenizerFast, small_spec: TinyLlamaSpec, small_corpus: TextCorpus, tmp_path: Path
) -> None:
    island = new_island(small_spec, small_tokenizer, small_corpus)
    island.train(2, merge_every=2)
    saved = island.checkpoint()
    saved.extra = {"run_id": "abc", "clock": "trace"}
    loaded = load_checkpoint(save_checkpoint(tmp_path / "ckpt.pt", saved))

    assert (loaded.island, loaded.inner_step, loaded.outer_step, loaded.tokens_seen) == (0, 2, 1, 128)
    assert loaded.controller_state == CONTROLLER_STATE
    assert loaded.extra == {"run_id": "abc", "clock": "trace"}
    assert loaded.model_state.keys() == saved.model_state.keys()
    assert all(torch.equal(loaded.model_state[k], v) for k, v in saved.model_state.items())
    assert torch.equal(loaded.outer_optimizer_state["global_flat"], saved.outer_optimizer_state["global_flat"])
    momentum = loaded.outer_optimizer_state["sgd"]["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, saved.outer_optimizer_state["sgd"]["state"][0]["momentum_buffer"])
    assert loaded.inner_optimizer_state["state"].keys() == saved.inner_optimizer_state["state"].keys()


def test_rng_state_round_trip(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


@pytest.fixture
def saved_checkpoint(tmp_path: Path) -> Path:
    model = torch.nn.Linear(4, 4)
    checkpoint = TrainingCheckpoint(
        island=1, inner_step=10, outer_step=2, tokens_seen=640,
        model_state=model.state_dict(),
        inner_optimizer_state=torch.optim.AdamW(model.parameters()).state_dict(),
        outer_optimizer_state=OuterOptimizer(model, num_islands=2).state_dict(),
        rng_state=capture_rng_state(),
        controller_state=CONTROLLER_STATE,
    )
    return save_checkpoint(tmp_path / "island-1.pt", checkpoint)


def test_truncated_checkpoint_names_the_file(saved_checkpoint: Path) -> None:
    data = saved_checkpoint.read_bytes()
    saved_checkpoint.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="island-1.pt.*corrupt or incomplete"):
        load_checkpoint(saved_checkpoint)


def test_garbage_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(garbage)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent.pt")


def test_foreign_torch_file_is_rejected(tmp_path: Path) -> None:
    foreign = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, foreign)
    with pytest.raises(CheckpointError, match="weights.pt is not a syncsafe"):
        load_checkpoint(foreign)


def test_controller_state_must_be_json(saved_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = load_checkpoint(saved_checkpoint)
    checkpoint.controller_state = {"handle": object()}
    with pytest.raises(TypeError, match="controller_state"):
        save_checkpoint(tmp_path / "bad.pt", checkpoint)
    assert not (tmp_path / "bad.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["island-1.pt"]


def test_save_replaces_atomically_without_temp_files(saved_checkpoint: Path) -> None:
    checkpoint = load_checkpoint(saved_checkpoint)
    checkpoint.inner_step = 11
    save_checkpoint(saved_checkpoint, checkpoint)
    assert load_checkpoint(saved_checkpoint).inner_step == 11
    assert [p.name for p in saved_checkpoint.parent.iterdir()] == [saved_checkpoint.name]
