"""The simulator serving backend: the iteration model, merge interference, load, determinism, contract."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import Params
from syncsafe.control.types import FleetSignals
from syncsafe.schedules.schedule import Schedule
from syncsafe.control.serving_model import Calibration, load_calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, SloSpec, summarize
from syncsafe.serving.simulator import WorkClock, simulate_replay
from syncsafe.traces.requests import generate_requests
from syncsafe.traces.timeline import generate_timeline, regime_rng

CAL = Calibration()
STEP_S = 0.5
WINDOW_S = 8.0


def schedule(merge_starts_s: list[float], duration_s: float = 240.0) -> Schedule:
    source = "harness" if merge_starts_s else "no_sync"
    return Schedule(
        regime="bursty", policy=source, seed=0, source=source, duration_s=duration_s,
        window_s=WINDOW_S, min_gap_s=0.0, merge_starts_s=merge_starts_s,
    )


def timeline(duration_s: float, pressure: float | np.ndarray) -> pd.DataFrame:
    t = np.arange(round(duration_s / STEP_S)) * STEP_S
    return pd.DataFrame({"t_s": t, "inference_pressure": np.broadcast_to(pressure, t.shape).astype(float)})


def requests(arrival_s: np.ndarray, prompt: int | np.ndarray = 40, output: int | np.ndarray = 20) -> pd.DataFrame:
    n = len(arrival_s)
    return pd.DataFrame({
        "arrival_s": np.asarray(arrival_s, dtype=float),
        "prompt_tokens": np.broadcast_to(prompt, n).astype(np.int64),
        "output_tokens": np.broadcast_to(output, n).astype(np.int64),
    })


def bursty_load(params: Params) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The 240 s bursty timeline of seed 0 and its requests."""
    tl = generate_timeline("bursty", params.regimes["bursty"], params.traces.step_s, seed=0)
    return tl, generate_requests(tl, params.traces.requests, params.traces.step_s, regime_rng("bursty", 0, "requests"))


# --------------------------------------------------------------------------- the iteration model by hand

#: Round numbers: an iteration costs 10 ms + 1 ms per prompt token + 10 ms per decoding sequence; no noise.
HAND = Calibration(iter_base_ms=10.0, prefill_ms_per_token=1.0, decode_ms_per_seq=10.0, max_batch=8,
                   merge_compute_share=0.5, pressure_slowdown=0.0, residual_sigma=0.0)


def hand_case(merge_starts_s: list[float]) -> pd.DataFrame:
    """A (t=0, 10 prompt, 3 output tokens) and B (t=5 ms, 20 prompt, 2 output); windows of 40 ms."""
    sched = Schedule(regime="bursty", policy="x", seed=0, source="harness" if merge_starts_s else "no_sync",
                     duration_s=10.0, window_s=0.04, min_gap_s=0.0, merge_starts_s=merge_starts_s)
    reqs = requests(np.array([0.0, 0.005]), np.array([10, 20]), np.array([3, 2]))
    return simulate_replay(reqs, timeline(10, 0.0), sched, HAND, seed=0)


def test_two_requests_without_a_merge_match_the_hand_computation():
    # it1 [0, 20): A prefills 10 tokens alone (10 + 10) -> A's first token at 20 ms
    # it2 [20, 60): B prefills 20 tokens while A decodes (10 + 20 + 10) -> B's first token at 60 ms
    # it3 [60, 90): both decode (10 + 2 * 10) -> A's third and B's second token: both done at 90 ms
    out = hand_case([])
    assert out["ttft_ms"].to_numpy() == pytest.approx([20.0, 55.0])
    assert out["e2e_ms"].to_numpy() == pytest.approx([90.0, 85.0])


def test_two_requests_and_one_merge_match_the_hand_computation():
    # the merge [30, 70) ms takes half the compute: work time W = t before 30 ms, 30 + (t - 30) / 2 inside,
    # 50 + (t - 70) after. Iteration ends on work time as above (20, 60, 90) -> wall 20, 80, 110 ms.
    out = hand_case([0.03])
    assert out["ttft_ms"].to_numpy() == pytest.approx([20.0, 75.0])
    assert out["e2e_ms"].to_numpy() == pytest.approx([110.0, 105.0])
    assert out["merge_active"].tolist() == [True, True]


def test_work_clock_is_an_exact_inverse():
    clock = WorkClock(np.array([0.0, 1.0, 3.0, 4.0]), np.array([1.0, 0.25, 2.0, 2.0]))
    t = np.array([-1.0, 0.0, 0.5, 1.0, 2.0, 3.5, 4.0, 10.0])
    w = clock.to_work(t)
    assert w.tolist() == pytest.approx([-1.0, 0.0, 0.5, 1.0, 1.25, 2.5, 3.5, 15.5])
    assert clock.to_wall(w) == pytest.approx(t)


# --------------------------------------------------------------------------- merge interference


def light_load() -> tuple[pd.DataFrame, pd.DataFrame]:
    """One request every 3 s over a wavy pressure: never two in flight, never a queue."""
    t = np.arange(round(240 / STEP_S)) * STEP_S
    return requests(np.arange(1.0, 239.0, 3.0)), timeline(240, 0.5 + 0.4 * np.sin(t / 10.0))


def test_a_schedule_without_merges_is_no_sync_bit_for_bit(params):
    tl, reqs = bursty_load(params)
    empty = Schedule(regime="bursty", policy="fixed_h", seed=0, source="harness", duration_s=240.0,
                     window_s=WINDOW_S, min_gap_s=0.0, merge_starts_s=[])
    pd.testing.assert_frame_equal(simulate_replay(reqs, tl, empty, CAL, seed=0),
                                  simulate_replay(reqs, tl, schedule([]), CAL, seed=0))


def test_latency_rises_only_for_requests_overlapping_merge_windows():
    reqs, tl = light_load()
    merges = schedule([20.0, 60.0, 100.0, 150.0])
    base = simulate_replay(reqs, tl, schedule([]), CAL, seed=0)
    merged = simulate_replay(reqs, tl, merges, CAL, seed=0)
    outside = ~merged["merge_active"].to_numpy()
    assert outside.sum() > 50 and (~outside).sum() >= 8
    for column in ("ttft_ms", "e2e_ms"):  # light load: no queue carries a merge beyond its window
        assert merged[column].to_numpy()[outside] == pytest.approx(base[column].to_numpy()[outside], rel=1e-9)
    assert ((merged["e2e_ms"] / base["e2e_ms"]).to_numpy()[~outside] > 1.0).all()


def test_a_merge_stretches_a_request_s_work_by_at_most_the_merge_slowdown():
    """At constant machine speed (no pressure swing, no jitter) a request stretches by exactly the slowdown
    for the part of its work inside a window: never more. (Under a time-varying speed the stretched work
    moves into other seconds, and the ratio can exceed the slowdown by what those seconds are slower:
    1.80089 against 1.8 on `light_load`; a property of the model, not of the merge.)"""
    reqs, _ = light_load()
    flat = timeline(240, 0.5)
    steady = CAL.model_copy(update={"residual_sigma": 0.0})
    base = simulate_replay(reqs, flat, schedule([]), steady, seed=0)
    merged = simulate_replay(reqs, flat, schedule([20.0, 60.0, 100.0, 150.0]), steady, seed=0)
    active = merged["merge_active"].to_numpy()
    ratio = (merged["e2e_ms"] / base["e2e_ms"]).to_numpy()[active]
    assert active.sum() >= 8 and (ratio > 1.0).all() and (ratio <= steady.merge_slowdown * (1 + 1e-12)).all()
    start = merged["arrival_s"].to_numpy()
    inside = active & schedule([20.0, 60.0, 100.0, 150.0]).windows_mask(start + merged["e2e_ms"].to_numpy() / 1000)
    inside &= schedule([20.0, 60.0, 100.0, 150.0]).windows_mask(start)  # whole life inside a window
    assert inside.sum() >= 4
    whole = (merged["e2e_ms"] / base["e2e_ms"]).to_numpy()[inside]
    assert whole == pytest.approx(np.full(inside.sum(), steady.merge_slowdown), rel=1e-9)


def test_a_merge_builds_a_queue_that_outlasts_its_window(params):
    """Under bursty load: nothing done before the first merge changes; after a window, requests that
    never overlapped it still pay for the queue it left behind."""
    tl, reqs = bursty_load(params)
    base = simulate_replay(reqs, tl, schedule([]), CAL, seed=0)
    merged = simulate_replay(reqs, tl, schedule([30.0, 150.0]), CAL, seed=0)
    done_before = (merged["arrival_s"] + merged["e2e_ms"] / 1000 <= 30.0).to_numpy()
    assert done_before.sum() > 20
    pd.testing.assert_frame_equal(merged[done_before], base[done_before])
    knock_on = ~merged["merge_active"] & (merged["e2e_ms"] > base["e2e_ms"] * 1.01)
    assert knock_on.any()
    assert (merged["e2e_ms"] >= base["e2e_ms"] - 1e-9).all()  # merges never make serving faster


def test_mechanism_shows_in_the_summary(params):
    tl, reqs = bursty_load(params)
    merged = simulate_replay(reqs, tl, schedule([30.0, 80.0, 150.0, 200.0]), CAL, seed=0)
    summary = summarize(merged, SloSpec(e2e_ms=2000.0), high_pressure_threshold=0.5)
    assert summary.sync_ratio_unpaired is not None and summary.sync_ratio_unpaired > 1.3
    assert summary.pressure_ratio is not None and summary.pressure_ratio > 1.0


def test_a_larger_compute_share_never_makes_serving_faster(params):
    tl, reqs = bursty_load(params)
    merges = schedule([30.0, 80.0, 150.0, 200.0])
    p95 = [np.percentile(simulate_replay(reqs, tl, merges, CAL.model_copy(update={"merge_compute_share": s}),
                                         seed=0)["e2e_ms"], 95) for s in (0.0, 0.3, 0.6, 0.9)]
    assert all(b >= a for a, b in zip(p95, p95[1:])), p95


# --------------------------------------------------------------------------- load and seeds


def test_p95_latency_is_monotone_in_load():
    """The same requests (same seed) at higher arrival rates, with pressure tracking the rate."""
    rng = np.random.default_rng(7)
    n = 2000
    unit_arrivals = np.cumsum(rng.exponential(1.0, n))  # a Poisson process at 1 request/s
    prompt, output = rng.integers(10, 120, n), rng.integers(5, 60, n)
    p95 = []
    for rate in (0.5, 1, 2, 4, 8, 12, 16):
        arrivals = unit_arrivals / rate
        tl = timeline(arrivals[-1] + 1.0, pressure=min(rate / 16, 1.0))
        replay = simulate_replay(requests(arrivals, prompt, output), tl, schedule([], duration_s=1e6), CAL, seed=3)
        p95.append(np.percentile(replay["e2e_ms"], 95))
    assert all(b >= a for a, b in zip(p95, p95[1:])), p95
    assert p95[-1] > 3 * p95[0]


def test_replays_are_deterministic_per_seed(params):
    tl, reqs = bursty_load(params)
    merges = schedule([30.0, 150.0])
    first = simulate_replay(reqs, tl, merges, CAL, seed=1)
    pd.testing.assert_frame_equal(first, simulate_replay(reqs, tl, merges, CAL, seed=1))
    other = simulate_replay(reqs, tl, merges, CAL, seed=2)
    assert not np.allclose(first["e2e_ms"], other["e2e_ms"])
    pd.testing.assert_frame_equal(first.drop(columns=["ttft_ms", "e2e_ms", "merge_active"]),
                                  other.drop(columns=["ttft_ms", "e2e_ms", "merge_active"]))


def test_results_do_not_depend_on_request_row_order(params):
    tl, reqs = bursty_load(params)
    merges = schedule([30.0, 150.0])
    shuffled = reqs.sample(frac=1.0, random_state=0)
    a = simulate_replay(reqs, tl, merges, CAL, seed=0)
    b = simulate_replay(shuffled, tl, merges, CAL, seed=0)
    assert b["arrival_s"].tolist() == shuffled["arrival_s"].tolist()  # rows come back in input order
    key = ["arrival_s", "prompt_tokens", "output_tokens"]
    pd.testing.assert_frame_equal(
        a.drop(columns="request_id").sort_values(key).reset_index(drop=True),
        b.drop(columns="request_id").sort_values(key).reset_index(drop=True),
    )


# --------------------------------------------------------------------------- contract and inputs


def test_output_contract(params):
    tl, reqs = bursty_load(params)
    out = simulate_replay(reqs, tl, schedule([30.0]), CAL, seed=0)
    assert tuple(out.columns) == REQUEST_RESULT_COLUMNS
    assert out["request_id"].tolist() == list(range(len(reqs)))
    assert (out["send_s"] == reqs["arrival_s"]).all() and (out["arrival_s"] == reqs["arrival_s"]).all()
    assert (out["output_tokens_received"] == reqs["output_tokens"]).all()
    assert (out["error"] == "").all() and out["merge_active"].dtype == bool
    assert (out["ttft_ms"] > 0).all() and (out["e2e_ms"] >= out["ttft_ms"]).all()
    row = np.clip(np.floor(reqs["arrival_s"].to_numpy() / STEP_S).astype(int), 0, len(tl) - 1)
    assert np.array_equal(out["inference_pressure"].to_numpy(), tl["inference_pressure"].to_numpy()[row])


def test_empty_request_table_gives_an_empty_result():
    out = simulate_replay(requests(np.array([])), timeline(10, 0.5), schedule([]), CAL, seed=0)
    assert tuple(out.columns) == REQUEST_RESULT_COLUMNS and out.empty


@pytest.mark.parametrize("column", ["arrival_s", "prompt_tokens", "output_tokens"])
def test_missing_request_column_is_named(column):
    reqs = requests(np.array([1.0, 2.0])).drop(columns=column)
    with pytest.raises(ValueError, match=f"request table: missing column.*'{column}'"):
        simulate_replay(reqs, timeline(10, 0.5), schedule([]), CAL, seed=0)


def test_bad_request_values_and_timelines_are_refused():
    good = requests(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="output_tokens must be whole numbers >= 0"):
        simulate_replay(good.assign(output_tokens=[3, -1]), timeline(10, 0.5), schedule([]), CAL, seed=0)
    with pytest.raises(ValueError, match="arrival_s must be finite"):
        simulate_replay(good.assign(arrival_s=[1.0, np.nan]), timeline(10, 0.5), schedule([]), CAL, seed=0)
    with pytest.raises(ValueError, match="load timeline: missing column.*'inference_pressure'"):
        simulate_replay(good, timeline(10, 0.5).drop(columns="inference_pressure"), schedule([]), CAL, seed=0)
    uneven = pd.DataFrame({"t_s": [0.0, 0.5, 1.5], "inference_pressure": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match="fixed step"):
        simulate_replay(good, uneven, schedule([]), CAL, seed=0)


# --------------------------------------------------------------------------- model pieces


def test_merge_active_means_the_life_overlaps_a_window():
    merges = schedule([10.0])  # [10, 18)
    start = np.array([5.0, 5.0, 18.0, 12.0, 9.0, 17.5])
    end = np.array([10.0, 10.001, 20.0, 12.0, 30.0, 17.5])
    assert merges.overlaps(start, end).tolist() == [False, True, False, True, True, True]
    assert not schedule([]).overlaps(start, end).any()


def test_calibration_keeps_its_public_meaning_and_reads_old_files(tmp_path):
    cal = Calibration()
    assert (cal.pressure_slowdown, cal.capacity_rps, cal.fitted) == (0.6, 8.0, False)
    assert cal.merge_slowdown == pytest.approx(1.8)
    old = tmp_path / "calibration.json"
    old.write_text('{"merge_slowdown": 2.0, "pressure_slowdown": 0.5, "capacity_rps": 10.0, "fitted": true}')
    loaded = load_calibration(old)
    assert loaded.merge_compute_share == pytest.approx(0.5) and loaded.merge_slowdown == pytest.approx(2.0)
    signals = FleetSignals(t_s=0.0, busy=True, arrival_rate=5.0, inference_pressure=0.4,
                           network_pressure=0.1, checkpoint_pressure=0.05)
    assert loaded.expected_merge_cost(signals) == pytest.approx(0.5 * 1.0 * (1 + 0.5 * 0.4))
    tilted = Calibration(merge_compute_share=0.4, merge_share_skew=0.5)
    assert tilted.merge_shares() == pytest.approx((0.6, 0.2))
    assert tilted.merge_slowdown == pytest.approx((1 / 0.4 + 1 / 0.8) / 2)


def test_iteration_cost_and_service_time():
    cal = Calibration(iter_base_ms=5.0, prefill_ms_per_token=0.5, decode_ms_per_seq=2.0)
    assert cal.iteration_ms(10, 3) == 5.0 + 5.0 + 6.0
    # alone: one prefill iteration (5 + 0.5 * 40) then 19 decode iterations of one sequence (5 + 2)
    assert cal.service_ms(40, 20) == pytest.approx(25.0 + 19 * 7.0)
