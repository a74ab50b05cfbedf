"""Schedules: the contract, matched-random draws and the offline bound."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from syncsafe.schedules.derive import matched_random_free, no_sync, offline_bound, random_placement
from syncsafe.schedules.schedule import LoadIntegral, Schedule, ScheduleError, busy_overlap_s, read_schedule, write_schedule


def controller(starts, duration=600.0, window=8.0, gap=10.0, seed=0, policy="wa_diloco") -> Schedule:
    return Schedule(regime="bursty", policy=policy, seed=seed, source="harness", duration_s=duration,
                    window_s=window, min_gap_s=gap, merge_starts_s=starts)


def random_timeline(seed: int, n: int = 120, step: float = 0.5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    busy = rng.random(n) < 0.35
    return pd.DataFrame({"t_s": np.arange(n) * step, "busy": busy, "arrival_rate": 1.0,
                         "inference_pressure": rng.random(n), "network_pressure": 0.1, "checkpoint_pressure": 0.0})


def test_free_matched_random_keeps_the_budget():
    ctl = controller([40.0, 88.0, 136.0, 300.0, 420.0, 560.0])
    for draw in range(50):
        d = matched_random_free(ctl, draw)
        assert (d.n_merges, d.window_s, d.min_gap_s, d.duration_s) == (6, 8.0, 10.0, 600.0)
        assert (d.policy, d.source, d.draw, d.matched_to) == (
            "matched_random_free", "matched_random_free", draw, "wa_diloco")
        starts = np.asarray(d.merge_starts_s)
        assert (np.diff(starts) - 8.0 >= 10.0 - 1e-9).all()
        assert starts[0] >= 0 and starts[-1] + 8.0 <= 600.0


def test_free_matched_random_is_identical_for_the_same_seed_and_draw():
    ctl = controller([40.0, 200.0, 400.0])
    assert matched_random_free(ctl, 3) == matched_random_free(ctl, 3)
    assert matched_random_free(ctl, 3).merge_starts_s != matched_random_free(ctl, 4).merge_starts_s
    other_seed = controller([40.0, 200.0, 400.0], seed=1)
    assert matched_random_free(ctl, 3).merge_starts_s != matched_random_free(other_seed, 3).merge_starts_s


def test_random_placement_is_uniform_over_time():
    rng = np.random.default_rng(0)
    starts = np.concatenate([random_placement(3, 100.0, 5.0, 5.0, rng) for _ in range(4000)])
    counts, _ = np.histogram(starts, bins=5, range=(0, 95))
    # tightly packed placements bias the ends a little; no bin may be starved
    assert counts.min() > 0.6 * counts.mean()


def test_random_placement_rejects_an_impossible_budget():
    with pytest.raises(ValueError, match="do not fit"):
        random_placement(10, 100.0, 8.0, 10.0, np.random.default_rng(0))


def test_load_integral_is_exact_for_partial_steps():
    tl = pd.DataFrame({"t_s": [0.0, 0.5, 1.0, 1.5], "busy": [0, 1, 1, 0], "arrival_rate": 1.0,
                       "inference_pressure": 0.0, "network_pressure": 0.0, "checkpoint_pressure": 0.0})
    load = LoadIntegral(tl)
    assert load.over("busy", [0.25], 1.0)[0] == pytest.approx(0.75)  # [0.25,1.25): 0.5 + 0.25
    assert load.over("busy", [0.0], 2.0)[0] == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(6))
def test_offline_bound_beats_brute_force_and_every_other_schedule(seed):
    tl = random_timeline(seed)  # 60 s at 0.5 s
    load = LoadIntegral(tl)
    ctl = controller([0.0, 14.0, 40.0], duration=60.0, window=4.0, gap=5.0, seed=seed)
    bound = offline_bound(ctl, load)
    assert bound.n_merges == 3 and bound.source == "offline_bound" and bound.matched_to == "wa_diloco"
    best = busy_overlap_s(bound, load)
    # brute force over every grid placement with the min gap
    grid = np.arange(0, 56.5, 0.5)
    brute = min(
        load.over("busy", list(c), 4.0).sum()
        for c in itertools.combinations(grid, 3)
        if c[1] - c[0] >= 9.0 and c[2] - c[1] >= 9.0
    )
    assert best == pytest.approx(brute)
    others = [ctl] + [matched_random_free(ctl, d) for d in range(200)]  # off-grid placements too
    assert all(best <= busy_overlap_s(o, load) + 1e-9 for o in others)


def test_offline_bound_of_zero_merges_and_no_sync():
    load = LoadIntegral(random_timeline(0))
    assert offline_bound(controller([], duration=60.0), load).merge_starts_s == []
    ns = no_sync("bursty", 2, 600.0, 8.0, 10.0)
    assert (ns.policy, ns.source, ns.n_merges, ns.draw, ns.matched_to) == ("no_sync", "no_sync", 0, None, None)


def test_schedule_json_roundtrip_has_the_contract_keys(tmp_path):
    path = write_schedule(tmp_path / "s.json", matched_random_free(controller([40.0, 200.0]), 1))
    keys = set(json.loads(path.read_text()))
    assert keys == {"regime", "policy", "seed", "draw", "matched_to", "source", "duration_s", "window_s",
                    "min_gap_s", "merge_starts_s"}
    assert read_schedule(path) == matched_random_free(controller([40.0, 200.0]), 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"merge_starts_s": [100.0, 50.0]}, "sorted"),
        ({"merge_starts_s": [595.0]}, "inside"),
        ({"merge_starts_s": [100.0, 110.0]}, "min_gap_s"),
        ({"draw": 3}, "draw is set exactly"),
        ({"source": "oracle"}, "source"),
    ],
)
def test_broken_schedule_files_are_rejected(tmp_path, change, message):
    raw = controller([40.0]).model_dump() | change
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ScheduleError, match=message) as err:
        read_schedule(path)
    assert str(path) in str(err.value)


def test_windows_mask():
    s = controller([10.0, 40.0], window=8.0)
    t = np.array([9.9, 10.0, 17.9, 18.0, 39.0, 47.5, 48.0])
    assert s.windows_mask(t).tolist() == [False, True, True, False, False, True, False]
