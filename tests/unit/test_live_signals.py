"""Live signals: vLLM /metrics text -> FleetSignals, and the safe action when the server stops answering.

The fixtures are /metrics texts recorded from the real vLLM 0.32 CPU server
(`tests/fixtures/vllm_metrics_{busy,idle}.txt`): during a 40-request burst,
then after it.
"""

from __future__ import annotations

import threading

import pytest
from exposition_server import FIXTURES, ExpositionServer

from syncsafe import timebase
from syncsafe.config import HarnessConfig
from syncsafe.control.clock import WallClock
from syncsafe.control.controller import ControlPlan, run_controller
from syncsafe.control.fallback import SafeFallback
from syncsafe.control.harness import ProgressModelLearners
from syncsafe.control.live_signals import (
    METRICS,
    LiveSignals,
    MetricsFormatError,
    Reading,
    SignalSettings,
    fleet_signals,
    http_fetch,
    parse_metrics,
    sum_samples,
)
from syncsafe.control.policies import PressureGate
from syncsafe.control.types import ClockState
from syncsafe.realarm.engine_profile import HISTOGRAMS

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


@pytest.fixture
def exposition():
    with ExpositionServer(BUSY) as server:
        yield server


def _line_by_line(text: str, names) -> dict[str, float]:
    """A plain reading of every line, the reference `sum_samples` must agree with."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if line and not line.startswith("#") and name in names:
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


@pytest.mark.parametrize("fixture", ["vllm_metrics_busy.txt", "vllm_metrics_idle.txt", "vllm_metrics_profile.txt"])
def test_sum_samples_reads_the_named_lines_as_a_line_by_line_reading_does(fixture):
    text = (FIXTURES / fixture).read_text()
    names = [*METRICS, *(f"{h}_{part}" for h in HISTOGRAMS for part in ("sum", "count")), "vllm:absent_total"]
    names += ["vllm:request_success"]  # a prefix of other names: no sample of its own
    assert sum_samples(text, names) == _line_by_line(text, set(names))
    assert "vllm:absent_total" not in sum_samples(text, names) and "vllm:request_success" not in sum_samples(text, names)
    assert sum_samples(text.lstrip("#"), ["vllm:num_requests_running"])  # also a first line without a newline before it


def test_scrapes_reuse_one_keep_alive_connection_and_reopen_after_a_failure(exposition):
    fetch = http_fetch(exposition.url, timeout_s=1.0)
    for _ in range(5):
        assert parse_metrics(fetch())["running"] == 3
    assert len(exposition.connections) == 1, "/health and /metrics of every scrape over one connection"
    fetch._conn.sock.close()  # the kept connection breaks: the next scrape opens another
    assert parse_metrics(fetch())["finished"] == 18
    assert len(exposition.connections) == 2
    exposition.stop_answering()
    with pytest.raises(OSError):
        fetch()
    fetch.close()


def test_a_server_that_stops_answering_makes_the_controller_defer_to_max_h_then_merge(exposition):
    """Signals say busy (the gate would defer), then the server goes away: the safe action takes over.

    The server stops after the controller's fifth healthy decision (an event in the controller's own thread,
    not a timer racing it), so a loaded machine changes when things happen, never which decisions are healthy."""
    exposition.text = BUSY.replace('vllm:num_requests_running{engine="0",model_name="syncsafe"} 3.0',
                                    'vllm:num_requests_running{engine="0",model_name="syncsafe"} 8.0')
    url = exposition.url
    start = timebase.now() + 0.3
    cfg = SignalSettings(time_scale=1.0)
    plan = ControlPlan(step_s=0.1, min_h=1, max_h=3, window_s=0.1, min_gap_s=0.0, duration_s=6.0)
    with LiveSignals(http_fetch(url, timeout_s=0.5), start, cfg, interval_s=0.05, stale_after_s=1.0) as signals:
        healthy_calls = []

        def problem() -> str | None:
            found = signals.problem()
            if found is None and len(healthy_calls) < HEALTHY_DECISIONS:
                healthy_calls.append(timebase.now())
                if len(healthy_calls) == HEALTHY_DECISIONS:
                    exposition.stop_answering()
            return found

        gate = SafeFallback(PressureGate(0.5), problem)
        result = run_controller(gate, ProgressModelLearners(HarnessConfig(), 0), signals, plan,
                                timebase=WallClock(start, 1.0))
    decisions = result.decisions
    degraded = [d for d in decisions if d.reason.startswith("degraded")]
    healthy = [d for d in decisions if not d.reason.startswith("degraded")]
    assert len(healthy_calls) == HEALTHY_DECISIONS, "the server answered long enough for five healthy decisions"
    # while the signals were good, a merge happened only when forced (the server was full)
    assert all(d.forced for d in healthy if d.merge)
    assert degraded and gate.degraded_cycles == len(degraded)
    assert max(d.t_s for d in healthy if d.steps_since_merge >= plan.min_h) < min(d.t_s for d in degraded)
    # the safe action: defer below max_h, merge exactly when max_h steps have passed
    fits = lambda d: d.t_s + plan.window_s <= plan.duration_s  # noqa: E731 - no merge past the end
    assert all(d.merge == (d.steps_since_merge >= plan.max_h and fits(d)) for d in degraded)
    assert any(d.merge and d.forced for d in degraded)
    assert not signals.frame()["ok"].all()


HEALTHY_DECISIONS = 5


def test_a_decision_reads_memory_while_a_scrape_hangs():
    """The scraper blocks inside a scrape; reading the signals and deciding still returns (from memory)."""
    release, scraping = threading.Event(), threading.Event()
    calls = []

    def fetch() -> str:
        calls.append(timebase.now())
        if len(calls) > 1:  # the first scrape answers, the next one hangs until released
            scraping.set()
            release.wait()
        return BUSY

    cfg = SignalSettings(time_scale=1.0)
    with LiveSignals(fetch, timebase.now(), cfg, interval_s=0.01, stale_after_s=60.0) as signals:
        assert scraping.wait(10), "the second scrape started"
        answered = []
        reader = threading.Thread(target=lambda: answered.append(
            (signals.problem(), signals.at(1e9), signals.between(-1.0, 1e9),
             PressureGate(0.5).decide([], signals.at(1e9), ClockState(t_s=1.0, step=4, steps_since_merge=4, min_h=1,
                                                                      max_h=8, cycle=0)))))
        reader.start()
        reader.join(10)
        hung = reader.is_alive()
        release.set()
    assert not hung, "reading the signals waited for the hanging scrape"
    problem, newest, since, decision = answered[0]
    assert problem is None and newest.inference_pressure == pytest.approx(3 / 8) and len(since) == 1
    assert decision.merge  # pressure 3 / 8 below the gate, decided on the sample in memory
