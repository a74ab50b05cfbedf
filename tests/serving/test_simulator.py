"""The simulator serving backend: merge interference, load, determinism, contract."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import Params
from syncsafe.control.types import FleetSignals
from syncsafe.schedules.schedule import Schedule
from syncsafe.serving.calibration import Calibration, load_calibration
from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, SloSpec, summarize
from syncsafe.serving.simulator import merge_phase_clock, overlaps_merge_window, simulate_replay
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


# --------------------------------------------------------------------------- merge interference


def light_load() -> tuple[pd.DataFrame, pd.DataFrame]:
    """One request every 3 s over a wavy pressure: never two in flight, never a queue."""
    t = np.arange(round(240 / STEP_S)) * STEP_S
    return requests(np.arange(1.0, 239.0, 3.0)), timeline(240, 0.5 + 0.4 * np.sin(t / 10.0))


def test_latency_rises_only_for_requests_overlapping_merge_windows():
    reqs, tl = light_load()
    merges = schedule([20.0, 60.0, 100.0, 150.0])
    base = simulate_replay(reqs, tl, schedule([]), CAL, seed=0)
    merged = simulate_replay(reqs, tl, merges, CAL, seed=0)
    for replay in (base, merged):  # the premise: light load, no request waits or shares the batch
        done = replay["arrival_s"] + replay["e2e_ms"] / 1000
        assert (done.to_numpy()[:-1] < replay["arrival_s"].to_numpy()[1:]).all()

    outside = ~merged["merge_active"].to_numpy()
    assert outside.sum() > 50 and (~outside).sum() >= 8
    for column in ("ttft_ms", "e2e_ms"):  # bit for bit the no-sync latency
        assert np.array_equal(merged[column].to_numpy()[outside], base[column].to_numpy()[outside])

    ratio = (merged["e2e_ms"] / base["e2e_ms"]).to_numpy()[~outside]
    assert (ratio > 1.0).all() and (ratio <= CAL.merge_slowdown * (1 + 1e-12)).all()
    arrival = merged["arrival_s"].to_numpy()
    done = arrival + merged["e2e_ms"].to_numpy() / 1000
    inside = np.zeros(len(merged), dtype=bool)
    for start in merges.merge_starts_s:
        inside |= (arrival >= start) & (done <= start + WINDOW_S)
    assert inside.sum() >= 6
    assert (merged["e2e_ms"] / base["e2e_ms"])[inside].to_numpy() == pytest.approx(CAL.merge_slowdown, rel=1e-9)


def test_merges_reach_other_requests_only_after_they_start(params):
    """Under bursty load with queueing: no request finished before the first merge changes,
    while later requests outside merge windows can pay knock-on queueing."""
    tl, reqs = bursty_load(params)
    base = simulate_replay(reqs, tl, schedule([]), CAL, seed=0)
    merged = simulate_replay(reqs, tl, schedule([30.0, 150.0]), CAL, seed=0)
    done_before = (merged["arrival_s"] + merged["e2e_ms"] / 1000 <= 30.0).to_numpy()
    assert done_before.sum() > 20
    pd.testing.assert_frame_equal(merged[done_before], base[done_before])
    knock_on = ~merged["merge_active"] & (merged["e2e_ms"] > base["e2e_ms"])
    assert knock_on.any()
    assert (merged["e2e_ms"] >= base["e2e_ms"] - 1e-9).mean() > 0.95  # merges never make serving faster overall


def test_mechanism_shows_in_the_summary(params):
    tl, reqs = bursty_load(params)
    merged = simulate_replay(reqs, tl, schedule([30.0, 80.0, 150.0, 200.0]), CAL, seed=0)
    summary = summarize(merged, SloSpec(e2e_ms=2000.0), high_pressure_threshold=0.5)
    assert summary.sync_ratio is not None and summary.sync_ratio > 1.3
    assert summary.pressure_ratio is not None and summary.pressure_ratio > 1.0


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


def test_merge_phase_clock_integrates_the_merge_slowdown_exactly():
    finish = merge_phase_clock(schedule([10.0, 30.0]), merge_slowdown=2.0)  # windows [10, 18), [30, 38)
    assert finish(1.0, 2.0) == 3.0  # before any window
    assert finish(9.0, 2.0) == pytest.approx(12.0)  # 1 s full speed, then 1 s of work at half speed
    assert finish(17.0, 5.0) == pytest.approx(22.5)  # 0.5 s of work fits the last second of the window
    assert finish(9.0, 10.0) == pytest.approx(23.0)  # spans the whole first window
    assert finish(28.0, 20.0) == pytest.approx(52.0)  # 2 s, 4 s of work in [30, 38), 14 s after
    assert finish(18.0, 1.0) == 19.0  # windows are half-open: [10, 18)


def test_merge_active_means_the_life_overlaps_a_window():
    merges = schedule([10.0])  # [10, 18)
    start = np.array([5.0, 5.0, 18.0, 12.0, 9.0, 17.5])
    end = np.array([10.0, 10.001, 20.0, 12.0, 30.0, 17.5])
    assert overlaps_merge_window(merges, start, end).tolist() == [False, True, False, True, True, True]
    assert not overlaps_merge_window(schedule([]), start, end).any()


def test_calibration_keeps_its_old_fields_and_reads_old_files(tmp_path):
    cal = Calibration()
    assert (cal.merge_slowdown, cal.pressure_slowdown, cal.capacity_rps, cal.fitted) == (1.8, 0.6, 8.0, False)
    old = tmp_path / "calibration.json"
    old.write_text('{"merge_slowdown": 2.0, "pressure_slowdown": 0.5, "capacity_rps": 10.0, "fitted": true}')
    loaded = load_calibration(old)
    assert loaded.merge_slowdown == 2.0 and loaded.max_batch == cal.max_batch
    signals = FleetSignals(t_s=0.0, busy=True, arrival_rate=5.0, inference_pressure=0.4,
                           network_pressure=0.1, checkpoint_pressure=0.05)
    assert loaded.expected_merge_cost(signals) == pytest.approx(0.5 * 1.0 * (1 + 0.5 * 0.4))
    assert cal.batch_multiplier(1.0) == 1.0 and cal.batch_multiplier(float(cal.max_batch + 1)) == 1 + cal.batch_slowdown
