"""Server profile: parsing the vLLM server's own /metrics (recorded from the real server) and probe deltas."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncsafe.realarm.engine_profile import HISTOGRAMS, histogram_mean, parse_metrics

#: /metrics of the vLLM 0.32 CPU server right after the profile's last probe (recorded by the replay-vllm stage).
RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics_profile.txt"


def test_recorded_exposition_yields_every_histogram_the_profile_reads():
    text = RECORDED.read_text()
    values = parse_metrics(text)
    for histogram in HISTOGRAMS:
        assert values[f"{histogram}_count"] > 0, histogram
        assert values[f"{histogram}_sum"] > 0, histogram
    assert values["vllm:generation_tokens_total"] >= values["vllm:inter_token_latency_seconds_count"]
    # bucket lines are not read as sums or counts
    count_lines = [ln for ln in text.splitlines() if ln.startswith("vllm:iteration_tokens_total_count")]
    assert values["vllm:iteration_tokens_total_count"] == pytest.approx(
        sum(float(ln.rsplit(" ", 1)[1]) for ln in count_lines))


def test_histogram_means_are_taken_over_the_probe_only():
    before = {"vllm:inter_token_latency_seconds_sum": 1.0, "vllm:inter_token_latency_seconds_count": 100.0}
    after = {"vllm:inter_token_latency_seconds_sum": 1.5, "vllm:inter_token_latency_seconds_count": 150.0}
    mean, n = histogram_mean(before, after, "vllm:inter_token_latency_seconds")
    assert mean == pytest.approx(0.01) and n == 50
    assert histogram_mean(after, after, "vllm:inter_token_latency_seconds") == (None, 0)


def test_label_sets_are_summed_and_comments_skipped():
    text = "\n".join([
        "# HELP vllm:time_to_first_token_seconds x",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 3.0',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="a"} 0.25',
        'vllm:time_to_first_token_seconds_sum{engine="1",model_name="a"} 0.5',
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="a"} 2.0',
        'vllm:time_to_first_token_seconds_count{engine="1",model_name="a"} 4.0',
        'vllm:num_requests_running{engine="0"} 3.0',
    ])
    values = parse_metrics(text)
    assert values == {"vllm:time_to_first_token_seconds_sum": 0.75, "vllm:time_to_first_token_seconds_count": 6.0}
