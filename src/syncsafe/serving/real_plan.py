"""Measure the real server's load per regime and size the real arm's plan (before any replay).

For every regime of `replay.vllm.regimes`, the declared primary's first
(`vllm_plan.vllm_regimes`): the capacity for its token mix,
the time scale that sets its busiest window (over every seed) at the target
utilisation, and the noise probe (`syncsafe.serving.capacity`); then the
plan (`syncsafe.serving.plan_sizing`) from the planned seeds' requests,
timelines and controller schedules, the engine profile's iteration costs and
merge share, and the noise. The result is the `RealPlan` the replay stage
writes to `plan.json` and prints.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from syncsafe.artifacts import layout
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.control.serving_model import Calibration
from syncsafe.errors import BadInput
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import read_schedule
from syncsafe.serving.capacity import (
    RegimeLoad,
    confirm_capacity,
    load_scale,
    load_shape,
    noise_probe,
    search_capacity,
    token_mix,
)
from syncsafe.serving.engine_profile import ServerProfile, profile_prior
from syncsafe.serving.placement import CpuPlacement
from syncsafe.serving.plan_sizing import RegimeDesign, SeedInputs, size_plans
from syncsafe.serving.vllm_plan import RealPlan, RegimePlan, vllm_controllers, vllm_regimes, vllm_seed_split

#: A guess of the capacity (requests/s) when there is no engine profile to guess from.
DEFAULT_FIRST_GUESS_RPS = 4.0

#: Sends a request table open loop: (requests, start epoch, time scale, seed) -> load generator rows.
Send = Callable[[pd.DataFrame, float, float, int], pd.DataFrame]


def first_guess_rps(profile: ServerProfile | None, mix: pd.DataFrame) -> float:
    """Requests/s a full batch decoding the mix's mean output would sustain, by the profile's inter-token latency."""
    if profile is None or not profile.decode(merge=False):
        return DEFAULT_FIRST_GUESS_RPS
    widest = max(profile.decode(merge=False), key=lambda r: r.concurrency)
    per_request_s = float(widest.itl_ms or 0.0) / 1000.0 * float(mix["output_tokens"].mean())
    return widest.concurrency / per_request_s if per_request_s > 0 else DEFAULT_FIRST_GUESS_RPS


def measure_load(params: Params, root: Path, regime: str, profile: ServerProfile | None, send: Send) -> RegimeLoad:
    """The regime's capacity, time scale and noise probe on the real server (`syncsafe.serving.capacity`)."""
    cfg = params.replay.vllm
    tables = [read_requests(root, regime, seed) for seed in params.seeds]
    mix = token_mix(tables)
    seed = params.seeds[0]
    sender = lambda t, epoch: send(t, epoch, 1.0, seed)  # noqa: E731
    knee, bound, probes = search_capacity(sender, mix, first_guess_rps(profile, mix), cfg.capacity_probe_s,
                                          cfg.capacity_ttft_factor, seed)
    capacity, confirmations = confirm_capacity(sender, mix, knee, probes[0].rate_rps, cfg.capacity_probe_s, bound,
                                               seed)
    probes = [*probes, *confirmations]
    shape = load_shape([t["arrival_s"].to_numpy(dtype=float) for t in tables], params.merge.window_s,
                       params.regimes[regime].duration_s)
    scale, peak_u, median_u = load_scale(regime, capacity, shape, cfg.target_utilisation, cfg.time_scale)
    noise = noise_probe(lambda t, epoch: send(t, epoch, 1.0, seed), shape.peak_rate * scale, cfg.capacity_probe_s,
                        mix, seed)
    return RegimeLoad(
        regime=regime, capacity_rps=capacity, ttft_bound_ms=bound, probes=probes, peak_rate=shape.peak_rate,
        median_rate=shape.median_rate, window_s=params.merge.window_s, time_scale=scale,
        time_scale_fixed=cfg.time_scale is not None, target_utilisation=cfg.target_utilisation,
        utilisation=peak_u, median_utilisation=median_u, noise_log_ratios=noise,
    )  # fmt: skip


def seed_inputs(root: Path, index: pd.DataFrame, regime: str, seed: int, controllers: list[str]) -> SeedInputs:
    """The planned seed's requests, timeline, controller schedules and no-sync schedule."""
    rows = index[(index["regime"] == regime) & (index["seed"] == seed)]
    found = {}
    for name in controllers:
        row = rows[(rows["policy"] == name) & rows["source"].isin(["train", "harness"])]
        if row.empty:
            raise BadInput(f"replay.vllm: controller {name!r} has no schedule for {regime} seed {seed} in "
                           f"{layout.SCHEDULE_INDEX.as_posix()} (is it in control.policies?)")
        found[name] = read_schedule(layout.at(root, row.iloc[0]["path"]))
    no_sync = rows[rows["source"] == "no_sync"]
    if no_sync.empty:
        raise BadInput(f"{layout.SCHEDULE_INDEX.as_posix()}: no no_sync schedule for {regime} seed {seed}")
    return SeedInputs(seed, read_requests(root, regime, seed), read_timeline(root, regime, seed), found,
                      read_schedule(layout.at(root, no_sync.iloc[0]["path"])))


def plan_real_arm(params: Params, root: Path, index: pd.DataFrame, profile: ServerProfile | None,
                  placement: CpuPlacement, send: Send) -> RealPlan:
    """Loads measured, plan sized (see the module docstring); its summary printed."""
    cfg = params.replay.vllm
    fit, held = vllm_seed_split(params)
    controllers = vllm_controllers(params)
    prior = profile_prior(profile, Calibration())[0] if profile is not None else Calibration()
    threshold = params.analysis.gate_ratio_threshold
    loads: dict[str, RegimeLoad] = {}
    designs: dict[str, RegimeDesign] = {}
    for regime in vllm_regimes(params):
        tqdm.write(f"replay vllm: measuring the server's capacity for {regime}")
        load = measure_load(params, root, regime, profile, send)
        loads[regime] = load
        designs[regime] = RegimeDesign(
            regime=regime, seeds=[seed_inputs(root, index, regime, s, controllers) for s in fit + held],
            space=ActionSpace.of_params(params, regime), time_scale=load.time_scale, prior=prior,
            noise_log_ratios=np.asarray(load.noise_log_ratios), controls=cfg.no_sync_controls,
            min_requests=cfg.min_requests, min_merge_active=cfg.min_merge_active,
        )  # fmt: skip
    sized = size_plans(designs, controllers, cfg.budget_s, threshold, cfg.power_target, cfg.draws, cfg.span_s)
    regimes = {}
    for regime, s in sized.regimes.items():
        regimes[regime] = RegimePlan(
            regime=regime, time_scale=loads[regime].time_scale, span_s=s.span_s, fit_seeds=fit, held_out_seeds=held,
            controllers=s.controllers, draws=s.draws, controls=cfg.no_sync_controls, power=s.power.power,
            expected_gate_ratio=s.power.expected_gate if np.isfinite(s.power.log_gate) else None,
            expected_merge_active=s.power.n_pairs, expected_wall_s=s.wall_s,
            left_out=[c for c in controllers if c not in s.controllers],
        )  # fmt: skip
    plan = RealPlan(regimes=regimes, loads=loads, placement=placement.record(), budget_s=cfg.budget_s,
                    power_target=cfg.power_target, gate_ratio_threshold=threshold, left_out=sized.left_out)
    for line in describe_plan(plan):
        tqdm.write(f"replay vllm: {line}")
    return plan


def describe_plan(plan: RealPlan) -> list[str]:
    """One line per regime: load, span, what is replayed, and the gate's planned power."""
    lines = []
    for regime, p in plan.regimes.items():
        load = plan.loads.get(regime)
        loaded = (f"capacity {load.capacity_rps:.3g} req/s, busiest window at {load.utilisation:.0%}"
                  if load is not None else "load not measured")
        powered = "powered" if (p.power or 0.0) >= plan.power_target else "UNDERPOWERED"
        lines.append(
            f"{regime}: {loaded}, time scale {p.time_scale:.3g}, span [0, {p.span_s:g}) s, seeds {p.seeds}, "
            f"{', '.join(p.controllers)} with {p.draws} span-matched draws, {p.controls} no-sync controls: "
            f"{p.replays_per_seed * len(p.seeds)} replays, about {p.expected_wall_s:.0f} s; gate power "
            f"{(p.power or 0.0):.0%} at the profiled effect (expected ratio {p.expected_gate_ratio or float('nan'):.3g}, "
            f"threshold {plan.gate_ratio_threshold:g}): {powered}"
            + (f"; left out for the budget: {', '.join(p.left_out)}" if p.left_out else ""))
    lines += [f"{regime}: not replayed: {why}" for regime, why in plan.left_out.items()]
    return lines
