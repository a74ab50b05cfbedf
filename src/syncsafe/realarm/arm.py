"""The real arm's server, merge work and client: what the profile-vllm and replay-vllm stages start and drive.

`open_arm` starts one vLLM server (`vllm_server`) on the CPUs
`placement` gives it, the merge work beside it (`interference`), and pins
this process, the client, to CPUs of its own. `RealArm` then sends load
(`send`), warms the server until its decode pace stops falling (`warm_up`),
measures the engine profile (`profile`), and takes one planned replay
(`replay`): the merge work handed the schedule's windows inside the span as
wall intervals, the load generator sending the span's requests open loop, a
scraper sampling the server's gauges, and a monitor measuring foreign CPU
use (above `max_foreign_cpu` the replay is retried once after a pause, then
marked invalid, "machine busy"). Too many failures, a late client, a failing
scraper or an overloaded control mark a replay invalid as well.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from syncsafe import io, localhttp, timebase
from syncsafe.artifacts import layout
from syncsafe.artifacts.calibration import model_json
from syncsafe.artifacts.traces import read_requests
from syncsafe.config import Params, max_num_seqs
from syncsafe.control.live_signals import sum_samples
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule, read_schedule, write_schedule
from syncsafe.schedules.span import span_count
from syncsafe.serving.busy import ForeignCpu, ForeignCpuMonitor
from syncsafe.realarm.engine_profile import ServerProfile, profile_server
from syncsafe.serving.interference import MergeInterference
from syncsafe.serving.loadgen import replay_requests
from syncsafe.serving.metrics import replay_validity
from syncsafe.serving.placement import CpuPlacement
from syncsafe.realarm.evidence import overload_reason
from syncsafe.serving.replay import replay_path, request_results, wall_windows
from syncsafe.realarm.design import RegimePlan, block_order, check_span_budget, span_cadence, span_draws, vllm_regimes
from syncsafe.serving.vllm_server import ServerError, VllmServer, resolve_python
from syncsafe.realarm.warmup import WarmupRecord, decode_pace_ms, warm_until_stable

#: Gauges scraped from /metrics (summed over label sets).
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
}
#: Wall seconds between handing a replay its windows and its first arrival.
LEAD_S = 1.0
#: Trace seconds per wall second of the warm-up load.
WARMUP_TIME_SCALE = 4.0


def parse_gauges(text: str) -> dict[str, float]:
    """The GAUGES from a Prometheus text exposition (missing ones are absent)."""
    return {GAUGES[name]: value for name, value in sum_samples(text, GAUGES).items()}


#: How long one /metrics scrape may take: the API server answers it between streaming tokens, and inside a merge
#: window at the planned load it has been seen to take over 2 s (a late answer still holds that moment's gauges).
SCRAPE_TIMEOUT_S = 5.0


class MetricsScraper:
    """Samples the server's gauges every `interval_s` on a background thread, counting failed scrapes."""

    def __init__(self, base_url: str, interval_s: float, start_epoch: float, time_scale: float) -> None:
        self.url = f"{base_url}/metrics"
        self.interval_s = interval_s
        self.start_epoch = start_epoch
        self.time_scale = time_scale
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:

        while not self._stop.is_set():
            now = timebase.now()
            try:
                with localhttp.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as resp:
                    gauges = parse_gauges(resp.read().decode())
                self.rows.append({"t_s": (now - self.start_epoch) * self.time_scale, **gauges})
            except Exception as err:  # noqa: BLE001 - every failed scrape is counted, none ends the thread
                self.failures.append(f"{type(err).__name__}: {err}"[:200])
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MetricsScraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["t_s", *GAUGES.values()])

    @property
    def failure_rate(self) -> float:
        attempts = len(self.rows) + len(self.failures)
        return len(self.failures) / attempts if attempts else 1.0


def server_log_path(root: Path, log: Path = layout.VLLM_SERVER_LOG) -> Path:
    """A stage's vLLM server log: under logs/ (gitignored), outside every stage output; an MLflow artifact."""
    return layout.at(root, log)


def served_model(params: Params, root: Path) -> Path | str:
    """What the server serves: the configured model, else the trained export, else the model training
    starts from (`train.source`: hub = train.hub.model; builtin = a locally built untrained tiny model).
    Hub ids resolve through the local Hugging Face cache."""
    from syncsafe.diloco.hub import resolve_model
    from syncsafe.realarm.design import vllm_controllers, vllm_seeds

    cfg = params.replay.vllm
    if cfg.model:
        return resolve_model(cfg.model, "replay.vllm.model")
    trained = layout.train_run_dir(root, cfg.regimes[0], vllm_controllers(params)[0], vllm_seeds(params)[0])
    if (trained / layout.MODEL_DIR / "config.json").is_file():
        return trained / layout.MODEL_DIR
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


def model_facts(model: Path | str) -> tuple[int, int]:
    """(vocab size, parameter count) of a local HF export, for prompts and the merge payload."""
    config = json.loads((Path(model) / "config.json").read_text())
    weights = Path(model) / "model.safetensors"
    numel = weights.stat().st_size // 4 if weights.is_file() else 1_000_000
    return int(config["vocab_size"]), int(numel)


@dataclass(frozen=True)
class PlannedReplay:
    """One replay of the plan: what to replay, where its output goes, and its place among the seed's replays."""

    row: pd.Series
    schedule: Schedule
    out: Path
    control: int | None
    position: int
    #: Its round inside its seed's block (`design.seed_block`); an added control: a round of its own.
    round: int


@dataclass(frozen=True)
class Measured:
    """A replay taken, not yet written: its per-request table, the server's gauges, the merge windows as they
    ran (trace seconds) and its summary fields (validity among them)."""

    item: PlannedReplay
    results: pd.DataFrame
    signals: pd.DataFrame
    windows: pd.DataFrame
    extra: dict

    @property
    def seed(self) -> int:
        return int(self.item.row["seed"])

    def invalid(self, reason: str) -> Measured:
        """The same replay marked invalid for `reason` as well."""
        reasons = [r for r in (self.extra.get("invalid_reason") or "", reason) if r]
        return self.with_fields(valid=False, invalid_reason="; ".join(reasons))

    def with_fields(self, **fields) -> Measured:
        """The same replay with these summary fields set."""
        return Measured(self.item, self.results, self.signals, self.windows, {**self.extra, **fields})


class RealArm:
    """The server, its merge work and the client of one stage run (see the module docstring)."""

    def __init__(self, params: Params, root: Path, server: VllmServer, work: MergeInterference,
                 placement: CpuPlacement, model: Path | str, vocab: int) -> None:
        self.params, self.cfg, self.root = params, params.replay.vllm, Path(root)
        self.server, self.work, self.placement = server, work, placement
        self.model, self.vocab = model, vocab
        self.enacted()  # before anything is measured

    def enacted(self) -> dict[str, object]:
        """The placement as /proc shows it now (`CpuPlacement.enacted`); a misplaced process fails the stage."""
        seen, misplaced = self.placement.enacted(self.server.tree(), self.work.pids)
        if misplaced:
            raise ServerError(f"CPU placement not enacted ({self.placement.mode}): {'; '.join(misplaced)}")
        return seen

    def send(self, requests: pd.DataFrame, start_epoch: float, time_scale: float = 1.0, seed: int = 0) -> pd.DataFrame:
        cfg = self.cfg
        return replay_requests(self.server.base_url, self.server.served_name, requests, start_epoch, time_scale,
                               self.vocab, seed, cfg.max_in_flight, cfg.request_timeout_s)

    def warm_up(self) -> WarmupRecord | None:
        """First requests hit cold code paths and the server speeds up for minutes: a slice of real load,
        discarded, sent until the decode pace stops falling (`syncsafe.realarm.warmup`); None when switched off."""
        cfg = self.cfg
        now = timebase.now()  # the workers may still be starting: one short window before anything is timed
        self.work.submit([(now, now + 0.1)])
        self.work.collect(timeout_s=cfg.startup_timeout_s)
        regime, seed = vllm_regimes(self.params)[0], self.params.seeds[0]
        requests = read_requests(self.root, regime, seed)
        warm = requests[requests["arrival_s"] < cfg.warmup_s]
        if cfg.warmup_s <= 0 or warm.empty:
            return None
        record = warm_until_stable(lambda: self.send(warm, timebase.now() + 0.5, WARMUP_TIME_SCALE, seed),
                                   cfg.warmup_alpha, cfg.warmup_stable_probes, cfg.warmup_max_s)
        tqdm.write(f"replay vllm: {record.describe()}")
        return record

    def profile(self, out_root: Path) -> ServerProfile | None:
        """The engine profile (profile.json and the last /metrics text under `out_root`), or None when off."""
        cfg = self.cfg
        if not cfg.engine_profile:
            return None

        def merge_window(start: float, end: float):
            self.work.submit([(start, end)])
            return lambda: self.work.collect(timeout_s=cfg.request_timeout_s + (end - start))

        max_batch = max_num_seqs(cfg.server_args) or 8
        profile, text = profile_server(self.server.base_url, self.server.served_name, self.vocab, max_batch,
                                       cfg.interference, merge_window, probe_s=cfg.engine_profile_probe_s)
        io.write_text(out_root / layout.SERVER_METRICS_FILE, text)
        io.write_text(out_root / layout.PROFILE_FILE, model_json(profile))
        return profile

    # ------------------------------------------------------------------ the replays

    def planned(self, plan: RegimePlan, index: pd.DataFrame) -> list[PlannedReplay]:
        """The regime's replays in block order (`block_order`), span-matched draws and cadences made and
        written as schedules."""
        space = ActionSpace.of_params(self.params, plan.regime)
        by_seed: dict[int, list[pd.Series]] = {}
        for seed in plan.seeds:
            rows = index[(index["regime"] == plan.regime) & (index["seed"] == seed)]
            chosen = [r for _, r in rows.iterrows()
                      if r["source"] == "no_sync" or (r["source"] in ("train", "harness") and r["policy"] in plan.controllers)]
            for controller_row in [r for r in chosen if r["source"] != "no_sync"]:
                controller = read_schedule(layout.at(self.root, controller_row["path"]))
                derived = [(d, layout.span_draw_dir(self.root, plan.regime, seed, controller.policy, int(d.draw)))
                           for d in span_draws(controller, space, plan.span_s, plan.draws)]
                derived.append((span_cadence(controller, space, plan.span_s),
                                layout.span_cadence_dir(self.root, plan.regime, seed, controller.policy)))
                for schedule, target in derived:
                    check_span_budget(controller, schedule, plan.span_s)
                    path = write_schedule(target / layout.SCHEDULE_FILE, schedule)
                    chosen.append(pd.Series({"regime": plan.regime, "policy": schedule.policy, "seed": seed,
                                             "draw": schedule.draw, "matched_to": controller.policy,
                                             "source": schedule.source,
                                             "path": path.relative_to(self.root).as_posix()}))
            by_seed[seed] = chosen
        return [self.planned_replay(o.row, o.control, position, o.round)
                for position, o in enumerate(block_order(plan.regime, by_seed, plan.controls))]

    def planned_replay(self, row: pd.Series, control: int | None, position: int, round_: int) -> PlannedReplay:
        """Where one replay of `row`'s schedule goes: beside a span-matched schedule, or under the replay set."""
        schedule = read_schedule(layout.at(self.root, row["path"]))
        if row["source"] in ("matched_random", "even_cadence"):
            base = layout.at(self.root, row["path"]).parent
        else:
            base = replay_path(self.root, layout.VLLM, row["path"])
        if control is not None:
            base = layout.control_replay_dir(base, control)
        return PlannedReplay(row, schedule, base, control, position, round_)

    def replay_once(self, item: PlannedReplay, requests: pd.DataFrame, plan: RegimePlan
                    ) -> tuple[pd.DataFrame, list, MetricsScraper, ForeignCpu, float]:
        cfg = self.cfg
        start = timebase.now() + LEAD_S
        self.work.submit(wall_windows(item.schedule, start, plan.time_scale, plan.span_s))
        with ForeignCpuMonitor(cfg.busy_sample_s) as monitor, \
                MetricsScraper(self.server.base_url, cfg.scrape_interval_s, start, plan.time_scale) as scraper:
            raw = self.send(requests, start, plan.time_scale, int(item.row["seed"]))
        worked = self.work.collect(timeout_s=cfg.request_timeout_s + plan.span_s / plan.time_scale)
        self.server.check_alive()  # a server that died mid-replay leaves no summary
        return raw, worked, scraper, monitor.result(), start

    def replay(self, item: PlannedReplay, requests: pd.DataFrame, timeline: pd.DataFrame, plan: RegimePlan,
               load_utilisation: float, ttft_bound_ms: float | None) -> Measured:
        """One planned replay, retried once when the machine was busy; its per-request table and summary
        fields (written once the seed's SLO is known: `replays.write_regime`)."""
        cfg = self.cfg
        attempts, began = 0, time.monotonic()
        placement = {**self.placement.record(), "enacted": self.enacted()}
        while True:
            attempts += 1
            raw, worked, scraper, foreign, start = self.replay_once(item, requests, plan)
            if foreign.cores <= cfg.max_foreign_cpu or attempts == 2:
                break
            tqdm.write(f"replay vllm: machine busy during {item.out.name} ({foreign.describe()}); "
                       f"retrying after {cfg.busy_retry_pause_s:g} s")
            time.sleep(cfg.busy_retry_pause_s)
        results = request_results(raw, timeline, worked, start, plan.time_scale)
        windows = pd.DataFrame([((b - start) * plan.time_scale, (e - start) * plan.time_scale, n) for b, e, n in worked],
                               columns=["start_s", "end_s", "iterations"])
        reasons = []
        if foreign.cores > cfg.max_foreign_cpu:
            reasons.append(f"machine busy: {foreign.describe()} > max_foreign_cpu {cfg.max_foreign_cpu:g}")
        if scraper.failure_rate > cfg.max_scrape_failure_rate:
            reasons.append(f"/metrics scrapes failed {len(scraper.failures)} times "
                           f"({scraper.failure_rate:.0%} > max_scrape_failure_rate {cfg.max_scrape_failure_rate:g})")
        if item.control is not None and (overloaded := overload_reason(results, ttft_bound_ms)):
            reasons.append(overloaded)
        counted = span_count(item.schedule.merge_starts_s, item.schedule.window_s, plan.span_s)
        return Measured(item, results, scraper.frame(), windows, {
            "backend": "vllm", "model": str(self.model), "time_scale": plan.time_scale, "span_s": plan.span_s,
            "utilisation": load_utilisation, "interference": cfg.interference, "placement": placement,
            "position": item.position, "round": item.round, "control": item.control, "attempts": attempts,
            "wall_s": time.monotonic() - began,
            "span_merges": counted.merges, "span_cut": counted.cut,
            "foreign_cpu_cores": foreign.cores, "foreign_top": [list(t) for t in foreign.top],
            "scrape_failures": len(scraper.failures), "scrape_failure_rate": scraper.failure_rate,
            "scrape_failure_reasons": scraper.failures[:5],  # what the first failed scrapes met
            # valid, invalid_reason, failure_rate, send_lag_p99_ms: an invalid replay licenses nothing
            **replay_validity(results, cfg.max_failure_rate, cfg.max_send_lag_p99_ms, reasons),
            "cap_wait_max_ms": float(results["cap_wait_ms"].max()),
            "no_merge_pace_ms": decode_pace_ms(results[~results["merge_active"].to_numpy(dtype=bool)]),
        })  # fmt: skip


class PhaseClock:
    """How long each phase of a real-arm stage took: printed (the stage log keeps it) and kept in `phases_s`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.phases_s: dict[str, float] = {}
        self.last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases_s[phase] = round(now - self.last, 1)
        tqdm.write(f"{self.prefix}: {phase} took {self.phases_s[phase]:.0f} s")
        self.last = now


@contextmanager
def open_arm(params: Params, root: Path, log: Path) -> Iterator[RealArm]:
    """The server (its log at `log`, root-relative), its merge work and the pinned client, for one stage run;
    everything stopped on the way out, whatever happened."""
    cfg = params.replay.vllm
    model = served_model(params, root)
    vocab, numel = model_facts(model)
    placement = CpuPlacement.split(cfg.client_cpus)
    server = VllmServer(resolve_python(cfg.python), model, server_log_path(root, log), cfg.server_args,
                        cfg.startup_timeout_s, cache_dir=root.resolve() / layout.VLLM_CACHE, placement=placement,
                        scratch_root=root)
    with placement.pinned_client(), server, MergeInterference(cfg.interference, cfg.interference_workers, numel,
                                                              placement=placement) as work:
        yield RealArm(params, root, server, work, placement, model, vocab)


__all__ = ["GAUGES", "Measured", "MetricsScraper", "PhaseClock", "PlannedReplay", "RealArm", "ServerError", "build_untrained_model",
           "model_facts", "open_arm", "parse_gauges", "served_model", "server_log_path"]
