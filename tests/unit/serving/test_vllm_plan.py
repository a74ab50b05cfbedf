"""The real-server replay plan: seeds split, schedules chosen, order randomised per seed with no-sync first and last."""

from __future__ import annotations

import pandas as pd
import pytest

from syncsafe.config import ConfigError, parse_params
from syncsafe.serving.vllm_plan import choose_schedules, replay_order, vllm_controllers, vllm_seed_split


def rows(seed: int) -> list[pd.Series]:
    names = ["no_sync", "wa_diloco", *(f"matched_random/wa_diloco-{d:03d}" for d in range(3))]
    return [pd.Series({"source": "no_sync" if n == "no_sync" else "train" if n == "wa_diloco" else "matched_random",
                       "path": f"runs/schedule-sets/bursty/seed-{seed}/{n}.json"}) for n in names]


def test_no_sync_runs_first_and_last_and_the_rest_in_a_seeded_shuffle():
    orders = {}
    for seed in range(6):
        order = replay_order("bursty", seed, rows(seed), repeat_no_sync=True)
        assert [r["source"] for r, _ in order][0] == "no_sync" and order[-1][0]["source"] == "no_sync"
        assert [rep for _, rep in order] == [False] * 5 + [True]
        again = replay_order("bursty", seed, rows(seed), repeat_no_sync=True)  # seeded
        assert [(r["path"], rep) for r, rep in again] == [(r["path"], rep) for r, rep in order]
        orders[seed] = tuple(r["path"].rsplit("/", 1)[1] for r, _ in order[1:-1])
    assert len(set(orders.values())) > 1  # not the same order on every seed
    assert len(replay_order("bursty", 0, rows(0), repeat_no_sync=False)) == 5


def test_seed_split_and_schedule_choice(raw_params):
    raw_params["seeds"] = [0, 1, 2, 3, 4]
    raw_params["replay"]["vllm"].update({"seeds": None, "fit_seeds": None, "held_out_seeds": None, "draws": 2,
                                         "regimes": ["bursty"]})
    params = parse_params(raw_params)
    assert vllm_seed_split(params) == ([0], [1, 2, 3])
    assert vllm_controllers(params)[0] == params.analysis.primary.policy
    index = pd.DataFrame([
        {"regime": "bursty", "seed": s, "policy": p, "source": src, "matched_to": m, "draw": d}
        for s in range(5)
        for p, src, m, d in [("no_sync", "no_sync", None, None), (params.analysis.primary.policy, "train", None, None),
                             ("fixed_h", "train", None, None)]
        + [("matched_random", "matched_random", params.analysis.primary.policy, d) for d in range(4)]
    ]).astype({"draw": "Int64"})
    chosen = choose_schedules(params, index)
    assert set(chosen["seed"]) == {0, 1, 2, 3} and "fixed_h" not in set(chosen["policy"])
    assert chosen.groupby("seed").size().tolist() == [4, 4, 4, 4]  # no-sync, the primary, two draws


def test_fit_and_held_out_seeds_may_not_overlap(raw_params):
    raw_params["replay"]["vllm"].update({"seeds": [0, 1], "fit_seeds": [0], "held_out_seeds": [0, 1]})
    with pytest.raises(ConfigError, match="share \\[0\\]"):
        parse_params(raw_params)
