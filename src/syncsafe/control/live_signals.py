"""Fleet signals on the wall clock: a live server's Prometheus `/metrics` as `FleetSignals`.

The only piece between the policies and a real serving node. A background
thread scrapes `GET /health` and `GET /metrics` every `interval_s` wall
seconds over one keep-alive connection (`HttpScraper`), reading only the
sample lines it needs (`sum_samples`); a decision never waits for a scrape,
it reads the newest sample from memory. Each good scrape becomes one `FleetSignals` sample stamped in trace
seconds since the run's start (`(epoch - start_epoch) * time_scale`), so
every policy, forecasters included, sees the same kind of samples it sees on
the trace clock, never the trace's own columns.

From the vLLM 0.32 exposition (summed over label sets):

- gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`;
- counters `vllm:request_success_total` (every finished request, all
  finish reasons), `vllm:prompt_tokens_total`,
  `vllm:generation_tokens_total`.

Rates come from counters over the last `window_s` wall seconds:
arrivals = finished + change in (running + waiting) (flow conservation), in
requests per trace second. The signals a policy sees:

- `arrival_rate`: that rate;
- `inference_pressure` in 0..1: the largest of the server's occupancy
  ((running + waiting) / `capacity_seqs`, averaged over the window), its KV
  cache usage, and `arrival_rate / reference_rps` (the arrival rate at which
  the node counts as fully loaded);
- `busy`: `inference_pressure >= busy_pressure`;
- `network_pressure`, `checkpoint_pressure`: 0; a serving node's `/metrics`
  has no reading of other jobs' network or storage traffic.

A scrape that fails (server unhealthy, `/metrics` unreachable, a timeout)
is recorded as a failed row; `problem()` names what is wrong when the last
scrape failed or the newest good sample is older than `stale_after_s`, and
the controller then takes the safe action (`syncsafe.control.fallback`).
"""

from __future__ import annotations

import bisect
import http.client
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd

from syncsafe import timebase
from syncsafe.control.types import FleetSignals

GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}
COUNTERS = {
    "vllm:request_success_total": "finished",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
METRICS = {**GAUGES, **COUNTERS}
TIMELINE_COLUMNS = ("t_s", "epoch", "ok", *METRICS.values(), "arrival_rate", "generation_rate", "inference_pressure",
                    "busy", "error")


class MetricsFormatError(ValueError):
    """A /metrics text that is not the Prometheus exposition vLLM writes."""


def sum_samples(text: str, names: Iterable[str]) -> dict[str, float]:
    """The samples named `names` in a Prometheus text exposition, each summed over its label sets.

    The one exposition reader of the package (the live signals here, the
    engine profile's histograms in `syncsafe.realarm.engine_profile`, the
    vLLM replay's gauges in `syncsafe.realarm.replays`). It looks up
    only the named sample lines (`name value` or `name{labels} value`), so the
    cost grows with the lines it reads, not with the whole exposition; a name
    the text does not hold is absent from the result. Raises
    MetricsFormatError on a named line whose value is unreadable.
    """
    text = text if text.startswith("\n") else "\n" + text
    values: dict[str, float] = {}
    for name in names:
        needle = "\n" + name
        at = text.find(needle)
        while at >= 0:
            begin = at + 1
            end = text.find("\n", begin)
            end = len(text) if end < 0 else end
            follow = text[at + len(needle): at + len(needle) + 1]
            if follow in ("{", " "):  # not a longer name sharing the prefix
                line = text[begin:end]
                try:
                    value = float(line.rsplit(" ", 1)[1])
                except (IndexError, ValueError):
                    raise MetricsFormatError(f"/metrics: unreadable sample line {line[:120]!r}") from None
                values[name] = values.get(name, 0.0) + value
            at = text.find(needle, end)
    return values


def parse_metrics(text: str) -> dict[str, float]:
    """The METRICS of a Prometheus text exposition, summed over label sets (keys: METRICS values).

    Raises MetricsFormatError when one of them is absent: a server that does
    not expose what the controller reads must not pass for an idle one.
    """
    found = sum_samples(text, METRICS)
    missing = [name for name in METRICS if name not in found]
    if missing:
        raise MetricsFormatError(f"/metrics: no {', '.join(missing)} (not a vLLM server's exposition?)")
    return {METRICS[name]: value for name, value in found.items()}


@dataclass(frozen=True)
class SignalSettings:
    """How raw readings become `FleetSignals` (see the module docstring)."""

    time_scale: float = 1.0
    window_s: float = 2.0
    capacity_seqs: int = 8
    reference_rps: float = 6.0
    busy_pressure: float = 0.5


@dataclass(frozen=True)
class Reading:
    """One good scrape: its epoch (`syncsafe.timebase`) and the METRICS values."""

    epoch: float
    values: dict[str, float]


def fleet_signals(window: list[Reading], t_s: float, cfg: SignalSettings) -> tuple[FleetSignals, dict[str, float]]:
    """FleetSignals at the newest reading of `window` (oldest first), and the derived rates."""
    first, last = window[0], window[-1]
    wall = last.epoch - first.epoch
    in_system = lambda r: r.values["running"] + r.values["waiting"]  # noqa: E731
    if wall > 0:
        arrivals = (last.values["finished"] - first.values["finished"]) + (in_system(last) - in_system(first))
        arrival_rate = max(arrivals, 0.0) / (wall * cfg.time_scale)
        generation_rate = max(last.values["generation_tokens"] - first.values["generation_tokens"], 0.0) / (
            wall * cfg.time_scale)
    else:
        arrival_rate = generation_rate = 0.0
    occupancy = sum(in_system(r) for r in window) / len(window) / cfg.capacity_seqs
    pressure = min(max(occupancy, last.values["kv_cache_usage"], arrival_rate / cfg.reference_rps), 1.0)
    signals = FleetSignals(t_s=t_s, busy=pressure >= cfg.busy_pressure, arrival_rate=arrival_rate,
                           inference_pressure=pressure, network_pressure=0.0, checkpoint_pressure=0.0)
    return signals, {"arrival_rate": arrival_rate, "generation_rate": generation_rate}


class HttpScraper:
    """`GET /health` (must answer 200), then the `/metrics` text, over one persistent keep-alive connection.

    The connection is opened on first use and kept between scrapes (no TCP
    handshake per scrape); any failure closes it and raises OSError, and the
    next scrape opens a new one. A kept connection the server closed while
    idle is reopened once, transparently.
    """

    def __init__(self, base_url: str, timeout_s: float) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"scrape url {base_url!r}: expected http://host:port")
        self.host, self.port, self.timeout_s = parts.hostname, parts.port or 80, timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def _get(self, path: str) -> bytes:
        for attempt in (0, 1):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            try:
                self._conn.request("GET", path)
                resp = self._conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as err:
                self.close()
                if reused and attempt == 0 and not isinstance(err, TimeoutError):
                    continue  # the kept connection went stale (e.g. the server closed it while idle): reopen once
                raise OSError(f"GET {path}: {type(err).__name__}: {err}") from err
            if resp.will_close:
                self.close()
            if resp.status != 200:
                raise OSError(f"{path} answered {resp.status}")
            return body
        raise AssertionError  # pragma: no cover - the loop returns or raises

    def __call__(self) -> str:
        self._get("/health")
        return self._get("/metrics").decode("utf-8", "replace")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def http_fetch(base_url: str, timeout_s: float) -> HttpScraper:
    """The scrape function `LiveSignals` calls: `/health`, then the `/metrics` text (see HttpScraper)."""
    return HttpScraper(base_url, timeout_s)


class LiveSignals:
    """Scrapes a server every `interval_s` wall seconds on a background thread.

    The controller reads it like `TimelineSignals`: `at(t_s)` is the newest
    good sample, `between(t0, t1)` the good samples stamped in (t0, t1].
    """

    def __init__(self, fetch: Callable[[], str], start_epoch: float, cfg: SignalSettings, interval_s: float = 0.25,
                 stale_after_s: float = 1.5) -> None:
        self.fetch = fetch
        self.start_epoch = start_epoch
        self.cfg = cfg
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self.rows: list[dict] = []
        self._readings: list[Reading] = []
        self._good: list[FleetSignals] = []
        self._good_t: list[float] = []  # their t_s, ascending (scrapes are stamped in order)
        self._last_ok = True
        self._last_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-signals", daemon=True)

    # ------------------------------------------------------------------ scraping

    def scrape_once(self) -> None:
        now = timebase.now()
        t_s = (now - self.start_epoch) * self.cfg.time_scale
        try:
            values = parse_metrics(self.fetch())
        except (OSError, MetricsFormatError) as err:  # timeouts and refused connections are OSErrors
            self._last_ok, self._last_error = False, f"{type(err).__name__}: {err}"[:200]
            self.rows.append({"t_s": t_s, "epoch": now, "ok": False, "error": self._last_error})
            return
        reading = Reading(now, values)
        self._readings.append(reading)
        horizon = now - self.cfg.window_s
        window = [r for r in self._readings[-64:] if r.epoch >= horizon] or [reading]
        signals, rates = fleet_signals(window, t_s, self.cfg)
        self._good_t.append(t_s)  # the stamp first: a reader may see it without its sample, never the reverse
        self._good.append(signals)
        self._last_ok = True
        self.rows.append({"t_s": t_s, "epoch": now, "ok": True, **values, **rates,
                          "inference_pressure": signals.inference_pressure, "busy": signals.busy, "error": ""})

    def _run(self) -> None:
        while not self._stop.is_set():
            started = timebase.now()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_s - (timebase.now() - started)))

    def __enter__(self) -> LiveSignals:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        close = getattr(self.fetch, "close", None)
        if close is not None and not self._thread.is_alive():
            close()

    # ------------------------------------------------------------------ reading

    def problem(self) -> str | None:
        """What keeps the signals from being trusted right now, or None."""
        if not self._last_ok:
            return f"server unreachable or unhealthy ({self._last_error})"
        if not self._good:
            return "no /metrics sample yet"
        age = timebase.now() - (self.start_epoch + self._good[-1].t_s / self.cfg.time_scale)
        if age > self.stale_after_s:
            return f"newest /metrics sample is {age:.1f} s old"
        return None

    def at(self, t_s: float) -> FleetSignals:
        if self._good:
            return self._good[-1]
        return FleetSignals(t_s=t_s, busy=False, arrival_rate=0.0, inference_pressure=0.0, network_pressure=0.0,
                            checkpoint_pressure=0.0)

    def between(self, t0_s: float, t1_s: float) -> list[FleetSignals]:
        good = self._good  # appended by the scraper thread meanwhile: read each list once, by position
        lo = bisect.bisect_right(self._good_t, t0_s)
        hi = bisect.bisect_right(self._good_t, t1_s)
        return good[lo:hi]

    def frame(self) -> pd.DataFrame:
        """The signals timeline: every scrape, good or failed."""
        return pd.DataFrame(self.rows, columns=list(TIMELINE_COLUMNS))
