"""The real arm's plan: which schedules the vLLM server replays, over which span, at which load, in which order.

Per regime of `replay.vllm.regimes` (`RegimePlan`, all of them in
`plan.json` of the vLLM replay set, `RealPlan`):

- **Seeds**: `fit_seeds` (the calibrate-fit stage; by default half the
  replayed seeds, two at least once one is left to hold out) and
  `held_out_seeds` (the fidelity stage), never overlapping.
- **Controllers**: the declared primary (`analysis.primary.policy`) first,
  then `replay.vllm.policies` in their order, as far as the budget allows
  (`syncsafe.realarm.sizing`).
- **Span**: every replay covers trace seconds [0, span_s); each controller's
  `draws` matched-random draws are drawn from its action space with its
  merge count *and* its count inside the span (`syncsafe.schedules.span`),
  so controller and draws work the same merge budget where the server sees
  them.
- **Load**: trace time runs `time_scale` times faster than wall time, set
  from the server's measured capacity so that the busiest window runs at
  `target_utilisation` (`syncsafe.realarm.capacity`); the simulator replays
  of the regime run at the same time scale.
- **References in the span**: per controller, its span-matched draws and
  one evenly spaced schedule with the same counts (`span_cadence`), so the
  real replays alone can be judged against matched random and the fixed
  cadence.
- **Order** (`block_order`): one block per (regime, seed), the campaign's
  unit (`syncsafe.realarm.blocks`: a finished block is kept, a stopped
  campaign replays only the blocks it lacks). A block holds its seed's
  no-sync controls and every other replay of the seed, dealt into
  `controls` rounds: each round one control and a share of the replays with
  merges (round-robin from a seeded shuffle), in a seeded order. The seeds'
  blocks run in a seeded order too. Schedule kind and time (the server's
  warm-up drift, its wander) are then not confounded inside a seed, where
  every comparison is made: the gate compares each replay with its nearest
  controls of the same seed; the SLO comes from all of a seed's controls
  pooled; the real-only rows compare a seed's controller with its draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pydantic import BaseModel, ConfigDict, Field

from syncsafe.artifacts.calibration import read_vllm_plan
from syncsafe.config import Params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.span import SpanCount, even_in_span, sample_in_span, span_count
from syncsafe.realarm.capacity import RegimeLoad
from syncsafe.realarm.warmup import WarmupRecord
from syncsafe.traces.timeline import regime_rng

#: Seeds replayed when replay.vllm.seeds is null: one to fit, one held out (`default_fit_count`): the default
#: real arm's gate, fit, fidelity and real-only row within its budget; two seeds cannot bring the exact rank test
#: below alpha (its smallest p with one draw is 2^-2), so the real-only row states it is underpowered. The
#: powered profile replays four.
DEFAULT_N_SEEDS = 2
ORDER_STREAM = "vllm-replay-order"
SPAN_DRAW_STREAM = "vllm-span-draw"


class RegimePlan(BaseModel):
    """What the real arm replays of one regime (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regime: str
    time_scale: float = Field(gt=0)
    span_s: float = Field(gt=0)
    fit_seeds: list[int]
    held_out_seeds: list[int]
    controllers: list[str] = Field(min_length=1)
    draws: int = Field(ge=1)
    controls: int = Field(ge=1)
    #: Planned chance that the mechanism gate passes at the profiled effect, and what it rests on.
    power: float | None = None
    expected_gate_ratio: float | None = None
    expected_merge_active: int | None = None
    expected_wall_s: float = Field(ge=0)
    #: Controllers of replay.vllm.policies the budget left out.
    left_out: list[str] = Field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return [*self.fit_seeds, *self.held_out_seeds]

    @property
    def replays_per_seed(self) -> int:
        return replays_per_seed(self.controls, len(self.controllers), self.draws)


class RealPlan(BaseModel):
    """plan.json of the vLLM replay set: every regime's plan and load, and what the plan was sized for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regimes: dict[str, RegimePlan] = Field(default_factory=dict)
    loads: dict[str, RegimeLoad] = Field(default_factory=dict)
    placement: dict[str, object] = Field(default_factory=dict)
    budget_s: float = Field(default=0.0, ge=0)
    power_target: float = Field(default=0.8, gt=0, le=1)
    gate_ratio_threshold: float = Field(default=1.05, gt=0)
    #: Regimes of `replay.vllm.regimes` the plan does not replay, and why (the budget, no informative span).
    left_out: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    #: What the warm-up before the plan measured (`syncsafe.realarm.warmup`); None when switched off.
    warmup: WarmupRecord | None = None

    def time_scale(self, regime: str) -> float:
        """The regime's replay time scale; 1 (the trace as given) for a regime the real arm did not measure."""
        plan = self.regimes.get(regime)
        return plan.time_scale if plan is not None else 1.0


def replays_per_seed(controls: int, controllers: int, draws: int) -> int:
    """No-sync controls, then per controller: itself, its span-matched draws and its span cadence."""
    return controls + controllers * (2 + draws)


def vllm_regimes(params: Params) -> list[str]:
    """The regimes the real arm plans, the declared primary's regime first: it is always in the plan."""
    first = params.analysis.primary.regime
    return [first, *(r for r in params.replay.vllm.regimes if r != first)]


#: Declared wall seconds of a real-arm stage besides its probes and replays: server start (and, for the
#: profile, the engine profile); probes per regime of the profile's capacity search and noise probe.
DECLARED_START_S = 90.0
DECLARED_PROBES_PER_REGIME = 14


def declared_profile_wall_s(params: Params) -> float:
    """What the profile-vllm stage declares it takes: start and engine profile, the warm-up's limit and every
    regime's probes (what `syncsafe run` shows as time left before it was ever timed)."""
    cfg = params.replay.vllm
    probes = len(vllm_regimes(params)) * DECLARED_PROBES_PER_REGIME * (cfg.capacity_probe_s + 1.0)
    return DECLARED_START_S + cfg.warmup_max_s + probes


def declared_wall_s(params: Params) -> float:
    """What the replay-vllm stage declares it takes: start, the warm-up's limit and the replays' budget."""
    cfg = params.replay.vllm
    return DECLARED_START_S + cfg.warmup_max_s + cfg.budget_s


def vllm_controllers(params: Params) -> list[str]:
    """Controllers the vLLM replay may cover: the declared primary first, then `replay.vllm.policies`."""
    out = [params.analysis.primary.policy]
    for policy in params.replay.vllm.policies or []:
        if policy not in out:
            out.append(policy)
    return out


def vllm_seeds(params: Params) -> list[int]:
    cfg = params.replay.vllm
    return list(cfg.seeds) if cfg.seeds else list(params.seeds[:DEFAULT_N_SEEDS])


def default_fit_count(n_seeds: int) -> int:
    """Fit seeds when params name none: half the replayed seeds, but two as soon as one is left to hold out
    (one seed's replays would fit the server's noise on that seed), and one when there is only one."""
    return max(1, min(2, n_seeds - 1), n_seeds // 2)


def vllm_seed_split(params: Params) -> tuple[list[int], list[int]]:
    """(fit seeds, held-out seeds) of the vLLM replay (see the module docstring)."""
    cfg = params.replay.vllm
    seeds = vllm_seeds(params)
    fit = list(cfg.fit_seeds) if cfg.fit_seeds else seeds[:default_fit_count(len(seeds))]
    held = list(cfg.held_out_seeds) if cfg.held_out_seeds is not None else [s for s in seeds if s not in fit]
    return fit, [s for s in held if s not in fit]


def span_draws(controller: Schedule, space: ActionSpace, span_s: float, draws: int) -> list[Schedule]:
    """`draws` matched-random schedules of `controller` with its count inside [0, span_s) (seeded per draw)."""
    target = span_count(controller.merge_starts_s, controller.window_s, span_s)
    out = []
    for draw in range(draws):
        rng = regime_rng(controller.regime, controller.seed, f"{SPAN_DRAW_STREAM}/{controller.policy}/{span_s:g}/{draw}")
        starts = sample_in_span(space, controller.n_merges, span_s, target, rng)
        out.append(controller.model_copy(update={"policy": "matched_random", "source": "matched_random", "draw": draw,
                                                 "matched_to": controller.policy, "merge_starts_s": starts}))
    return out


def check_span_budget(controller: Schedule, draw: Schedule, span_s: float) -> None:
    """ValueError unless `draw` has `controller`'s merge count and its count inside [0, span_s)."""
    mine, theirs = (span_count(s.merge_starts_s, s.window_s, span_s) for s in (controller, draw))
    if draw.n_merges != controller.n_merges or mine != theirs:
        raise ValueError(f"{draw.regime}/seed-{draw.seed}: draw {draw.draw} of {controller.policy} is not "
                         f"budget-matched in the span [0, {span_s:g}) s: {theirs.describe()} of {draw.n_merges} "
                         f"against the controller's {mine.describe()} of {controller.n_merges}")


def span_cadence(controller: Schedule, space: ActionSpace, span_s: float) -> Schedule:
    """The controller's counts in [0, span_s) and in total, evenly spaced (`schedules.span.even_in_span`)."""
    target = span_count(controller.merge_starts_s, controller.window_s, span_s)
    starts = even_in_span(space, controller.n_merges, span_s, target)
    return controller.model_copy(update={"policy": "even_cadence", "source": "even_cadence", "draw": None,
                                         "matched_to": controller.policy, "merge_starts_s": starts})


@dataclass(frozen=True)
class OrderedReplay:
    """One replay of the real plan in order: its seed (its block), schedule row, no-sync control number (None
    for a replay with merges) and round inside the block."""

    seed: int
    row: pd.Series
    control: int | None
    round: int


def seed_block(regime: str, seed: int, rows: list[pd.Series], rounds: int) -> list[OrderedReplay]:
    """One seed's block: its replays dealt into `rounds` rounds, each with one no-sync control (the module
    docstring); seeded per regime, seed and round."""
    no_sync = [r for r in rows if r["source"] == "no_sync"]
    if len(no_sync) != 1:
        raise ValueError(f"{regime} seed {seed}: expected one no_sync schedule, found {len(no_sync)}")
    rest = sorted((r for r in rows if r["source"] != "no_sync"), key=lambda r: str(r["path"]))
    per_round: list[list[OrderedReplay]] = [[OrderedReplay(seed, no_sync[0], k, k)] for k in range(rounds)]
    for i, j in enumerate(np.asarray(regime_rng(regime, seed, ORDER_STREAM).permutation(len(rest)))):
        per_round[i % rounds].append(OrderedReplay(seed, rest[int(j)], None, i % rounds))
    ordered: list[OrderedReplay] = []
    for k, items in enumerate(per_round):
        perm = regime_rng(regime, seed, f"{ORDER_STREAM}/round-{k}").permutation(len(items))
        ordered += [items[int(i)] for i in np.asarray(perm)]
    return ordered


def block_order(regime: str, rows_by_seed: dict[int, list[pd.Series]], rounds: int) -> list[OrderedReplay]:
    """Every seed's block (`seed_block`), the blocks in a seeded order per regime."""
    if rounds < 1:
        raise ValueError(f"{regime}: a replay order needs at least one round (got {rounds})")
    seeds = sorted(rows_by_seed)
    order = np.asarray(regime_rng(regime, 0, f"{ORDER_STREAM}/blocks").permutation(len(seeds)))
    return [o for k in order for o in seed_block(regime, seeds[int(k)], rows_by_seed[seeds[int(k)]], rounds)]


def nearest_controls(position: int, control_positions: dict[int, int]) -> list[int]:
    """Controls (their numbers) ordered by distance in replay order from `position`, the earlier first on a tie."""
    return sorted(control_positions, key=lambda c: (abs(control_positions[c] - position), control_positions[c]))


def simulator_time_scale(root: Path, regime: str) -> float:
    """The time scale the real arm replayed `regime` at (its `plan.json`): the simulator replays the regime at
    the same load; 1, the trace as given, without a plan."""
    plan = read_vllm_plan(root, RealPlan)
    return plan.time_scale(regime) if plan is not None else 1.0


__all__ = ["DEFAULT_N_SEEDS", "declared_profile_wall_s", "declared_wall_s", "OrderedReplay", "RealPlan", "RegimePlan", "SpanCount", "block_order",
           "check_span_budget", "nearest_controls", "replays_per_seed", "seed_block", "simulator_time_scale", "span_cadence",
           "span_draws", "vllm_controllers", "vllm_regimes", "vllm_seed_split", "vllm_seeds"]
