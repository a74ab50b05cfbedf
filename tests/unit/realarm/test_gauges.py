"""The replay's /metrics gauge parser on expositions recorded from the vLLM 0.32 CPU server."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncsafe.realarm.arm import GAUGES, parse_gauges

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize(("name", "running", "kv_cache"), [
    ("vllm_metrics_busy.txt", 3.0, 0.0117647058823529),
    ("vllm_metrics_idle.txt", 0.0, 0.0),
])
def test_gauges_from_a_recorded_exposition(name, running, kv_cache):
    gauges = parse_gauges((FIXTURES / name).read_text())
    assert set(gauges) == set(GAUGES.values())  # every gauge found, none missing
    assert gauges["running"] == running and gauges["waiting"] == 0.0
    assert gauges["kv_cache_usage"] == pytest.approx(kv_cache, rel=1e-12)


def test_gauges_sum_over_label_sets_and_ignore_look_alikes():
    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 7.0',  # not num_requests_waiting
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0',
        "vllm:kv_cache_usage_perc 0.25",
        "",
    ])
    assert parse_gauges(text) == {"running": 3.0, "waiting": 4.0, "kv_cache_usage": 0.25}
    assert parse_gauges("# nothing here\n") == {}
