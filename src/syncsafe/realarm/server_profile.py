"""The server profile: what the real server can take, measured once per machine and model (stage `profile-vllm`).

The real arm's plan must not depend on one run's noisy probes: two runs of
the same commit on the same machine must plan alike. So the measurement is
its own DVC stage, rerun only when what it measures changes (the served
model, the traces, the server and load settings of `replay.vllm`, the
merge window) or when a user re-profiles on purpose (`syncsafe run --redo
profile-vllm`, or `dvc repro --force profile-vllm`). In one server run:

1. warm-up until the decode pace stops falling (`warmup`);
2. the engine profile (`engine_profile`: iteration costs, the merge's
   share of the server), written to `profile.json` for the calibration;
3. per regime of `replay.vllm.regimes` (the declared primary's first): the
   capacity for its token mix as the lower bound of repeated probes, the
   pinned time scale checked against it (refused, naming the largest the
   machine holds, when its busiest window would run over the target
   utilisation) or, where params leave it null, the time scale sized from
   it on a coarse grid, and the noise probe (`capacity`).

`server.json` (`MeasuredServer`) holds the loads, the warm-up and what was
served; `replay-vllm` plans from it as a pure function
(`plan.plan_real_arm`) and checks every control's load against its
regime's light-load TTFT bound instead of re-planning.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from syncsafe import io
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_model
from syncsafe.artifacts.calibration import model_json
from syncsafe.artifacts.traces import read_requests
from syncsafe.config import Params
from syncsafe.errors import BadInput
from syncsafe.realarm.capacity import (
    CapacityProbe,
    RegimeLoad,
    check_capacity,
    confirm_capacity,
    load_scale,
    load_shape,
    noise_probe,
    search_capacity,
    token_mix,
)
from syncsafe.realarm.engine_profile import ServerProfile
from syncsafe.realarm.arm import PhaseClock, RealArm, open_arm, served_model
from syncsafe.realarm.design import vllm_regimes
from syncsafe.realarm.warmup import WarmupRecord

#: A guess of the capacity (requests/s) when there is no engine profile to guess from.
DEFAULT_FIRST_GUESS_RPS = 4.0
HINT = "run the profile-vllm stage (`syncsafe run`, or `syncsafe replay profile` alone)"


class MeasuredServer(BaseModel):
    """server.json of the server profile (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: What the server served (the trained export, a local build or a hub id; root-relative when in the project).
    model: str
    loads: dict[str, RegimeLoad]
    warmup: WarmupRecord | None = None
    placement: dict[str, object] = Field(default_factory=dict)
    #: The machine it was measured on (for the reader: a profile belongs to one machine kind).
    machine: dict[str, object] = Field(default_factory=dict)
    engine_profiled: bool = False
    #: Wall seconds of each phase (server start and warm-up, engine profile, each regime's load).
    phases_s: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


def model_name(model: Path | str, root: Path) -> str:
    """What a profile records as the served model: root-relative when it lives in the project, else as given."""
    path = Path(model)
    try:
        return path.resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(model)


def machine() -> dict[str, object]:
    """The machine kind: processor, logical CPUs this process may use, platform."""
    return {"processor": platform.processor() or platform.machine(), "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform()}


def first_guess_rps(profile: ServerProfile | None, mix: pd.DataFrame) -> float:
    """Requests/s a full batch decoding the mix's mean output would sustain, by the profile's inter-token latency."""
    if profile is None or not profile.decode(merge=False):
        return DEFAULT_FIRST_GUESS_RPS
    widest = max(profile.decode(merge=False), key=lambda r: r.concurrency)
    per_request_s = float(widest.itl_ms or 0.0) / 1000.0 * float(mix["output_tokens"].mean())
    return widest.concurrency / per_request_s if per_request_s > 0 else DEFAULT_FIRST_GUESS_RPS


@dataclass(frozen=True)
class MeasuredCapacity:
    """A regime's capacity on the real server: the confirmed lower bound, the TTFT bound, every probe."""

    capacity_rps: float
    ttft_bound_ms: float
    probes: list[CapacityProbe]


def measure_capacity(params: Params, mix: pd.DataFrame, profile: ServerProfile | None, arm: RealArm,
                     required_rps: float | None = None) -> MeasuredCapacity:
    """The capacity for the token mix `mix` (`syncsafe.realarm.capacity`): with `required_rps` (a pinned plan's
    need) the check at that rate, falling back to the search when it does not hold; else the search, then its
    confirmation."""
    cfg = params.replay.vllm
    seed = params.seeds[0]
    sender = lambda t, epoch: arm.send(t, epoch, 1.0, seed)  # noqa: E731
    guess = first_guess_rps(profile, mix)
    if required_rps is not None:
        capacity, bound, probes = check_capacity(sender, mix, required_rps, guess, cfg.capacity_probe_s,
                                                 cfg.capacity_ttft_factor, seed)
        return MeasuredCapacity(capacity, bound, probes)
    knee, bound, probes = search_capacity(sender, mix, guess, cfg.capacity_probe_s, cfg.capacity_ttft_factor, seed)
    capacity, confirmations = confirm_capacity(sender, mix, knee, probes[0].rate_rps, cfg.capacity_probe_s, bound,
                                               seed)
    return MeasuredCapacity(capacity, bound, [*probes, *confirmations])


def measure_load(params: Params, root: Path, regime: str, profile: ServerProfile | None, arm: RealArm) -> RegimeLoad:
    """The regime's capacity, time scale and noise probe on the real server (`syncsafe.realarm.capacity`)."""
    cfg = params.replay.vllm
    tables = [read_requests(root, regime, seed) for seed in params.seeds]
    mix = token_mix(tables)
    shape = load_shape([t["arrival_s"].to_numpy(dtype=float) for t in tables], params.merge.window_s,
                       params.regimes[regime].duration_s)
    pinned = cfg.pinned_time_scale(regime)
    required = None if pinned is None else shape.peak_rate * pinned / cfg.target_utilisation
    measured = measure_capacity(params, mix, profile, arm, required)
    scale, peak_u, median_u = load_scale(regime, measured.capacity_rps, shape, cfg.target_utilisation, pinned)
    seed = params.seeds[0]
    noise = noise_probe(lambda t, epoch: arm.send(t, epoch, 1.0, seed), shape.peak_rate * scale,
                        cfg.capacity_probe_s, mix, seed)
    return RegimeLoad(
        regime=regime, capacity_rps=measured.capacity_rps, ttft_bound_ms=measured.ttft_bound_ms,
        probes=measured.probes, peak_rate=shape.peak_rate, median_rate=shape.median_rate,
        window_s=params.merge.window_s, time_scale=scale, time_scale_fixed=pinned is not None,
        target_utilisation=cfg.target_utilisation, utilisation=peak_u, median_utilisation=median_u,
        noise_log_ratios=noise,
    )  # fmt: skip


def profile_vllm(params: Params, root: Path = Path(".")) -> MeasuredServer:
    """Measure the server (see the module docstring); write runs/server-profile/."""
    root = Path(root)
    out = layout.at(root, layout.SERVER_PROFILE)
    if not params.replay.vllm.enabled:  # nothing to measure: the replay stage writes an empty set as well
        measured = MeasuredServer(model="", loads={}, notes=["replay.vllm.enabled is false"])
        io.write_text(out / layout.SERVER_FILE, model_json(measured))
        return measured
    clock = PhaseClock("profile vllm")
    with open_arm(params, root, layout.PROFILE_SERVER_LOG) as arm:
        warmup = arm.warm_up()
        clock.lap("server start and warm-up")
        engine = arm.profile(out)
        clock.lap("engine profile")
        loads = {}
        for regime in vllm_regimes(params):
            tqdm.write(f"profile vllm: measuring the server's capacity for {regime}")
            loads[regime] = measure_load(params, root, regime, engine, arm)
            load = loads[regime]
            tqdm.write(f"profile vllm: {regime}: capacity {load.capacity_rps:.3g} req/s (lower bound of "
                       f"{len(load.probes)} probes), time scale {load.time_scale:g}, busiest window at "
                       f"{load.utilisation:.0%}")
            clock.lap(f"load of {regime}")
        measured = MeasuredServer(model=model_name(arm.model, root), loads=loads, warmup=warmup,
                                  placement=arm.placement.record(), machine=machine(),
                                  engine_profiled=engine is not None, phases_s=clock.phases_s)
    io.write_text(out / layout.SERVER_FILE, model_json(measured))
    return measured


def read_measured_server(params: Params, root: Path) -> MeasuredServer:
    """runs/server-profile/server.json, checked against what this run will serve and replay (BadInput when the
    profile is missing or was measured for another model, other regimes or another load target)."""
    measured = read_model(layout.at(root, layout.VLLM_SERVER_FILE), MeasuredServer, "server profile", hint=HINT)
    where = layout.VLLM_SERVER_FILE.as_posix()
    model = model_name(served_model(params, root), root)
    if measured.model != model:
        raise BadInput(f"{where}: measured for model {measured.model}, this run serves {model}; {HINT}")
    cfg = params.replay.vllm
    for regime in vllm_regimes(params):
        load = measured.loads.get(regime)
        if load is None:
            raise BadInput(f"{where}: no load measured for regime {regime} (replay.vllm.regimes); {HINT}")
        pinned = cfg.pinned_time_scale(regime)
        if abs(load.target_utilisation - cfg.target_utilisation) > 1e-9 or load.window_s != params.merge.window_s \
                or load.time_scale_fixed != (pinned is not None) or (pinned is not None and load.time_scale != pinned):
            raise BadInput(f"{where}: {regime}'s load was measured for replay.vllm.target_utilisation "
                           f"{load.target_utilisation:g}, merge.window_s {load.window_s:g} and time_scale "
                           f"{load.time_scale if load.time_scale_fixed else 'null'}; params now differ; {HINT}")
    return measured


__all__ = ["MeasuredCapacity", "MeasuredServer", "first_guess_rps", "measure_capacity", "measure_load", "profile_vllm", "read_measured_server"]
