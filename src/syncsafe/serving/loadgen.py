"""Open-loop load generator against an OpenAI-compatible completions endpoint.

Every request of a seed's request table is sent at its arrival time (trace
seconds divided by `time_scale`, from a common start), whatever the server is
doing: arrivals never wait for completions. An optional in-flight cap holds a
request back only when that many are already open; the wait is recorded per
request (`cap_wait_ms`, exactly 0 for a request that found a slot free), so a
binding cap is visible, never silent.

Prompts are token-id lists of exactly `prompt_tokens` ids (seeded), and
`max_tokens = output_tokens` with `ignore_eos`, so the server does the work
the trace asks for. Each request streams; TTFT is the first content chunk,
E2E the `[DONE]` marker, both measured from the request's *scheduled* arrival
(a late send is charged to the request; `send_epoch - scheduled_epoch` is its
send lag), output tokens come from the final `usage` chunk. Every instant is on
`syncsafe.timebase` (the monotonic clock asyncio sleeps on), never the wall clock.
A request that fails is kept with its error text: failures are counted, never
dropped. Failed: an HTTP error, a broken stream or timeout, an error object
inside an HTTP 200 stream (`data: {"error": ...}`), no `usage` chunk, or fewer
output tokens than asked (with `ignore_eos` the server must produce them all).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

import aiohttp
import numpy as np
import pandas as pd

from syncsafe import timebase


@dataclass
class RequestResult:
    request_id: int
    arrival_s: float
    scheduled_epoch: float
    send_epoch: float
    cap_wait_ms: float
    prompt_tokens: int
    output_tokens: int
    ttft_ms: float
    e2e_ms: float
    output_tokens_received: int
    error: str


def prompt_ids(rng: np.random.Generator, n: int, vocab_size: int, first_id: int = 3) -> list[int]:
    """n token ids drawn from the ordinary vocabulary (ids below `first_id` are special tokens)."""
    return rng.integers(first_id, vocab_size, n).tolist()


def _incomplete(e2e_ms: float, usage_seen: bool, received: int, asked: int) -> str:
    """Why a stream that carried no error object still failed; empty when it did not."""
    if e2e_ms != e2e_ms:
        return "stream ended before [DONE]"
    if not usage_seen:
        return "no usage chunk: output tokens unknown"
    if received < asked:
        return f"short output: {received} of {asked} tokens"
    return ""


async def _one(session: aiohttp.ClientSession, url: str, model: str, rid: int, row, start_epoch: float,
               time_scale: float, prompt: list[int], cap: asyncio.Semaphore, timeout_s: float) -> RequestResult:
    scheduled = start_epoch + row.arrival_s / time_scale
    await asyncio.sleep(max(0.0, scheduled - timebase.now()))
    # only a request that finds every slot taken waits for the cap; timing one that found a slot free would
    # count the event loop's own scheduling (another thread holding the GIL) as a cap that bound
    full = cap.locked()
    waited = timebase.now()
    async with cap:
        send = timebase.now()
        cap_wait_ms = (send - waited) * 1000.0 if full else 0.0
        ttft = e2e = float("nan")
        received, error, usage_seen = 0, "", False
        body = {"model": model, "prompt": prompt, "max_tokens": int(row.output_tokens), "stream": True,
                "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
        try:
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                else:
                    async for raw in resp.content:
                        line = raw.decode("utf-8", "replace").strip()
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            e2e = (timebase.now() - scheduled) * 1000.0
                            break
                        chunk = json.loads(data)
                        if not isinstance(chunk, dict):
                            error = f"stream chunk is not an object: {data[:100]}"
                            break
                        if "error" in chunk or chunk.get("object") == "error":
                            error = f"error in stream: {json.dumps(chunk.get('error', chunk))[:180]}"
                            break
                        if chunk.get("choices") and ttft != ttft:  # first content chunk (nan != nan)
                            ttft = (timebase.now() - scheduled) * 1000.0
                        if chunk.get("usage"):
                            usage_seen = True
                            received = int(chunk["usage"].get("completion_tokens", 0))
                    error = error or _incomplete(e2e, usage_seen, received, int(row.output_tokens))
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as err:
            error = f"{type(err).__name__}: {err}"[:200] or type(err).__name__
    return RequestResult(rid, float(row.arrival_s), scheduled, send, cap_wait_ms, int(row.prompt_tokens),
                         int(row.output_tokens), ttft, e2e, received, error)


#: Seconds the client keeps an idle connection for reuse: below the server's own keep-alive (vLLM's uvicorn closes a
#: connection idle for `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s). With aiohttp's default of 15 s a request could be sent on
#: a connection the server was closing and fail with `ServerDisconnectedError` (seen once in 266 requests of a CI
#: replay, after the idle gap of a burst): a failure of the client's pool, never of the server under test.
KEEPALIVE_S = 2.0


async def _replay(base_url: str, model: str, requests: pd.DataFrame, start_epoch: float, time_scale: float,
                  prompts: list[list[int]], max_in_flight: int, timeout_s: float) -> list[RequestResult]:
    cap = asyncio.Semaphore(max_in_flight)
    connector = aiohttp.TCPConnector(limit=max_in_flight, force_close=False, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector) as session:
        url = f"{base_url}/v1/completions"
        tasks = [
            _one(session, url, model, i, row, start_epoch, time_scale, prompts[i], cap, timeout_s)
            for i, row in enumerate(requests.itertuples(index=False))
        ]
        return list(await asyncio.gather(*tasks))


def replay_requests(base_url: str, model: str, requests: pd.DataFrame, start_epoch: float, time_scale: float,
                    vocab_size: int, seed: int, max_in_flight: int = 256, timeout_s: float = 120.0) -> pd.DataFrame:
    """Send every request open loop; one row per request (`RequestResult` fields)."""
    rng = np.random.default_rng([seed, 7919])
    prompts = [prompt_ids(rng, int(n), vocab_size) for n in requests["prompt_tokens"]]
    results = asyncio.run(_replay(base_url, model, requests, start_epoch, time_scale, prompts, max_in_flight, timeout_s))
    return pd.DataFrame([asdict(r) for r in results], columns=list(RequestResult.__dataclass_fields__))
