"""Capacity search, load scale and the noise probe's arithmetic (the search on the real server: tests/integration/test_vllm.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from syncsafe.realarm.capacity import (
    MAX_PROBES,
    MIN_PROBE_REQUESTS,
    CONFIRM_REPEATS,
    LoadError,
    check_capacity,
    LoadShape,
    coarse_time_scale,
    confirm_capacity,
    load_scale,
    load_shape,
    noise_probe,
    poisson_requests,
    search_capacity,
    window_rates,
)

MIX = pd.DataFrame({"prompt_tokens": [40, 60, 80], "output_tokens": [20, 30, 40]})


def queue_sender(capacity: float, base_ms: float = 10.0):
    """A sender whose TTFT grows like an M/M/1 queue's wait as the offered rate nears `capacity`."""
    sent: list[float] = []

    def send(requests: pd.DataFrame, epoch: float) -> pd.DataFrame:
        duration = float(requests["arrival_s"].max()) if len(requests) else 1.0
        rate = len(requests) / max(duration, 1e-9)
        sent.append(rate)
        wait = base_ms / max(1.0 - rate / capacity, 1e-3)
        ttft = np.full(len(requests), wait) * np.linspace(0.9, 1.1, len(requests))
        return pd.DataFrame({"ttft_ms": ttft, "e2e_ms": ttft * 3, "error": [""] * len(requests)})

    return send, sent


def test_the_search_finds_the_knee_within_a_bisection_step():
    send, sent = queue_sender(capacity=50.0)
    capacity, bound, probes = search_capacity(send, MIX, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    assert bound == pytest.approx(3 * probes[0].ttft_p95_ms)
    # sustained while wait <= 3x the light-load wait: 1 - rate / 50 >= (1 - light / 50) / 3
    knee = 50.0 * (1 - (1 - probes[0].rate_rps / 50.0) / 3)
    assert 0.75 * knee <= capacity <= knee * 1.05
    assert probes[0].rate_rps == pytest.approx(3.0) and all(p.sustained for p in probes if p.rate_rps <= capacity)
    assert any(not p.sustained for p in probes) and len(probes) <= MAX_PROBES


def test_one_stalled_probe_is_retried_and_leaves_the_capacity_where_it_was():
    """A rate fails only when a retry with other arrivals fails too: a single stall (a 2-core machine's
    hiccup) used to end the search there and halve the capacity."""
    clean, _ = queue_sender(capacity=50.0)
    expected = confirm_capacity(clean, MIX, *_searched(clean), seed=0)[0]
    calls = {"n": 0}

    def stalls_once(requests, epoch):
        calls["n"] += 1
        rows = clean(requests, epoch)
        return rows.assign(ttft_ms=10_000.0) if calls["n"] == 3 else rows  # the third probe stalls

    knee, bound, probes = search_capacity(stalls_once, MIX, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    confirmed, repeats = confirm_capacity(stalls_once, MIX, knee, probes[0].rate_rps, 20.0, bound, seed=0)
    assert confirmed == pytest.approx(expected)
    stalled, retry = probes[2], probes[3]
    assert not stalled.sustained and retry.sustained and retry.rate_rps == stalled.rate_rps


def _searched(send):
    knee, bound, probes = search_capacity(send, MIX, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    return knee, probes[0].rate_rps, 20.0, bound


def test_a_pinned_rate_the_server_holds_is_checked_in_a_few_probes_and_one_it_does_not_is_searched():
    send, sent = queue_sender(capacity=50.0)
    capacity, bound, probes = check_capacity(send, MIX, 25.0, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    assert capacity == 25.0 and bound == pytest.approx(3 * probes[0].ttft_p95_ms)
    assert len(probes) == 1 + CONFIRM_REPEATS and all(p.sustained for p in probes)
    assert max(p.rate_rps for p in probes) == 25.0, "nothing above the pinned need is probed"
    searched = confirm_capacity(send, MIX, *_searched(send), seed=0)[0]
    too_much, _, probes = check_capacity(send, MIX, 60.0, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    assert too_much == pytest.approx(searched) and too_much < 60.0  # what it holds, for the refusal to name
    assert not probes[1].sustained and not probes[2].sustained and probes[2].rate_rps == 60.0  # the retry


def test_a_server_that_fails_at_light_load_is_refused():
    def failing(requests, epoch):
        return pd.DataFrame({"ttft_ms": np.nan, "e2e_ms": np.nan, "error": ["HTTP 500"] * len(requests)})

    with pytest.raises(LoadError, match="failed requests at a light load"):
        search_capacity(failing, MIX, 10.0, 5.0, 3.0)


def test_poisson_probes_are_seeded_with_the_mix():
    a = poisson_requests(20.0, 10.0, MIX, seed=1)
    assert a.equals(poisson_requests(20.0, 10.0, MIX, seed=1))
    assert 150 < len(a) < 250 and a["arrival_s"].is_monotonic_increasing and a["arrival_s"].max() < 10.0
    assert set(a["prompt_tokens"]) <= {40, 60, 80}


def test_window_rates_and_the_busiest_window():
    arrivals = [np.arange(0.0, 100.0, 1.0), np.concatenate([np.arange(0.0, 50.0, 1.0), np.arange(50.0, 58.0, 0.25)])]
    rates = window_rates(arrivals, 8.0, 100.0)
    assert rates.max() == pytest.approx(4.0) and np.median(rates) == pytest.approx(1.0)
    shape = load_shape(arrivals, 8.0, 100.0)
    assert (shape.peak_rate, shape.median_rate) == (pytest.approx(4.0), pytest.approx(1.0))


def test_the_time_scale_puts_the_busiest_window_at_most_at_the_target_utilisation_on_a_coarse_grid():
    scale, peak_u, median_u = load_scale("bursty", 60.0, LoadShape(6.0, 1.5), 0.7, None)
    # 0.7 * 60 / 6 = 7 is rounded down onto the grid: 6
    assert scale == pytest.approx(6.0) and peak_u == pytest.approx(0.6) and median_u == pytest.approx(0.15)
    assert load_scale("bursty", 60.0, LoadShape(6.0, 1.5), 0.8, None)[0] == pytest.approx(8.0)


def test_the_coarse_grid_gives_two_nearby_capacities_the_same_time_scale():
    assert [coarse_time_scale(x) for x in (0.31, 1.0, 1.49, 3.18, 3.9, 7.0, 9.99, 12.5, 33.0)] == \
        [0.3, 1.0, 1.25, 3.0, 3.0, 6.0, 8.0, 12.5, 30.0]
    for raw in np.geomspace(0.05, 500.0, 200):
        grid = coarse_time_scale(raw)
        assert grid <= raw * (1 + 1e-9) and raw / grid < 4 / 3 + 1e-9  # at most one grid step below
    with pytest.raises(LoadError):
        coarse_time_scale(float("nan"))


def test_the_capacity_is_confirmed_by_repeats_and_stepped_down_when_one_fails():
    send, sent = queue_sender(capacity=50.0)
    _, bound, probes = search_capacity(send, MIX, first_guess_rps=30.0, probe_s=20.0, ttft_factor=3.0)
    confirmed, repeats = confirm_capacity(send, MIX, 45.0, probes[0].rate_rps, 20.0, bound, seed=0)
    assert confirmed < 45.0 and all(p.sustained for p in repeats if p.rate_rps == confirmed)
    assert sum(p.rate_rps == confirmed for p in repeats) == 2 and not repeats[0].sustained
    held, again = confirm_capacity(send, MIX, 20.0, probes[0].rate_rps, 20.0, bound, seed=0)
    assert held == 20.0 and len(again) == 2 and all(p.sustained for p in again)
    floor, _ = confirm_capacity(send, MIX, 49.9, 40.0, 20.0, bound, seed=0)  # never sustained above the floor
    assert floor == 40.0


def test_a_pinned_time_scale_over_the_target_utilisation_is_refused_in_one_line_naming_what_it_holds():
    # capacity 60, busiest window 6 req/s per trace second: 0.7 x 60 / 6 = 7 -> the grid's 6 is the largest held
    with pytest.raises(LoadError, match=r"regime bursty: the pinned replay.vllm.time_scale 8 .* 80% of .*"
                                        r"over target_utilisation 70%; the largest time scale this machine holds is 6$") as err:
        load_scale("bursty", 60.0, LoadShape(6.0, 1.5), 0.7, 8.0)
    assert "\n" not in str(err.value)
    with pytest.raises(LoadError, match="largest time scale this machine holds is 1$"):
        load_scale("azure_conv", 10.0, LoadShape(6.0, 3.0), 0.7, 4.0)
    assert load_scale("bursty", 60.0, LoadShape(6.0, 1.5), 0.7, 6.0) == pytest.approx((6.0, 0.6, 0.15))
    assert load_scale("bursty", 120.0, LoadShape(6.0, 1.5), 0.7, 6.0) == pytest.approx((6.0, 0.3, 0.075))


def test_the_noise_probe_pairs_the_same_requests():
    calls = []

    def send(requests, epoch):
        calls.append(requests)
        scale = 1.0 if len(calls) == 1 else 1.1
        return pd.DataFrame({"ttft_ms": 5.0, "e2e_ms": 50.0 * scale * np.ones(len(requests)),
                             "error": [""] * len(requests)})

    logs = noise_probe(send, 10.0, 5.0, MIX, seed=0)
    assert calls[0].equals(calls[1]) and len(logs) == len(calls[0])
    assert np.allclose(logs, np.log(1.1))


def test_a_probe_at_a_low_rate_runs_long_enough_to_hold_its_requests():
    """A 2 s probe at 4 requests/s used to hold about 8 requests: a p95 (and a noise spread) from a handful."""
    sent: list[pd.DataFrame] = []

    def send(requests, epoch):
        sent.append(requests)
        return pd.DataFrame({"ttft_ms": 5.0, "e2e_ms": 50.0, "error": [""] * len(requests)})

    logs = noise_probe(send, 4.0, 2.0, MIX, seed=0)
    expected = MIN_PROBE_REQUESTS  # 7.5 s at 4 requests/s
    assert all(abs(len(r) - expected) < 4 * expected ** 0.5 for r in sent) and len(logs) == len(sent[0])
    assert sent[0]["arrival_s"].max() > 2.0
    _, _, probes = search_capacity(send, MIX, first_guess_rps=10.0, probe_s=2.0, ttft_factor=3.0)
    assert probes[0].rate_rps == pytest.approx(1.0)  # the light probe: 30 s instead of 2 s
    assert all(p.n_requests == len(r) for p, r in zip(probes, sent[2:]))
    fast = noise_probe(send, 100.0, 2.0, MIX, seed=0)  # a high rate keeps probe_s
    assert abs(len(fast) - 200) < 4 * 200 ** 0.5
