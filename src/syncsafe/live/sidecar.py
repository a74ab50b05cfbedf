"""Live mode: the controller as a sidecar beside a real vLLM server, on the wall clock.

`syncsafe live --regime R --policy P --seed S` starts one vLLM server
serving the trained export (as the vLLM replay does), the merge workload
beside it, and then, per seed, four live runs on the same arrivals (the
seed's requests over the first `live.duration_s` trace seconds, sent open
loop by the load generator, trace time running `live.time_scale` times
faster than wall time):

- the live policy: real DiLoCo islands (`islands`) whose merges the
  policy gates every control cycle on the wall clock, seeing only the
  server's live `/metrics` (`syncsafe.control.live_signals`); when the
  server is unhealthy or `/metrics` unreachable it takes the safe action
  (`syncsafe.control.fallback`) and the run is marked degraded;
- matched random: the live run's merge count, drawn uniformly from the same
  action space (`ActionSpace.sample`), merges issued live at those cycles;
- training without merges: the same islands, the same cycles, no merge;
- no training: the server and the load alone.

Their order is interleaved across seeds (the policy always before its
matched draw, which copies its count). Inner-step compute competes with the
server for the CPU here; training-without-merges against no-training
measures that share, and sync-excess is taken against training without
merges, whose p95 also sets the seed's SLO (x `replay.slo.multiplier`).

Outputs, per run in `runs/live/<regime>/seed-<S>/<condition>/`: the per-
request table (`requests.parquet`, with `merge_active` from the merges' real
wall-clock windows) and `summary.json` (written last), the wall-clock
schedule (`schedule.json`, schedule keys, `source: live`, merge starts in
trace seconds from the run's start), the signals timeline
(`signals.parquet`, every scrape), the decision log (`decisions.jsonl`, with
the wall epoch and lag of each decision), `merges.csv` (wall-clock start,
real merge end and window end of every merge) and `run.json`. Per seed an
`index.csv`; `build_live_index` joins them into `runs/live/index.csv`.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from syncsafe import io, timebase
from syncsafe.artifacts import layout
from syncsafe.artifacts.live_runs import INDEX_COLUMNS, build_live_index
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.control.clock import WallClock
from syncsafe.control.controller import ControlPlan, ControlResult, run_controller
from syncsafe.control.fallback import SafeFallback
from syncsafe.control.live_signals import LiveSignals, SignalSettings, http_fetch
from syncsafe.control.policies import Policy, build_policy
from syncsafe.control.types import Decision
from syncsafe.diloco.resources import builtin_resources
from syncsafe.procs import die_with_parent
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule, write_schedule
from syncsafe.control.serving_model import policy_calibration
from syncsafe.serving.interference import MergeInterference
from syncsafe.live.islands import IslandGroup, LiveLearners, cpu_world
from syncsafe.serving.loadgen import replay_requests
from syncsafe.serving.replay import request_results, resolve_slo, write_replay
from syncsafe.realarm.arm import model_facts, served_model
from syncsafe.serving.vllm_server import VllmServer, resolve_python

LEAD_S = 2.0
MATCHED, NO_MERGE, NO_TRAIN = "matched_random", "train_no_merge", "no_train"


def live_dir(root: Path, regime: str, seed: int) -> Path:
    """runs/live/<regime>/seed-<S>/ under root (`syncsafe.artifacts.layout`)."""
    return layout.live_dir(root, regime, seed)


#: Orders of the four runs, seed s taking ORDERS[s % 4]: the policy always before its matched draw (the draw
#: copies its count); training without merges and no training each take every position once in four seeds.
ORDERS = (("policy", MATCHED, NO_MERGE, NO_TRAIN), (NO_MERGE, NO_TRAIN, "policy", MATCHED),
          (NO_TRAIN, "policy", MATCHED, NO_MERGE), ("policy", NO_MERGE, NO_TRAIN, MATCHED))


def condition_order(seed: int) -> list[str]:
    """The seed's order of the four runs (see ORDERS)."""
    return list(ORDERS[seed % len(ORDERS)])


def live_plan(params: Params) -> ControlPlan:
    c = params.control
    return ControlPlan(step_s=c.step_s, min_h=c.min_h, max_h=c.max_h, window_s=params.merge.window_s,
                       min_gap_s=params.merge.min_gap_s, duration_s=params.live.duration_s)


def live_action_space(params: Params) -> ActionSpace:
    c = params.control
    return ActionSpace.of_controller(c.step_s, c.min_h, c.max_h, params.merge.window_s, params.live.duration_s)


class MergeAt(Policy):
    """Matched random issued live: merge exactly at the drawn decision times."""

    name = MATCHED

    def __init__(self, starts: list[float]) -> None:
        self.starts = list(starts)

    def _decide(self, reports, signals, clock):
        hit = any(abs(clock.t_s - s) < 1e-6 for s in self.starts)
        return Decision(hit, f"drawn start {clock.t_s:g}" if hit else "not a drawn start")


class NoMerges(Policy):
    """Training without merges: the islands train every cycle and never merge."""

    name = NO_MERGE

    def decide(self, reports, signals, clock):
        return Decision(False, "training without merges")

    def _decide(self, reports, signals, clock):  # pragma: no cover - decide never defers to it
        raise AssertionError


@dataclass
class LiveRun:
    """One run's raw outcome, before the seed's SLO is known."""

    condition: str
    policy: str
    order: int
    requests: pd.DataFrame
    start_epoch: float
    signals: pd.DataFrame
    merges: list[dict[str, Any]] = field(default_factory=list)
    result: ControlResult | None = None
    clock_log: list[tuple[float, float, float]] = field(default_factory=list)
    degraded_cycles: int = 0
    matched_to: str | None = None
    cycle_wall_s: list[float] = field(default_factory=list)

    @property
    def merge_starts_s(self) -> list[float]:
        return self.result.merge_starts_s if self.result is not None else []

    @property
    def degraded(self) -> bool:
        """The safe action replaced the policy in at least one decision."""
        return self.degraded_cycles > 0

    @property
    def scrape_failures(self) -> int:
        return int((~self.signals["ok"].astype(bool)).sum()) if len(self.signals) else 0

    @property
    def max_lag_s(self) -> float:
        return max((lag for _, _, lag in self.clock_log), default=0.0)


class LiveSession:
    """The server, the merge workload and the load generator shared by every run of a `live` command."""

    def __init__(self, params: Params, params_path: Path, root: Path) -> None:
        self.params, self.params_path, self.root = params, Path(params_path), Path(root)
        cfg = params.replay.vllm
        self.model = served_model(params, root)
        self.vocab, numel = model_facts(self.model)
        self.server = VllmServer(resolve_python(cfg.python), self.model, layout.at(root, layout.LIVE_SERVER_LOG),
                                 cfg.server_args, cfg.startup_timeout_s,
                                 cache_dir=layout.at(Path(root).resolve(), layout.VLLM_CACHE), scratch_root=root)
        self.work = MergeInterference(cfg.interference, cfg.interference_workers, numel, scratch_root=root)
        self.loadgen = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"),  # dies with the sidecar
                                           initializer=die_with_parent, initargs=(os.getpid(),))
        self.res = builtin_resources(params, root, cpu_world(0, params.train.islands, params))
        self._stack = ExitStack()
        self.warmed = params.live.warmup_s == 0

    def __enter__(self) -> LiveSession:
        self._stack.enter_context(self.server)
        self._stack.enter_context(self.work)
        self._stack.callback(self.loadgen.shutdown, cancel_futures=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def send(self, requests: pd.DataFrame, start_epoch: float, seed: int):
        cfg, live = self.params.replay.vllm, self.params.live
        return self.loadgen.submit(replay_requests, self.server.base_url, self.server.served_name, requests,
                                   start_epoch, live.time_scale, self.vocab, seed, cfg.max_in_flight,
                                   cfg.request_timeout_s)

    def signals(self, start_epoch: float) -> LiveSignals:
        live = self.params.live
        settings = SignalSettings(time_scale=live.time_scale, window_s=live.signal_window_s,
                                  capacity_seqs=live.capacity_seqs, reference_rps=live.reference_rps,
                                  busy_pressure=live.busy_pressure)
        return LiveSignals(http_fetch(self.server.base_url, timeout_s=1.0), start_epoch, settings,
                           live.scrape_interval_s, live.stale_after_s)

    def warm_up(self, requests: pd.DataFrame, seed: int) -> None:
        """First requests hit cold code paths: keep them out of every measurement."""
        if not self.warmed:
            warm = requests[requests["arrival_s"] < self.params.live.warmup_s]
            self.send(warm, timebase.now() + 0.5, seed).result()
            self.warmed = True


def _controller_policy(params: Params, name: str, seed: int) -> Policy:
    grid_s = params.live.scrape_interval_s * params.live.time_scale
    calibration = policy_calibration(params.control.calibrated.calibration, params.control.calibrated.merge_link)
    return build_policy(name, params.control, params.merge, seed, calibration, grid_s)


def run_condition(session: LiveSession, regime: str, seed: int, condition: str, policy: str, order: int,
                  requests: pd.DataFrame, draw_starts: list[float] | None = None) -> LiveRun:
    """One live run on the seed's arrivals; returns its raw outcome."""
    params, live = session.params, session.params.live
    plan = live_plan(params)
    run_dir = live_dir(session.root, regime, seed) / condition
    training = condition != NO_TRAIN
    with ExitStack() as stack:
        group = stack.enter_context(IslandGroup(params, session.params_path, session.root, seed, run_dir,
                                                session.res)) if training else None
        start = timebase.now() + LEAD_S
        clock = WallClock(start, live.time_scale)
        sent = session.send(requests, start, seed)
        signals = stack.enter_context(session.signals(start))
        run = LiveRun(condition=condition, policy=policy if condition == "policy" else condition, order=order,
                      requests=pd.DataFrame(), start_epoch=start, signals=pd.DataFrame(columns=["ok"]))
        time.sleep(max(0.0, start - timebase.now()))  # islands start with the load
        if group is not None:
            if condition == "policy":
                agent: Policy = SafeFallback(_controller_policy(params, policy, seed), signals.problem)
            elif condition == MATCHED:
                agent, run.matched_to = MergeAt(draw_starts or []), policy
            else:
                agent = NoMerges()
            learners = LiveLearners(group.learners, clock, plan.window_s, session.work,
                                    params.replay.vllm.request_timeout_s)
            try:
                run.result = run_controller(agent, learners, signals, plan, timebase=clock)
                group.stop()
            except RuntimeError as err:  # a collective failed: an island is gone
                group.check(err)
            run.merges = [{**m, **s} for m, s in zip(learners.merges, group.merge_stats)]
            run.clock_log = clock.log
            run.cycle_wall_s = learners.cycle_wall_s
            run.degraded_cycles = getattr(agent, "degraded_cycles", 0)
        run.requests = sent.result()
        time.sleep(live.scrape_interval_s)
    run.signals = signals.frame()
    session.server.check_alive()  # a server that died mid-run leaves no summary
    return run


def _schedule(params: Params, regime: str, seed: int, run: LiveRun) -> Schedule:
    return Schedule(regime=regime, policy=run.policy, seed=seed, matched_to=run.matched_to, source="live",
                    duration_s=params.live.duration_s, window_s=params.merge.window_s,
                    min_gap_s=params.merge.min_gap_s, merge_starts_s=run.merge_starts_s)


def _decision_lines(run: LiveRun) -> str:
    if run.result is None:
        return ""
    lines = []
    for d, (_, epoch, lag), train_s in zip(run.result.decisions, run.clock_log, run.cycle_wall_s):
        lines.append(json.dumps({**asdict(d), "wall_epoch": epoch, "lag_s": lag, "train_wall_s": train_s,
                                 "degraded": d.reason.startswith("degraded")}, sort_keys=True) + "\n")
    return "".join(lines)


def write_run(params: Params, regime: str, seed: int, run: LiveRun, slo, timeline: pd.DataFrame, root: Path,
              space: ActionSpace) -> dict[str, Any]:
    """Every output of one run (summary.json last); its index row."""
    out = live_dir(root, regime, seed) / run.condition
    live = params.live
    worked = [(m["start_epoch"], m["window_end_epoch"], m["fill_iterations"]) for m in run.merges]
    results = request_results(run.requests, timeline, worked, run.start_epoch, live.time_scale)
    schedule = _schedule(params, regime, seed, run)
    write_schedule(out / layout.SCHEDULE_FILE, schedule)
    io.write_parquet(out / layout.SIGNALS_FILE, run.signals)
    io.write_text(out / layout.DECISIONS_FILE, _decision_lines(run))
    merges = pd.DataFrame(run.merges)
    io.write_csv(out / layout.MERGES_FILE, merges)
    feasible = space.contains(schedule.merge_starts_s) if run.result is not None and run.condition != NO_MERGE else None
    facts = {"condition": run.condition, "order": run.order, "start_epoch": run.start_epoch,
             "degraded": run.degraded, "degraded_cycles": run.degraded_cycles, "scrape_failures": run.scrape_failures,
             "max_lag_s": run.max_lag_s,
             "decide_us_p99": float(np.percentile(run.result.decide_us, 99)) if run.result and run.result.decide_us else None,
             "feasible": feasible, "n_merges": schedule.n_merges, "time_scale": live.time_scale}
    io.write_json(out / layout.RUN_FILE, facts)
    summary = write_replay(out, results, slo, params, {"backend": "vllm-live", **facts})
    return {"regime": regime, "policy": run.policy, "seed": seed, "draw": 0 if run.condition == MATCHED else None,
            "matched_to": run.matched_to, "condition": run.condition, "order": run.order, "backend": "vllm-live",
            "slo_violation_rate": summary["slo_violation_rate"], "p95_ms": summary["e2e_p95_ms"],
            "p99_ms": summary["e2e_p99_ms"], "n_requests": summary["n_requests"], "n_failed": summary["n_failed"],
            "n_merges": schedule.n_merges, "requests_during_merges": summary["requests_during_merges"],
            "degraded": run.degraded, "degraded_cycles": run.degraded_cycles, "scrape_failures": run.scrape_failures,
            "feasible": feasible,
            "max_lag_s": run.max_lag_s, "path": out.relative_to(root).as_posix()}


def live_seed(session: LiveSession, regime: str, policy: str, seed: int) -> pd.DataFrame:
    """The seed's four runs in its interleaved order; writes their outputs and the seed's index."""
    params, root = session.params, session.root
    requests = read_requests(root, regime, seed)
    requests = requests[requests["arrival_s"] < params.live.duration_s].reset_index(drop=True)
    timeline = read_timeline(root, regime, seed)
    session.warm_up(requests, seed)
    space = live_action_space(params)
    runs: dict[str, LiveRun] = {}
    for order, condition in enumerate(condition_order(seed)):
        draw = None
        if condition == MATCHED:
            n = len(runs["policy"].merge_starts_s)
            rng = np.random.default_rng([seed, zlib.crc32(f"live/{regime}/{policy}".encode())])
            draw = space.sample(n, rng)
        runs[condition] = run_condition(session, regime, seed, condition, policy, order, requests, draw)
    slo = resolve_slo(params, request_results(runs[NO_MERGE].requests, timeline, [], runs[NO_MERGE].start_epoch,
                                              params.live.time_scale))
    rows = [write_run(params, regime, seed, runs[c], slo, timeline, root, space) for c in condition_order(seed)]
    index = pd.DataFrame(rows, columns=list(INDEX_COLUMNS)).astype({"draw": "Int64"})
    io.write_csv(live_dir(root, regime, seed) / layout.INDEX_FILE, index)
    return index


def run_live(params: Params, params_path: Path, regime: str, policy: str, seeds: list[int],
             root: Path = Path(".")) -> pd.DataFrame:
    """Live runs for every seed on one server; the joined index of everything under runs/live/."""
    with LiveSession(params, params_path, root) as session:
        for seed in seeds:
            live_seed(session, regime, policy, seed)
    return build_live_index(root)

