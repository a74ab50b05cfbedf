"""Size the real arm's plan from params and the server profile (before any replay): a pure function.

For every regime of `replay.vllm.regimes`, the declared primary's first
(`design.vllm_regimes`), the server profile (`server_profile`, its own
stage) holds the measured load: the capacity's lower bound for the regime's
token mix, the time scale, and the noise probe. Where params pin the time
scale and span (`replay.vllm.time_scale`, `span_s`: the default), the plan
is the same on every machine and the profile only checks it: a capacity
that cannot hold the pinned time scale at the target utilisation is refused
here too, before any replay (`check_pinned_load`). The plan
(`syncsafe.realarm.sizing`) comes from those loads, the planned seeds'
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
from syncsafe.realarm.capacity import LoadShape, RegimeLoad, load_scale
from syncsafe.realarm.engine_profile import ServerProfile, profile_prior
from syncsafe.realarm.sizing import RegimeDesign, SeedInputs, size_plans
from syncsafe.realarm.evidence import drift_min_p
from syncsafe.realarm.design import RealPlan, RegimePlan, vllm_controllers, vllm_regimes, vllm_seed_split

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


def check_pinned_load(params: Params, load: RegimeLoad) -> None:
    """LoadError (one line naming the largest time scale it holds) when the profiled capacity cannot hold the
    regime's pinned time scale at the target utilisation; BadInput when the profile measured another one."""
    cfg = params.replay.vllm
    pinned = cfg.pinned_time_scale(load.regime)
    if pinned is None:
        return
    if load.time_scale != pinned:
        raise BadInput(f"{layout.VLLM_SERVER_FILE.as_posix()}: {load.regime} was profiled at time scale "
                       f"{load.time_scale:g}, replay.vllm.time_scale pins {pinned:g}; rerun the profile-vllm stage")
    load_scale(load.regime, load.capacity_rps, LoadShape(load.peak_rate, load.median_rate), cfg.target_utilisation,
               pinned)


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
        check_pinned_load(params, load)
        designs[regime] = RegimeDesign(
            regime=regime, seeds=[seed_inputs(root, index, regime, s, controllers) for s in fit + held],
            space=ActionSpace.of_params(params, regime), time_scale=load.time_scale, prior=prior,
            noise_log_ratios=np.asarray(load.noise_log_ratios), controls=cfg.no_sync_controls,
            min_requests=cfg.min_requests, min_merge_active=cfg.min_merge_active, replay_sd=cfg.replay_sd,
        )  # fmt: skip
    pinned_spans = {r: span for r in designs if (span := cfg.pinned_span_s(r)) is not None}
    sized = size_plans(designs, controllers, cfg.budget_s, threshold, cfg.power_target, cfg.draws, pinned_spans,
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
    """One line per regime: load, span, what is replayed, the gate's planned power, and the smallest p its
    controls' drift test can reach (`evidence.controls_drift`: not below control_alpha, no drift can be
    shown)."""
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
            f"threshold {plan.gate_ratio_threshold:g}): {powered}; the drift test's smallest attainable p "
            f"{drift_min_p([p.controls] * len(p.seeds)):.2g}"
            + (f"; left out (no span the budget pays for measures them): {', '.join(p.left_out)}"
               if p.left_out else ""))
    lines += [f"{regime}: not replayed: {why}" for regime, why in plan.left_out.items()]
    return lines


def size_from_profile(params: Params, root: Path, budget_s: float | None = None) -> RealPlan:
    """The plan `syncsafe real-arm plan` proposes to pin: every regime's time scale sized from this machine's
    profiled capacity (the largest on the coarse grid at the target utilisation) and its span sized by the gate's
    power within `budget_s` (default `replay.vllm.budget_s`), whatever params pin now. A tool a user runs on
    purpose on the slowest machine the plan must hold on; the run itself never sizes from a profile it pinned.
    The noise probe is the one the profile took (at the pinned rate when params pinned one)."""
    from syncsafe.artifacts.base import read_model
    from syncsafe.artifacts.calibration import read_server_profile
    from syncsafe.artifacts.schedule_sets import read_schedule_index
    from syncsafe.realarm.server_profile import HINT, MeasuredServer

    cfg = params.replay.vllm
    unpinned = cfg.model_copy(update={"time_scale": None, "span_s": None, "budget_s": budget_s or cfg.budget_s})
    sized_params = params.model_copy(update={"replay": params.replay.model_copy(update={"vllm": unpinned})})
    measured = read_model(layout.at(root, layout.VLLM_SERVER_FILE), MeasuredServer, "server profile", hint=HINT)
    loads = {}
    for regime in vllm_regimes(params):
        load = measured.loads.get(regime)
        if load is None:
            raise BadInput(f"{layout.VLLM_SERVER_FILE.as_posix()}: no load measured for regime {regime}; {HINT}")
        if load.time_scale_fixed:  # its capacity is the pinned need, confirmed: a lower bound, not the knee
            raise BadInput(f"{layout.VLLM_SERVER_FILE.as_posix()}: {regime}'s capacity was only checked at its pinned "
                           f"time scale {load.time_scale:g} (at least {load.capacity_rps:.3g} requests/s); to size a "
                           f"pin, profile with replay.vllm.time_scale {{{regime}: null}} (`syncsafe run --redo "
                           "profile-vllm`), which searches the capacity's knee")
        scale, peak_u, median_u = load_scale(regime, load.capacity_rps, LoadShape(load.peak_rate, load.median_rate),
                                             cfg.target_utilisation, None)
        loads[regime] = load.model_copy(update={"time_scale": scale, "time_scale_fixed": False, "utilisation": peak_u,
                                                "median_utilisation": median_u})
    return plan_real_arm(sized_params, root, read_schedule_index(root), loads, read_server_profile(root, ServerProfile),
                         measured.placement)


def pinned_params(plan: RealPlan) -> dict[str, dict[str, float]]:
    """The `replay.vllm` keys that pin `plan`: per regime its time scale and span."""
    return {"time_scale": {r: p.time_scale for r, p in plan.regimes.items()},
            "span_s": {r: p.span_s for r, p in plan.regimes.items()}}
