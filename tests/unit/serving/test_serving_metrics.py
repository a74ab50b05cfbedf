"""Replay summaries and SLO derivation on small hand-built per-request tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from syncsafe.serving.metrics import REQUEST_RESULT_COLUMNS, SloSpec, derive_slo, p95_of_resamples, summarize

NAN = float("nan")


def table() -> pd.DataFrame:
    """Six requests: two during merges, one failed (a timeout, no latency)."""
    return pd.DataFrame({
        "request_id": range(6),
        "arrival_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        "send_s": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        "prompt_tokens": [10] * 6,
        "output_tokens": [10] * 6,
        "ttft_ms": [100.0, 200.0, 300.0, 50.0, NAN, 400.0],
        "e2e_ms": [1000.0, 2000.0, 3000.0, 500.0, NAN, 1500.0],
        "output_tokens_received": [10, 10, 10, 10, 0, 10],
        "merge_active": [False, True, True, False, False, False],
        "inference_pressure": [0.2, 0.8, 0.9, 0.1, 0.5, 0.6],
        "error": ["", "", "", "", "timeout", ""],
    })


def test_summary_arithmetic():
    s = summarize(table(), SloSpec(e2e_ms=1800.0), high_pressure_threshold=0.5)
    assert (s.n_requests, s.n_failed, s.requests_during_merges) == (6, 1, 2)
    assert s.slo_violation_rate == pytest.approx(3 / 6)  # 2000 and 3000 ms, plus the failed request
    assert s.e2e_p50_ms == 1500.0 and s.ttft_p50_ms == 200.0  # of the five succeeded requests
    # merge-active p95 of [2000, 3000] over inactive p95 of [500, 1000, 1500] (linear interpolation)
    assert s.sync_ratio_unpaired == pytest.approx(2950.0 / 1450.0)
    # pressure >= 0.5: [1500, 2000, 3000] (the failed request at 0.5 has no latency); below: [500, 1000]
    assert s.pressure_ratio == pytest.approx(2900.0 / 975.0)
    assert s.span_s == pytest.approx(6.5)  # first send 0 s, last completion 5 s + 1.5 s
    assert s.tokens_per_s == pytest.approx(50 / 6.5)
    assert s.goodput_rps == pytest.approx(3 / 6.5)
    assert s.index_fields()["p95_ms"] == s.e2e_p95_ms and s.index_fields()["slo_violation_rate"] == 0.5


@pytest.mark.parametrize(
    ("slo", "rate"),
    [
        (SloSpec(ttft_ms=250.0), 3 / 6),  # 300 and 400 ms, plus the failed request
        (SloSpec(ttft_ms=250.0, e2e_ms=1800.0), 4 / 6),  # either bound broken
        (SloSpec(ttft_ms=1e9, e2e_ms=1e9), 1 / 6),  # the failed request still counts
        (SloSpec(e2e_ms=2000.0), 2 / 6),  # a latency equal to the bound meets it
    ],
)
def test_violation_rate_counts_every_set_bound_and_every_failure(slo, rate):
    assert summarize(table(), slo, 0.5).slo_violation_rate == pytest.approx(rate)


def test_empty_groups_give_no_ratio():
    no_sync = table().assign(merge_active=False)
    s = summarize(no_sync, SloSpec(e2e_ms=1800.0), high_pressure_threshold=2.0)
    assert s.sync_ratio_unpaired is None and s.pressure_ratio is None and s.requests_during_merges == 0


def test_all_failed_keeps_every_request_as_a_violation():
    failed = table().assign(error="connection refused", ttft_ms=NAN, e2e_ms=NAN, output_tokens_received=0)
    s = summarize(failed, SloSpec(e2e_ms=1800.0), 0.5)
    assert (s.n_requests, s.n_failed, s.slo_violation_rate) == (6, 6, 1.0)
    assert s.e2e_p95_ms is None and s.sync_ratio_unpaired is None and s.goodput_rps == 0.0


def test_summary_round_trips_as_json_without_nan():
    s = summarize(table().assign(merge_active=False), SloSpec(e2e_ms=1800.0), 0.5)
    assert "NaN" not in s.model_dump_json()


def test_derive_slo_is_the_no_sync_p95_times_the_multiplier():
    slo = derive_slo(table(), multiplier=1.5)
    succeeded_ttft, succeeded_e2e = [100.0, 200.0, 300.0, 50.0, 400.0], [1000.0, 2000.0, 3000.0, 500.0, 1500.0]
    assert slo.ttft_ms == pytest.approx(np.percentile(succeeded_ttft, 95) * 1.5)
    assert slo.e2e_ms == pytest.approx(np.percentile(succeeded_e2e, 95) * 1.5)
    assert slo.e2e_ms == pytest.approx(2800.0 * 1.5)  # 2000 + 0.8 * 1000
    with pytest.raises(ValueError, match="positive"):
        derive_slo(table(), multiplier=0.0)
    with pytest.raises(ValueError, match="no succeeded request"):
        derive_slo(table().assign(error="boom"), multiplier=1.5)


def test_slo_needs_a_bound():
    with pytest.raises(ValidationError, match="ttft_ms or e2e_ms"):
        SloSpec()
    with pytest.raises(ValidationError):
        SloSpec(e2e_ms=-1.0)


@pytest.mark.parametrize("column", ["merge_active", "error", "e2e_ms"])
def test_missing_result_column_is_named(column):
    with pytest.raises(ValueError, match=f"missing column.*'{column}'"):
        summarize(table().drop(columns=column), SloSpec(e2e_ms=1.0), 0.5)


def test_bad_summary_inputs_are_refused():
    with pytest.raises(ValueError, match="no rows"):
        summarize(table().iloc[:0], SloSpec(e2e_ms=1.0), 0.5)
    with pytest.raises(ValueError, match="finite"):
        summarize(table(), SloSpec(e2e_ms=1.0), math.inf)
    assert tuple(table().columns) == REQUEST_RESULT_COLUMNS


@pytest.mark.parametrize("n", [1, 2, 3, 11, 20, 21, 31, 101, 1000])  # 11, 31: the index falls on k + 0.5
def test_p95_of_resamples_is_numpys_percentile_exactly(n):
    rng = np.random.default_rng(n)
    values = rng.lognormal(size=n)
    taken = np.vstack([np.ones(n, dtype=np.int64), rng.integers(0, 4, (5, n)), np.zeros(n, dtype=np.int64)])
    taken[1, 0] = max(taken[1, 0], 1)  # a resample that holds something besides the all-ones one
    p95 = p95_of_resamples(values, taken)
    expected = [np.percentile(np.repeat(values, row), 95) if row.sum() else np.nan for row in taken]
    assert np.array_equal(p95, expected, equal_nan=True)
    assert np.isnan(p95[-1])  # a resample that holds nothing has no p95
    # one row of values per resample (the gate's replay-level shocks): each row its own percentile
    rows = values * rng.lognormal(size=(len(taken), 1))
    expected = [np.percentile(np.repeat(v, row), 95) if row.sum() else np.nan for v, row in zip(rows, taken)]
    assert np.array_equal(p95_of_resamples(rows, taken), expected, equal_nan=True)
