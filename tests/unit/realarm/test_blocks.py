"""Campaign blocks: a finished block is kept under its fingerprint, read back as it was measured, replaced by
nothing half-written, and dropped once the plan no longer names it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from syncsafe.artifacts import layout
from syncsafe.artifacts.traces import TIMELINE_COLUMNS, read_requests, read_timeline
from syncsafe.realarm.arm import Measured, PlannedReplay
from syncsafe.realarm.blocks import BLOCK_FILE, load_block, make_block, model_digest, prune_blocks, save_block
from syncsafe.realarm.design import RealPlan, RegimePlan
from syncsafe.schedules.schedule import Schedule


def _trace(root, seed: int, shift: float = 0.0) -> None:
    where = layout.trace_dir(root, "bursty", seed)
    where.mkdir(parents=True, exist_ok=True)
    requests = pd.DataFrame({"arrival_s": np.arange(5.0) + shift, "prompt_tokens": [8] * 5, "output_tokens": [4] * 5})
    requests.to_parquet(where / layout.REQUESTS_FILE, index=False)
    timeline = pd.DataFrame({c: np.ones(5) for c in TIMELINE_COLUMNS}).assign(t_s=np.arange(5.0))
    timeline.to_parquet(where / layout.TIMELINE_FILE, index=False)


def _items(root, seed: int) -> list[PlannedReplay]:
    out = []
    for position, (policy, starts) in enumerate([("no_sync", []), ("fixed_h", [10.0, 50.0])]):
        schedule = Schedule(regime="bursty", policy=policy, seed=seed, source="no_sync" if not starts else "train",
                            duration_s=120.0, window_s=8.0, min_gap_s=10.0, merge_starts_s=starts)
        row = pd.Series({"regime": "bursty", "policy": policy, "seed": seed, "source": schedule.source,
                         "path": f"runs/schedules/bursty/seed-{seed}/{policy}/schedule.json"})
        out.append(PlannedReplay(row, schedule, root / "runs" / "replay-sets" / "vllm" / f"seed-{seed}" / policy,
                                 0 if not starts else None, position, 0))
    return out


def _block(params, root, plan, label: str, items: list[PlannedReplay], model: str):
    """make_block with what the replay stage hands it: each seed's trace as read, the model's digest."""
    inputs = {s: (read_requests(root, "bursty", s), read_timeline(root, "bursty", s)) for s in (0, 1)}
    return make_block(params, root, plan, "bursty", label, items, inputs, model_digest(model))


def _measured(item: PlannedReplay, scale: float) -> Measured:
    results = pd.DataFrame({"e2e_ms": np.array([10.0, 20.0, 30.0]) * scale, "merge_active": [False, True, False]})
    signals = pd.DataFrame({"t_s": [0.0, 1.0], "running": [1.0, 2.0]})
    windows = pd.DataFrame({"start_s": [10.0], "end_s": [18.0], "iterations": [3]})
    return Measured(item, results, signals, windows, {"position": item.position, "valid": True, "top": [["x", 0.5]]})


@pytest.fixture
def setting(tmp_path, params):
    plan = RealPlan(regimes={"bursty": RegimePlan(regime="bursty", time_scale=2.0, span_s=90.0, fit_seeds=[0],
                                                  held_out_seeds=[1], controllers=["fixed_h"], draws=1, controls=1,
                                                  expected_wall_s=100.0)})
    for seed in (0, 1):
        _trace(tmp_path, seed)
    return params, plan, tmp_path


def test_a_saved_block_reads_back_as_measured_and_only_under_its_fingerprint(setting):
    params, plan, root = setting
    items = _items(root, 0)
    block = _block(params, root, plan, "seed-0", items, "tiny-model")
    assert load_block(root, block) is None, "nothing kept yet"
    measured = [_measured(i, 1.0 + k) for k, i in enumerate(items)]
    where = save_block(root, block, measured)
    assert where == layout.at(root, layout.REAL_BLOCKS) / "bursty" / block.name
    kept = load_block(root, block)
    assert kept is not None and [m.item for m in kept] == items
    for a, b in zip(kept, measured):
        for name in ("results", "signals", "windows"):
            pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
        assert json.dumps(a.extra, sort_keys=True) == json.dumps(b.extra, sort_keys=True)
    # the same block planned again finds it; a changed input is another block
    again = _block(params, root, plan, "seed-0", _items(root, 0), "tiny-model")
    assert again.fingerprint == block.fingerprint and load_block(root, again) is not None
    other_model = _block(params, root, plan, "seed-0", items, "other-model")
    wider = plan.model_copy(update={"regimes": {"bursty": plan.regimes["bursty"].model_copy(update={"span_s": 100.0})}})
    other_span = _block(params, root, wider, "seed-0", items, "tiny-model")
    _trace(root, 0, shift=0.5)
    other_trace = _block(params, root, plan, "seed-0", items, "tiny-model")
    later = [items[0], PlannedReplay(items[1].row, items[1].schedule, items[1].out, None, 2, 0)]
    other_order = _block(params, root, plan, "seed-0", later, "tiny-model")
    weights = root / "model" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"one")
    first = model_digest(weights.parent)
    weights.write_bytes(b"two")
    assert model_digest(weights.parent) != first, "the weights' bytes, not the folder's name"
    prints = {b.fingerprint for b in (block, other_model, other_span, other_trace, other_order)}
    assert len(prints) == 5
    assert all(load_block(root, b) is None for b in (other_model, other_span, other_trace, other_order))


def test_a_record_that_does_not_match_is_not_taken_and_a_mismatch_is_refused(setting):
    params, plan, root = setting
    items = _items(root, 1)
    block = _block(params, root, plan, "seed-1", items, "m")
    with pytest.raises(ValueError, match="do not match"):
        save_block(root, block, [_measured(items[1], 1.0), _measured(items[0], 1.0)])
    assert not block.directory(root).exists(), "nothing half-written"
    save_block(root, block, [_measured(i, 1.0) for i in items])
    record = block.directory(root) / BLOCK_FILE
    record.write_text(record.read_text().replace(block.fingerprint, "0" * 64))
    assert load_block(root, block) is None


def test_prune_keeps_only_the_blocks_the_plan_names(setting):
    params, plan, root = setting
    blocks = [_block(params, root, plan, f"seed-{s}", _items(root, s), "m") for s in (0, 1)]
    for b in blocks:
        save_block(root, b, [_measured(i, 1.0) for i in b.items])
    stale = layout.at(root, layout.REAL_BLOCKS) / "steady" / "seed-0-0123456789abcdef"
    stale.mkdir(parents=True)
    removed = prune_blocks(root, blocks[:1])
    assert set(removed) == {stale, blocks[1].directory(root)}
    assert load_block(root, blocks[0]) is not None and load_block(root, blocks[1]) is None
    assert not stale.parent.exists(), "an emptied regime folder goes too"


def test_the_report_states_the_blocks_each_regime_pools_and_which_an_earlier_run_finished(tmp_path):
    from syncsafe.analysis.stage import campaign_block_lines

    assert campaign_block_lines(tmp_path) == []  # no real arm: nothing to state
    path = layout.at(tmp_path, layout.VLLM_BLOCKS)
    path.parent.mkdir(parents=True)
    blocks = [{"regime": "bursty", "label": "seed-1", "replays": 6, "fingerprint": "a", "resumed": True},
              {"regime": "bursty", "label": "seed-0", "replays": 6, "fingerprint": "b", "resumed": False},
              {"regime": "bursty", "label": "extra-controls", "replays": 2, "fingerprint": "c", "resumed": False},
              {"regime": "azure_conv", "label": "seed-0", "replays": 5, "fingerprint": "d", "resumed": False}]
    path.write_text(json.dumps({"blocks": blocks}))
    assert campaign_block_lines(tmp_path) == [
        "- azure_conv: 1 campaign block(s) pooled (seed-0; 5 replays)",
        "- bursty: 3 campaign block(s) pooled (seed-1, seed-0, extra-controls; 14 replays), 1 finished by an earlier "
        "run and kept"]
