"""Streaming DiLoCo's fragments: how a model is cut, and what merging one fragment does and leaves alone.

Islands are simulated in-process (threads meeting in a fake all-reduce, as in test_diloco_outer.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from outer_case import ThreadedAllReduce
from syncsafe.config import ConfigError, parse_params
from syncsafe.diloco.fragments import FragmentError, cut_fragments
from syncsafe.diloco.outer import OuterOptimizer, ParameterLayout, flatten_parameters, ring_all_reduce_bytes

ISLANDS = 2


def tiny_llama(seed: int = 0, layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=48, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=32, max_position_embeddings=32,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def islands(fragments: int, alpha_seed: int = 0) -> tuple[list[OuterOptimizer], list[nn.Module]]:
    """Two islands from one start, each then moved apart by its own noise (as if it had trained)."""
    models = [tiny_llama() for _ in range(ISLANDS)]
    outers = [OuterOptimizer(m, num_islands=ISLANDS, lr=0.7, momentum=0.9, fragments=fragments) for m in models]
    drift(models, alpha_seed)
    return outers, models


def drift(models: list[nn.Module], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for model in models:
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=generator))


def merge_all(outers, models, fragment: int, alpha: float = 0.0):
    collective = ThreadedAllReduce(len(outers))

    def one(i: int):
        outer, model = outers[i], models[i]
        start = lambda buffer: (lambda reduced=collective.for_island(i)(buffer): reduced)  # noqa: E731
        return outer.finish(model, outer.launch(model, start, 1.0, fragment), alpha)

    with ThreadPoolExecutor(max_workers=len(outers)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(one, i) for i in range(len(outers))]]


def test_fragments_are_contiguous_layer_groups_with_the_embeddings_first_and_the_head_last():
    layout = ParameterLayout.of(tiny_llama())
    two = cut_fragments(layout.names, layout.numels, 2)
    names = [layout.names[f.first_param:f.end_param] for f in two]
    assert names[0][0] == "model.embed_tokens.weight" and names[1][-1] == "lm_head.weight"
    assert "model.norm.weight" in names[1]
    assert {n.split(".")[2] for n in names[0] if ".layers." in n} == {"0", "1"}
    assert {n.split(".")[2] for n in names[1] if ".layers." in n} == {"2", "3"}
    assert [(f.start, f.end) for f in two] == [(0, two[0].end), (two[0].end, layout.total)]
    three = cut_fragments(layout.names, layout.numels, 3)  # numpy's array_split: layers [0, 1], [2], [3]
    assert [{n.split(".")[2] for n in layout.names[f.first_param:f.end_param] if ".layers." in n} for f in three] \
        == [{"0", "1"}, {"2"}, {"3"}]
    assert cut_fragments(("w", "b"), (3, 2), 1)[0].numel == 5  # one fragment: any model, the whole of it
    with pytest.raises(FragmentError, match="train.sync.fragments 5: the model has 4 decoder layers"):
        cut_fragments(layout.names, layout.numels, 5)
    with pytest.raises(FragmentError, match="parameter 'between' breaks the layer order"):
        cut_fragments(("layers.0.w", "between", "layers.1.w"), (1, 1, 1), 2)


def test_every_fragment_merged_at_one_point_is_the_full_merge_bit_for_bit():
    """Pseudo-gradient, averaging and the outer Nesterov step are elementwise: the F fragment merges of one
    point give the bytes of one whole-model merge, over merges with momentum."""
    full, full_models = islands(1)
    streamed, streamed_models = islands(2)
    for round_ in range(3):
        merge_all(full, full_models, 0)
        for fragment in (0, 1):
            merge_all(streamed, streamed_models, fragment)
        assert torch.equal(full[0].global_flat, streamed[0].global_flat)
        for a, b in zip(full_models[0].parameters(), streamed_models[0].parameters()):
            assert torch.equal(a, b)
        drift(full_models, round_ + 1)
        drift(streamed_models, round_ + 1)
    momentum = torch.cat([streamed[0].sgd.state[p]["momentum_buffer"] for p in streamed[0].fragment_params])
    assert torch.equal(full[0].sgd.state[full[0].fragment_params[0]]["momentum_buffer"], momentum)


def test_a_fragment_merge_touches_its_range_alone_and_sends_its_bytes():
    outers, models = islands(2)
    frag = outers[0].fragments[1]
    global_before = outers[0].global_flat.clone()
    local_before = flatten_parameters(models[0])
    stats = merge_all(outers, models, 1)
    after, local_after = outers[0].global_flat, flatten_parameters(models[0])
    assert torch.equal(after[: frag.start], global_before[: frag.start])
    assert not torch.equal(after[frag.start:], global_before[frag.start:])
    assert torch.equal(local_after[: frag.start], local_before[: frag.start])  # fragment 0 keeps training apart
    assert torch.equal(local_after[frag.start:], after[frag.start:])
    assert outers[0].sgd.state.get(outers[0].fragment_params[0], {}) == {}  # no momentum where nothing merged
    payload = 4 * (frag.numel + 1)  # fp32 pseudo-gradient of the fragment and the island's weight
    assert stats[0].fragment == 1 and stats[0].payload_bytes == payload
    assert stats[0].bytes_communicated == ring_all_reduce_bytes(payload, ISLANDS) == round(2 * payload * 1 / 2)


def test_alpha_mixes_the_merged_fragment_local_and_global():
    outers, models = islands(2)
    frag = outers[0].fragments[0]
    local_before = flatten_parameters(models[0])[frag.start:frag.end]
    merge_all(outers, models, 0, alpha=0.25)
    new_global = outers[0].global_flat[frag.start:frag.end]
    local = flatten_parameters(models[0])[frag.start:frag.end]
    torch.testing.assert_close(local, 0.25 * local_before + 0.75 * new_global, rtol=0, atol=1e-7)
    assert not torch.equal(local, new_global)


def test_outer_state_of_another_fragment_count_is_refused():
    outers, _ = islands(2)
    other = OuterOptimizer(tiny_llama(), num_islands=ISLANDS, fragments=1)
    with pytest.raises(ValueError, match=r"outer state is for 2 fragment\(s\), this run has 1"):
        other.load_state_dict(outers[0].state_dict())


def test_streaming_settings_are_checked_where_they_are_read(tiny_raw):
    raw = tiny_raw()
    raw["train"]["sync"] = {"mode": "full", "fragments": 2}
    with pytest.raises(ConfigError, match=r"train.sync.*fragments \(2\): streaming settings; with mode full they "
                                          r"are fragments 1, fragment_update_alpha 0, fragment_sync_delay 0"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "overlapped", "fragment_sync_delay": 2}  # a streaming setting
    with pytest.raises(ConfigError, match=r"fragment_sync_delay \(2\): streaming settings; with mode overlapped"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 2, "overlap_rounds": 1}
    with pytest.raises(ConfigError, match=r"overlap_rounds \(1\) is an overlapped setting; with mode streaming"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "overlapped", "overlap_rounds": 2}
    with pytest.raises(ConfigError, match="overlap_rounds"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 2, "fragment_sync_delay": raw["control"]["min_h"] + 1}
    with pytest.raises(ConfigError, match=r"train.sync.fragment_sync_delay \(\d+\) must be <= control.min_h"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 3}  # the builtin model has 2 layers
    with pytest.raises(ConfigError, match=r"sync.fragments \(3\) exceeds model.num_layers \(2\)"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 2, "fragment_update_alpha": 1.0}
    with pytest.raises(ConfigError, match="fragment_update_alpha"):
        parse_params(raw)
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 2, "fragment_update_alpha": 0.5}
    assert parse_params(raw).train.sync.fragments == 2
