"""Replay against a real vLLM server (the `vllm` backend of the replay stage).

One server serves every replayed schedule of a stage run. Per schedule the
merge workload is handed the merge windows as wall-clock intervals, the
load generator sends the seed's requests open loop, and a scraper samples
the server's Prometheus gauges; then the server is checked to be alive
before anything is written. Trace time runs `replay.vllm.time_scale` times
faster than wall time (arrivals and merge windows alike), and only the first
`max_trace_s` trace seconds are replayed, so the cpu profile finishes in
minutes; latencies are real milliseconds.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import model_json
from syncsafe.artifacts.replay_sets import write_signals, write_windows
from syncsafe.artifacts.schedule_sets import read_schedule_index
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.control.live_signals import sum_samples
from syncsafe.schedules.schedule import read_schedule
from syncsafe.serving.interference import MergeInterference
from syncsafe.serving.loadgen import replay_requests
from syncsafe.serving.metrics import replay_validity
from syncsafe.serving.replay import (
    index_row,
    replay_path,
    seed_schedules,
    write_replay,
    write_set_index,
    request_results,
    resolve_slo,
    wall_windows,
)
from syncsafe.serving.engine_profile import max_num_seqs, profile_server
from syncsafe.serving.vllm_plan import choose_schedules, replay_order, vllm_controllers, vllm_seeds
from syncsafe.serving.vllm_server import ServerError, VllmServer, resolve_python

#: Gauges scraped from /metrics (summed over label sets).
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}
LEAD_S = 2.0
#: Second no-sync replay of each seed (drift control), same columns as index.csv; and the server profile.
REPEATS_FILE = layout.REPEATS_FILE
PROFILE_FILE = layout.PROFILE_FILE
SERVER_LOG = layout.VLLM_SERVER_LOG


def parse_gauges(text: str) -> dict[str, float]:
    """The GAUGES from a Prometheus text exposition (missing ones are absent)."""
    return {GAUGES[name]: value for name, value in sum_samples(text, GAUGES).items()}


class MetricsScraper:
    """Samples the server's gauges every `interval_s` on a background thread."""

    def __init__(self, base_url: str, interval_s: float, start_epoch: float, time_scale: float) -> None:
        self.url = f"{base_url}/metrics"
        self.interval_s = interval_s
        self.start_epoch = start_epoch
        self.time_scale = time_scale
        self.rows: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:
                    gauges = parse_gauges(resp.read().decode())
                self.rows.append({"t_s": (now - self.start_epoch) * self.time_scale, **gauges})
            except OSError:
                pass  # a missed sample; the server's health is checked separately
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MetricsScraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["t_s", *GAUGES.values()])


def server_log_path(root: Path) -> Path:
    """The vLLM server's log: under logs/ (gitignored), outside every stage output; tracked as an MLflow artifact."""
    return layout.at(root, SERVER_LOG)


def vllm_policies(params: Params) -> list[str]:
    """Controllers whose schedules the vLLM replay covers (the primary first; see `vllm_plan`)."""
    return vllm_controllers(params)


def served_model(params: Params, root: Path) -> Path | str:
    """What the server serves: the configured model, else the trained export, else the model training
    starts from (`train.source`: hub = train.hub.model; builtin = a locally built untrained tiny model).
    Hub ids resolve through the local Hugging Face cache."""
    from syncsafe.diloco.hub import resolve_model

    cfg = params.replay.vllm
    if cfg.model:
        return resolve_model(cfg.model, "replay.vllm.model")
    seed = vllm_seeds(params)[0]
    trained = layout.train_run_dir(root, cfg.regimes[0], vllm_policies(params)[0], seed) / layout.MODEL_DIR
    if (trained / "config.json").is_file():
        return trained
    if params.train.source == "hub":
        return resolve_model(params.train.hub.model, "train.hub.model")
    return build_untrained_model(params, root)


def build_untrained_model(params: Params, root: Path) -> Path:
    """A tiny randomly initialised Llama (the train stage's architecture) for serving without training."""
    from syncsafe.diloco.export import export_hf_model
    from syncsafe.diloco.model import build_tiny_llama
    from syncsafe.diloco.resources import model_spec, prepare_tokenizer

    target = layout.at(root, layout.UNTRAINED_MODEL)
    if not (target / "config.json").is_file():
        _, tokenizer = prepare_tokenizer(params, root)
        export_hf_model(build_tiny_llama(model_spec(params, 0), tokenizer), tokenizer, target)
    return target


def _model_facts(model: Path | str) -> tuple[int, int]:
    """(vocab size, parameter count) of a local HF export, for prompts and the merge payload."""
    config = json.loads((Path(model) / "config.json").read_text())
    weights = Path(model) / "model.safetensors"
    numel = weights.stat().st_size // 4 if weights.is_file() else 1_000_000
    return int(config["vocab_size"]), int(numel)


def replay_vllm(params: Params, root: Path = Path(".")) -> pd.DataFrame:
    """Replay the configured subset of schedules against one real vLLM server."""
    cfg = params.replay.vllm
    if not cfg.enabled:  # an empty set: calibrate then records that nothing was measured on a real server
        return write_set_index(layout.at(root, layout.VLLM_INDEX), [])
    index = read_schedule_index(root)
    chosen = choose_schedules(params, index)
    model = served_model(params, root)
    vocab, numel = _model_facts(model)
    out_root = layout.at(root, layout.VLLM_SET)
    server = VllmServer(resolve_python(cfg.python), model, server_log_path(root), cfg.server_args,
                        cfg.startup_timeout_s, cache_dir=Path(root).resolve() / layout.VLLM_CACHE)
    rows: list[dict] = []
    repeats: list[dict] = []
    warmed = cfg.warmup_s == 0
    with server, MergeInterference(cfg.interference, cfg.interference_workers, numel) as work, \
            tqdm(total=len(chosen) + cfg.repeat_no_sync * chosen["seed"].nunique(), desc="replay vllm",
                 unit="replay", leave=False) as bar:
        for regime, by_regime in chosen.groupby("regime", sort=False):
            for seed, schedules in seed_schedules(root, by_regime):
                requests = read_requests(root, regime, seed)
                requests = requests[requests["arrival_s"] < cfg.max_trace_s].reset_index(drop=True)
                timeline = read_timeline(root, regime, seed)
                if not warmed:  # first requests hit cold code paths; keep them out of every measurement
                    warmup = requests[requests["arrival_s"] < cfg.warmup_s]
                    replay_requests(server.base_url, server.served_name, warmup, time.time() + 0.5, cfg.time_scale, vocab, seed,
                                    cfg.max_in_flight, cfg.request_timeout_s)
                    warmed = True
                    if cfg.engine_profile:  # the server's iteration costs, with and without merges, for calibrate-fit
                        write_server_profile(server, work, out_root, vocab, cfg)
                slo = None
                for row, repeat in replay_order(regime, seed, schedules, cfg.repeat_no_sync):
                    schedule = read_schedule(layout.at(root, row["path"]))
                    start = time.time() + LEAD_S
                    windows = wall_windows(schedule, start, cfg.time_scale, cfg.max_trace_s)
                    work.submit(windows)
                    with MetricsScraper(server.base_url, cfg.scrape_interval_s, start, cfg.time_scale) as scraper:
                        raw = replay_requests(server.base_url, server.served_name, requests, start, cfg.time_scale, vocab,
                                              seed, cfg.max_in_flight, cfg.request_timeout_s)
                    worked = work.collect(timeout_s=cfg.request_timeout_s + cfg.max_trace_s / cfg.time_scale)
                    server.check_alive()  # a server that died mid-replay leaves no summary
                    results = request_results(raw, timeline, worked, start, cfg.time_scale)
                    slo = slo or resolve_slo(params, results)
                    out = replay_path(root, layout.VLLM, row["path"])
                    out = out.with_name(out.name + layout.REPEAT_SUFFIX) if repeat else out
                    write_signals(out, scraper.frame())
                    write_windows(out, pd.DataFrame(
                        [((b - start) * cfg.time_scale, (e - start) * cfg.time_scale, n) for b, e, n in worked],
                        columns=["start_s", "end_s", "iterations"]))
                    summary = write_replay(out, results, slo, params, {
                        "backend": "vllm", "model": str(model), "time_scale": cfg.time_scale,
                        "max_trace_s": cfg.max_trace_s, "interference": cfg.interference,
                        # valid, invalid_reason, failure_rate, send_lag_p99_ms: an invalid replay licenses nothing
                        **replay_validity(results, cfg.max_failure_rate, cfg.max_send_lag_p99_ms),
                        "cap_wait_max_ms": float(results["cap_wait_ms"].max()),
                    })  # fmt: skip
                    (repeats if repeat else rows).append(index_row(row, "vllm", schedule, summary, out, Path(root)))
                    bar.update()
    write_set_index(out_root / REPEATS_FILE, repeats)
    return write_set_index(out_root / layout.INDEX_FILE, rows)


def write_server_profile(server: VllmServer, work: MergeInterference, out_root: Path, vocab: int, cfg) -> Path:
    """Probe the server (`syncsafe.serving.engine_profile`) and write profile.json and the last /metrics text."""
    def merge_window(start: float, end: float):
        work.submit([(start, end)])
        return lambda: work.collect(timeout_s=cfg.request_timeout_s + (end - start))

    now = time.time()  # the workers may still be starting: wait for one short window before timing anything
    work.submit([(now, now + 0.1)])
    work.collect(timeout_s=cfg.startup_timeout_s)
    max_batch = max_num_seqs(cfg.server_args) or 8
    profile, text = profile_server(server.base_url, server.served_name, vocab, max_batch, cfg.interference,
                                   merge_window, probe_s=cfg.engine_profile_probe_s)
    io.write_text(out_root / layout.SERVER_METRICS_FILE, text)
    return io.write_text(out_root / PROFILE_FILE, model_json(profile))


__all__ = ["MetricsScraper", "ServerError", "parse_gauges", "replay_vllm", "served_model"]
