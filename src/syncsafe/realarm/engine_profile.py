"""Profile of the real server: iteration time by batch composition, with and without merge interference.

The vLLM replay stage runs controlled probe loads against the server before
the replays and reads the server's own Prometheus histograms around each
probe (names of the vLLM 0.32 V1 engine, summed over engines):

- `vllm:inter_token_latency_seconds` (sum, count): mean time between two
  tokens of a request = one engine iteration of the batch it decodes in;
- `vllm:iteration_tokens_total` (sum, count): tokens per iteration, i.e. the
  batch's size in tokens;
- `vllm:request_prefill_time_seconds` (sum, count): server-side prefill time;
- `vllm:time_to_first_token_seconds` (sum, count): TTFT as the server sees it.

Probes (closed loop, fixed prompts, `ignore_eos`): *decode* probes keep `n`
sequences of `decode_prompt` prompt / `decode_tokens` output tokens in flight
(n = 1, 2, 4, ... max_batch), once plainly and once with the merge workload
running throughout (`merge: true`); *prefill* probes send one request at a
time with a prompt of P tokens and a single output token. The profile
(`profile.json`) holds one row per probe with the deltas' means; the
calibrate-fit stage reads the iteration-cost model and the merge's compute
share from it (`syncsafe.analysis.calibration.fit`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from syncsafe import localhttp, timebase
from syncsafe.control.live_signals import sum_samples
from syncsafe.control.serving_model import MAX_MERGE_SHARE, Calibration

HISTOGRAMS = (
    "vllm:inter_token_latency_seconds",
    "vllm:iteration_tokens_total",
    "vllm:request_prefill_time_seconds",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
)
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def parse_metrics(text: str) -> dict[str, float]:
    """`<histogram>_sum`, `<histogram>_count` and counter values of a Prometheus text exposition.

    Summed over label sets (engines, model names); bucket lines are skipped.
    A name the server does not expose is absent.
    """
    return sum_samples(text, [f"{h}_{part}" for h in HISTOGRAMS for part in ("sum", "count")] + list(COUNTERS))


def histogram_mean(before: dict[str, float], after: dict[str, float], histogram: str) -> tuple[float | None, int]:
    """Mean of the observations a histogram gained between two scrapes, and their count."""
    count = after.get(f"{histogram}_count", 0.0) - before.get(f"{histogram}_count", 0.0)
    if count <= 0:
        return None, 0
    return (after.get(f"{histogram}_sum", 0.0) - before.get(f"{histogram}_sum", 0.0)) / count, int(count)


class ProbeRow(BaseModel):
    """One probe's load and what the server's histograms gained during it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # "decode" or "prefill"
    concurrency: int = Field(ge=1)
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)
    merge: bool = False
    duration_s: float = Field(gt=0)
    n_requests: int = Field(ge=0)
    itl_ms: float | None = None
    n_itl: int = 0
    iteration_tokens: float | None = None
    prefill_ms: float | None = None
    ttft_ms: float | None = None


class ServerProfile(BaseModel):
    """The probes of one server run (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch: int = Field(ge=1)
    interference: str
    rows: list[ProbeRow]
    #: Metric names the server exposed (those this module reads).
    metrics_seen: list[str] = Field(default_factory=list)

    @classmethod
    def read(cls, path: str | Path) -> ServerProfile:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))

    def decode(self, merge: bool) -> list[ProbeRow]:
        return [r for r in self.rows if r.kind == "decode" and r.merge == merge and r.itl_ms is not None]

    def prefill(self) -> list[ProbeRow]:
        return [r for r in self.rows if r.kind == "prefill" and r.prefill_ms is not None]


def scrape(base_url: str, timeout_s: float = 5.0) -> str:
    with localhttp.urlopen(f"{base_url}/metrics", timeout=timeout_s) as resp:
        return resp.read().decode()


async def _closed_loop(url: str, model: str, concurrency: int, prompt: list[int], max_tokens: int,
                       duration_s: float, timeout_s: float) -> int:
    """`concurrency` clients each sending one request after another until `duration_s` passed; requests done."""
    deadline = timebase.now() + duration_s
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0}

    async def client(session: aiohttp.ClientSession) -> int:
        done = 0
        while timebase.now() < deadline:
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                done += resp.status == 200
        return done

    async with aiohttp.ClientSession() as session:
        return sum(await asyncio.gather(*(client(session) for _ in range(concurrency))))


def run_probe(base_url: str, model: str, kind: str, concurrency: int, prompt: list[int], max_tokens: int,
              duration_s: float, merge: bool = False, timeout_s: float = 60.0) -> tuple[ProbeRow, str]:
    """One probe: the histograms' deltas around a closed-loop load; also the last /metrics text."""
    before = parse_metrics(scrape(base_url))
    n = asyncio.run(_closed_loop(f"{base_url}/v1/completions", model, concurrency, prompt, max_tokens, duration_s,
                                 timeout_s))
    text = scrape(base_url)
    after = parse_metrics(text)
    itl, n_itl = histogram_mean(before, after, "vllm:inter_token_latency_seconds")
    tokens, _ = histogram_mean(before, after, "vllm:iteration_tokens_total")
    prefill, _ = histogram_mean(before, after, "vllm:request_prefill_time_seconds")
    ttft, _ = histogram_mean(before, after, "vllm:time_to_first_token_seconds")
    ms = lambda v: None if v is None else v * 1000.0  # noqa: E731
    row = ProbeRow(kind=kind, concurrency=concurrency, prompt_tokens=len(prompt), output_tokens=max_tokens,
                   merge=merge, duration_s=duration_s, n_requests=n, itl_ms=ms(itl), n_itl=n_itl,
                   iteration_tokens=tokens, prefill_ms=ms(prefill), ttft_ms=ms(ttft))
    return row, text


def profile_server(
    base_url: str, model: str, vocab_size: int, max_batch: int, interference: str,
    merge_window: Callable[[float, float], Callable[[], None]], *,
    probe_s: float = 2.5, decode_prompt: int = 32, decode_tokens: int = 48,
    prefill_prompts: Sequence[int] = (16, 128, 384), seed: int = 0,
) -> tuple[ServerProfile, str]:
    """Run the probes; `merge_window(start, end)` starts the merge workload over a wall interval and
    returns a function that waits for it. Returns the profile and the last /metrics text."""
    rng = np.random.default_rng([seed, 0x9F0F])
    prompt = lambda n: rng.integers(3, vocab_size, n).tolist()  # noqa: E731
    levels = sorted({1, 2, max(1, max_batch // 2), max_batch})
    rows: list[ProbeRow] = []
    text = ""
    for merge in (False, True):
        for n in levels:
            wait = merge_window(timebase.now(), timebase.now() + probe_s + 0.5) if merge else None
            row, text = run_probe(base_url, model, "decode", n, prompt(decode_prompt), decode_tokens, probe_s, merge)
            rows.append(row)
            if wait is not None:
                wait()
    for p in prefill_prompts:
        row, text = run_probe(base_url, model, "prefill", 1, prompt(p), 1, probe_s / 2)
        rows.append(row)
    seen = sorted({name.rsplit("_", 1)[0] if name.endswith(("_sum", "_count")) else name for name in parse_metrics(text)})
    return ServerProfile(max_batch=max_batch, interference=interference, rows=rows, metrics_seen=seen), text


def profile_prior(profile: ServerProfile, base: Calibration) -> tuple[Calibration, dict[str, float | None]]:
    """Iteration costs and merge share read off the probes (see the module docstring); `base` for the rest."""
    update: dict[str, float] = {"max_batch": profile.max_batch}
    diag: dict[str, float | None] = {}
    plain = profile.decode(merge=False)
    if len(plain) >= 2:
        n = np.array([r.concurrency for r in plain], dtype=float)
        itl = np.array([r.itl_ms for r in plain], dtype=float)
        slope, intercept = np.polyfit(n, itl, 1)
        update["decode_ms_per_seq"] = max(float(slope), 0.0)
        update["iter_base_ms"] = max(float(intercept), 0.0)
        diag["profile_itl_ms_at_1"] = float(itl[np.argmin(n)])
    prefill = profile.prefill()
    if len(prefill) >= 2:
        p = np.array([r.prompt_tokens for r in prefill], dtype=float)
        ms = np.array([r.prefill_ms for r in prefill], dtype=float)
        update["prefill_ms_per_token"] = max(float(np.polyfit(p, ms, 1)[0]), 0.0)
    merged = {r.concurrency: r.itl_ms for r in profile.decode(merge=True)}
    shares = [1.0 - r.itl_ms / merged[r.concurrency] for r in plain if merged.get(r.concurrency)]
    if shares:
        update["merge_compute_share"] = float(np.clip(np.mean(shares), 0.0, MAX_MERGE_SHARE))
        diag["profile_merge_share"] = float(np.mean(shares))
    return base.model_copy(update=update), diag
