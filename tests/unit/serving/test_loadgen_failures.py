"""Every failure counts: the load generator against a small OpenAI-style HTTP server on loopback.

The server (aiohttp, in a thread) answers `/v1/completions` by `max_tokens`:
an in-stream error object, a short output, a good stream, an HTTP 500, a stream
cut before `[DONE]`, a stream without a usage chunk. Each is judged as the
vLLM replay judges it; latencies run from the scheduled arrival.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import pytest
from aiohttp import web

from syncsafe import timebase
from syncsafe.serving.loadgen import replay_requests
from syncsafe.serving.metrics import replay_validity
from syncsafe.serving.replay import request_results

GOOD, IN_STREAM_ERROR, SHORT, HTTP_500, CUT, NO_USAGE = 3, 4, 5, 6, 7, 8
DELAY_S = 0.3
DELAY = web.AppKey("delay_s", float)


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    asked = int(body["max_tokens"])
    if asked == HTTP_500:
        return web.Response(status=500, text="boom")
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(obj) -> None:
        await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

    await asyncio.sleep(request.app[DELAY])
    await send({"choices": [{"text": "x", "index": 0}]})
    if asked == IN_STREAM_ERROR:
        await send({"error": {"message": "engine dead", "code": 500}})
    elif asked != CUT:
        if asked != NO_USAGE:
            produced = asked - 2 if asked == SHORT else asked
            await send({"choices": [], "usage": {"completion_tokens": produced, "prompt_tokens": 4}})
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
def server() -> Iterator[Callable[[float], str]]:
    """Start the fake server on a free loopback port; yields a function returning its base URL for a delay."""
    loop = asyncio.new_event_loop()
    state: dict = {}

    async def start(delay_s: float) -> None:
        app = web.Application()
        app[DELAY] = delay_s
        app.router.add_post("/v1/completions", _completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"] = runner
        state["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def url(delay_s: float = 0.0) -> str:
        asyncio.run_coroutine_threadsafe(start(delay_s), loop).result(timeout=10)
        return state["url"]

    yield url
    if "runner" in state:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


def _requests(outputs: list[int], arrivals: list[float] | None = None) -> pd.DataFrame:
    arrivals = arrivals or [0.05 * i for i in range(len(outputs))]
    return pd.DataFrame({"arrival_s": arrivals, "prompt_tokens": 4, "output_tokens": outputs})


def test_each_failure_kind_is_a_failure_with_its_reason(server):
    url = server()
    kinds = [GOOD, IN_STREAM_ERROR, SHORT, HTTP_500, CUT, NO_USAGE]
    raw = replay_requests(url, "m", _requests(kinds), timebase.now() + 0.2, 1.0, vocab_size=50, seed=0)
    errors = dict(zip(kinds, raw["error"]))
    assert errors[GOOD] == ""
    assert errors[IN_STREAM_ERROR].startswith("error in stream") and "engine dead" in errors[IN_STREAM_ERROR]
    assert errors[SHORT] == f"short output: {SHORT - 2} of {SHORT} tokens"
    assert errors[HTTP_500].startswith("HTTP 500")
    assert errors[CUT] == "stream ended before [DONE]"
    assert errors[NO_USAGE] == "no usage chunk: output tokens unknown"
    good = raw.iloc[0]
    assert good["output_tokens_received"] == GOOD and 0 < good["ttft_ms"] <= good["e2e_ms"]


def test_latency_runs_from_the_scheduled_arrival(server):
    """Three requests due at once through an in-flight cap of 1: the queued ones carry their wait."""
    url = server(delay_s=DELAY_S)
    start = timebase.now() + 0.2
    raw = replay_requests(url, "m", _requests([GOOD] * 3, [0.0, 0.0, 0.0]), start, 1.0, vocab_size=50, seed=0,
                          max_in_flight=1)
    timeline = pd.DataFrame({"t_s": [0.0, 10.0], "inference_pressure": [0.1, 0.1]})
    results = request_results(raw, timeline, [], start, 1.0)
    assert (results["error"] == "").all()
    lag = results["send_lag_ms"].sort_values().to_numpy()
    e2e = results["e2e_ms"].sort_values().to_numpy()
    assert lag[0] < 100 and lag[2] >= 2 * DELAY_S * 1000 * 0.9  # the third waited for two others
    # the cap's wait is the queued requests' alone: exactly zero for the one that found the slot free
    wait = raw.sort_values("send_epoch")["cap_wait_ms"].to_numpy()
    assert wait[0] == 0.0 and wait[1] >= DELAY_S * 1000 * 0.9 and wait[2] >= 2 * DELAY_S * 1000 * 0.9
    # E2E includes the send lag: never less than the lag plus the server's own time
    assert (results["e2e_ms"] >= results["send_lag_ms"] + DELAY_S * 1000 * 0.9).all()
    assert e2e[2] >= 3 * DELAY_S * 1000 * 0.9
    validity = replay_validity(results, max_failure_rate=0.02, max_send_lag_p99_ms=200.0)
    assert validity["valid"] is False and "send lag p99" in validity["invalid_reason"]


def test_a_replay_whose_requests_all_fail_is_invalid(server):
    url = server()
    start = timebase.now() + 0.2
    raw = replay_requests(url, "m", _requests([IN_STREAM_ERROR] * 5), start, 1.0, vocab_size=50, seed=0)
    timeline = pd.DataFrame({"t_s": [0.0, 10.0], "inference_pressure": [0.1, 0.1]})
    results = request_results(raw, timeline, [], start, 1.0)
    validity = replay_validity(results, max_failure_rate=0.02, max_send_lag_p99_ms=1000.0)
    assert validity == {**validity, "valid": False, "failure_rate": 1.0}
    assert "failure rate 1.000 > max_failure_rate 0.02" in validity["invalid_reason"]
    ok = results.assign(error="")
    assert replay_validity(ok, 0.02, 1000.0)["valid"] is True
    one_bad = ok.copy()
    one_bad.loc[0, "error"] = "short output: 1 of 4 tokens"
    assert replay_validity(one_bad, 0.2, 1000.0)["valid"] is True  # 1 in 5 = 0.2 is within 0.2
    assert replay_validity(one_bad, 0.19, 1000.0)["valid"] is False
    assert np.isclose(replay_validity(one_bad, 0.2, 1000.0)["failure_rate"], 0.2)
