"""The real arm's plan: which schedules the vLLM server replays, over which span, at which load, in which order.

Per regime of `replay.vllm.regimes` (`RegimePlan`, all of them in
`plan.json` of the vLLM replay set, `RealPlan`):

- **Seeds**: `fit_seeds` (the calibrate-fit stage) and `held_out_seeds`
  (the fidelity stage), never overlapping.
- **Controllers**: the declared primary (`analysis.primary.policy`) first,
  then `replay.vllm.policies` in their order, as far as the budget allows
  (`syncsafe.serving.plan_sizing`).
- **Span**: every replay covers trace seconds [0, span_s); each controller's
  `draws` matched-random draws are drawn from its action space with its
  merge count *and* its count inside the span (`syncsafe.schedules.span`),
  so controller and draws work the same merge budget where the server sees
  them.
- **Load**: trace time runs `time_scale` times faster than wall time, set
  from the server's measured capacity so that the busiest window runs at
  `target_utilisation` (`syncsafe.serving.capacity`); the simulator replays
  of the regime run at the same time scale.
- **Order** (`replay_order`): the seed's no-sync schedule `controls` times,
  interleaved: first, evenly between, and last; the other replays in a
  seeded random order between them. The first no-sync replay is the SLO's
  source; the gate compares each replay with its nearest controls.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from syncsafe.config import Params
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.schedules.span import SpanCount, sample_in_span, span_count
from syncsafe.serving.capacity import RegimeLoad
from syncsafe.traces.timeline import regime_rng

#: Seeds replayed when replay.vllm.seeds is null: one to fit, three held out.
DEFAULT_N_SEEDS = 4
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
        return self.controls + len(self.controllers) * (1 + self.draws)


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

    def time_scale(self, regime: str) -> float:
        """The regime's replay time scale; 1 (the trace as given) for a regime the real arm did not measure."""
        plan = self.regimes.get(regime)
        return plan.time_scale if plan is not None else 1.0


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


def vllm_seed_split(params: Params) -> tuple[list[int], list[int]]:
    """(fit seeds, held-out seeds) of the vLLM replay (see the module docstring)."""
    cfg = params.replay.vllm
    seeds = vllm_seeds(params)
    fit = list(cfg.fit_seeds) if cfg.fit_seeds else seeds[:1]
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


def replay_order(regime: str, seed: int, rows: list[pd.Series], controls: int) -> list[tuple[pd.Series, int | None]]:
    """(row, control) in replay order: no-sync `controls` times (first, between, last; `control` counts them),
    the other rows (`control` None) in a seeded random order between them."""
    no_sync = [r for r in rows if r["source"] == "no_sync"]
    if len(no_sync) != 1:
        raise ValueError(f"{regime} seed {seed}: expected one no_sync schedule, found {len(no_sync)}")
    rest = sorted((r for r in rows if r["source"] != "no_sync"), key=lambda r: str(r["path"]))
    perm = regime_rng(regime, seed, ORDER_STREAM).permutation(len(rest))
    shuffled = [rest[int(i)] for i in np.asarray(perm)]
    ordered: list[tuple[pd.Series, int | None]] = [(no_sync[0], 0)]
    if controls == 1:
        return ordered + [(r, None) for r in shuffled]
    cuts = np.linspace(0, len(shuffled), controls).round().astype(int)
    for control in range(1, controls):
        ordered += [(r, None) for r in shuffled[cuts[control - 1]:cuts[control]]]
        ordered.append((no_sync[0], control))
    return ordered


def nearest_controls(position: int, control_positions: dict[int, int]) -> list[int]:
    """Controls (their numbers) ordered by distance in replay order from `position`, the earlier first on a tie."""
    return sorted(control_positions, key=lambda c: (abs(control_positions[c] - position), control_positions[c]))


__all__ = ["DEFAULT_N_SEEDS", "RealPlan", "RegimePlan", "SpanCount", "check_span_budget", "nearest_controls",
           "replay_order", "span_draws", "vllm_controllers", "vllm_seed_split", "vllm_seeds"]
