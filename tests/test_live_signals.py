"""Live signals: vLLM /metrics text -> FleetSignals, and the safe action when the server stops answering.

The fixtures are /metrics texts recorded from the real vLLM 0.32 CPU server
(`tests/fixtures/vllm_metrics_{busy,idle}.txt`): during a 40-request burst,
then after it.
"""

from __future__ import annotations

import http.server
import threading
import time
from pathlib import Path

import pytest

from syncsafe.config import HarnessConfig
from syncsafe.control.clock import WallClock
from syncsafe.control.controller import ControlPlan, run_controller
from syncsafe.control.fallback import SafeFallback
from syncsafe.control.harness import ProgressModelLearners
from syncsafe.control.live_signals import (
    LiveSignals,
    MetricsFormatError,
    Reading,
    SignalSettings,
    fleet_signals,
    http_fetch,
    parse_metrics,
)
from syncsafe.control.policies import PressureGate

FIXTURES = Path(__file__).parent / "fixtures"
BUSY = (FIXTURES / "vllm_metrics_busy.txt").read_text()
IDLE = (FIXTURES / "vllm_metrics_idle.txt").read_text()


def test_recorded_exposition_parses_to_the_gauges_and_counters_summed_over_labels():
    busy = parse_metrics(BUSY)
    assert busy["running"] == 3 and busy["waiting"] == 0
    assert busy["kv_cache_usage"] == pytest.approx(0.0117647058823529)
    # request_success_total has one series per finish reason (stop, length, abort, ...); _created lines are not counted
    assert busy["finished"] == 18
    assert busy["prompt_tokens"] == 1008 and busy["generation_tokens"] == 1251
    idle = parse_metrics(IDLE)
    assert (idle["running"], idle["waiting"], idle["finished"]) == (0, 0, 40)


def test_a_text_without_the_metrics_is_refused_not_read_as_idle():
    with pytest.raises(MetricsFormatError, match="vllm:num_requests_running"):
        parse_metrics("\n".join(line for line in BUSY.splitlines() if "num_requests_running" not in line))
    with pytest.raises(MetricsFormatError, match="unreadable"):
        parse_metrics(BUSY.replace("vllm:num_requests_waiting{engine=\"0\",model_name=\"syncsafe\"} 0.0",
                                   "vllm:num_requests_waiting{engine=\"0\",model_name=\"syncsafe\"} zero"))


def test_rates_come_from_counters_and_pressure_from_occupancy_and_arrivals():
    cfg = SignalSettings(time_scale=4.0, capacity_seqs=8, reference_rps=6.0, busy_pressure=0.5)
    busy, idle = Reading(100.0, parse_metrics(BUSY)), Reading(102.0, parse_metrics(IDLE))
    signals, rates = fleet_signals([busy, idle], t_s=8.0, cfg=cfg)
    # arrivals = finished (40 - 18) + in system (0 - 3) = 19 over 2 wall s = 8 trace s
    assert signals.arrival_rate == pytest.approx(19 / 8)
    assert rates["generation_rate"] == pytest.approx((2560 - 1251) / 8)
    # occupancy (3 + 0) / 2 readings / 8 seqs = 0.1875 < arrivals 2.375 / 6
    assert signals.inference_pressure == pytest.approx(19 / 8 / 6)
    assert not signals.busy and signals.t_s == 8.0
    assert signals.network_pressure == 0 and signals.checkpoint_pressure == 0
    alone, _ = fleet_signals([busy], t_s=0.0, cfg=cfg)
    assert alone.arrival_rate == 0 and alone.inference_pressure == pytest.approx(3 / 8)


class _Exposition(http.server.BaseHTTPRequestHandler):
    text = BUSY

    def do_GET(self):  # noqa: N802 - http.server's name
        body = (self.text if self.path == "/metrics" else "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exposition():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Exposition)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_server_that_stops_answering_makes_the_controller_defer_to_max_h_then_merge(exposition):
    """Signals say busy (the gate would defer), then the server goes away: the safe action takes over."""
    _Exposition.text = BUSY.replace('vllm:num_requests_running{engine="0",model_name="syncsafe"} 3.0',
                                    'vllm:num_requests_running{engine="0",model_name="syncsafe"} 8.0')
    url = f"http://127.0.0.1:{exposition.server_address[1]}"
    start = time.time() + 0.3
    cfg = SignalSettings(time_scale=1.0)
    plan = ControlPlan(step_s=0.1, min_h=1, max_h=3, window_s=0.1, min_gap_s=0.0, duration_s=3.0)
    with LiveSignals(http_fetch(url, timeout_s=0.5), start, cfg, interval_s=0.05, stale_after_s=0.3) as signals:
        gate = SafeFallback(PressureGate(0.5), signals.problem)
        stopper = threading.Timer(1.3, exposition.shutdown)
        stopper.start()
        result = run_controller(gate, ProgressModelLearners(HarnessConfig(), 0), signals, plan,
                                timebase=WallClock(start, 1.0))
        stopper.join()
    decisions = result.decisions
    healthy = [d for d in decisions if d.t_s < 1.0]
    degraded = [d for d in decisions if d.reason.startswith("degraded")]
    assert healthy and all(not d.reason.startswith("degraded") for d in healthy)
    # while the signals were good, a merge happened only when forced (the server was full)
    assert all(d.forced for d in healthy if d.merge)
    assert degraded and gate.degraded_cycles == len(degraded)
    # the safe action: defer below max_h, merge exactly when max_h steps have passed
    fits = lambda d: d.t_s + plan.window_s <= plan.duration_s  # noqa: E731 - no merge past the end
    assert all(d.merge == (d.steps_since_merge >= plan.max_h and fits(d)) for d in degraded)
    assert any(d.merge and d.forced for d in degraded)
    assert not signals.frame()["ok"].all()
