"""Size the real arm's plan from params and the server profile (before any replay): a pure function.

For every regime of `replay.vllm.regimes`, the declared primary's first
(`vllm_plan.vllm_regimes`), the server profile (`server_profile`, its own
stage) holds the measured load: the capacity's lower bound for the regime's
token mix, the time scale on the coarse grid, and the noise probe. The plan
(`syncsafe.serving.plan_sizing`) comes from those loads, the planned seeds'
requests, timelines and controller schedules, and the engine profile's
iteration costs and merge share; nothing here touches the server, so the
same params and profile give the same plan. The result is the `RealPlan`
the replay stage writes to `plan.json` and prints.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from syncsafe.artifacts import layout
from syncsafe.artifacts.traces import read_requests, read_timeline
from syncsafe.config import Params
from syncsafe.control.serving_model import Calibration
from syncsafe.errors import BadInput
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import read_schedule
from syncsafe.serving.capacity import RegimeLoad
from syncsafe.serving.engine_profile import ServerProfile, profile_prior
from syncsafe.serving.plan_sizing import RegimeDesign, SeedInputs, size_plans
from syncsafe.serving.vllm_plan import RealPlan, RegimePlan, vllm_controllers, vllm_regimes, vllm_seed_split

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


def plan_real_arm(params: Params, root: Path, index: pd.DataFrame, loads: dict[str, RegimeLoad],
                  profile: ServerProfile | None, placement: dict[str, object]) -> RealPlan:
    """The plan sized from the profiled `loads` and engine `profile` (see the module docstring)."""
    cfg = params.replay.vllm
    fit, held = vllm_seed_split(params)
    controllers = vllm_controllers(params)
    prior = profile_prior(profile, Calibration())[0] if profile is not None else Calibration()
    threshold = params.analysis.gate_ratio_threshold
    designs: dict[str, RegimeDesign] = {}
    for regime in vllm_regimes(params):
        load = loads[regime]
        designs[regime] = RegimeDesign(
            regime=regime, seeds=[seed_inputs(root, index, regime, s, controllers) for s in fit + held],
            space=ActionSpace.of_params(params, regime), time_scale=load.time_scale, prior=prior,
            noise_log_ratios=np.asarray(load.noise_log_ratios), controls=cfg.no_sync_controls,
            min_requests=cfg.min_requests, min_merge_active=cfg.min_merge_active,
        )  # fmt: skip
    sized = size_plans(designs, controllers, cfg.budget_s, threshold, cfg.power_target, cfg.draws, cfg.span_s,
                       cfg.fill_budget)
    regimes = {}
    for regime, s in sized.regimes.items():
        regimes[regime] = RegimePlan(
            regime=regime, time_scale=loads[regime].time_scale, span_s=s.span_s, fit_seeds=fit, held_out_seeds=held,
            controllers=s.controllers, draws=s.draws, controls=cfg.no_sync_controls, power=s.power.power,
            expected_gate_ratio=s.power.expected_gate if np.isfinite(s.power.log_gate) else None,
            expected_merge_active=s.power.n_pairs, expected_wall_s=s.wall_s,
            left_out=[c for c in controllers if c not in s.controllers],
        )  # fmt: skip
    return RealPlan(regimes=regimes, loads={r: loads[r] for r in vllm_regimes(params)}, placement=placement,
                    budget_s=cfg.budget_s, power_target=cfg.power_target, gate_ratio_threshold=threshold,
                    left_out=sized.left_out)


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
            + (f"; left out (no span the budget pays for measures them): {', '.join(p.left_out)}"
               if p.left_out else ""))
    lines += [f"{regime}: not replayed: {why}" for regime, why in plan.left_out.items()]
    return lines
