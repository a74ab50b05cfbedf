"""Size the real arm's plan so that its mechanism gate is powered, within its wall-clock budget.

Before any real replay, for a candidate plan of a regime (controllers, span
`span_s`) the planned replays are simulated: every seed's no-sync schedule
and each controller with its span-matched draws (the very draws the replay
will use), on the regime's requests cut to the span, at the regime's time
scale, with the server's profiled costs (`engine_profile.profile_prior`: the
iteration costs and the merge's compute share measured by the engine
profile). That gives the merge-active requests the gate will see and their
expected slowdown. Per-request noise comes from the noise probe of the
capacity measurement (two identical no-merge probes): each synthetic
realisation multiplies every latency by a draw of it. `gate.gate_power`
turns the realisations into the chance that the gate passes.

Sizing (`size_plans`), per regime on a grid of spans (quarter control
cycles): the shortest span whose power reaches `power_target` and in which the
primary controller merges on every planned seed where its draws could
place that merge differently (else that seed's real controller-minus-random
compares a replay with itself), with as many draws as fit; then the controllers of `replay.vllm.policies`, in
order, while the regimes' planned wall time (replays x (span / time_scale +
`OVERHEAD_S`)) fits `budget_s`; what is left of the budget then lengthens
every span alike. When nothing powered fits, the primary with one draw gets
the longest spans the budget allows, and its plan says how much power that
buys (the gate will then report *underpowered* when it does not pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncsafe.control.serving_model import Calibration
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.serving.gate import GatePairs, GatePower, block_ids, gate_power, merge_active
from syncsafe.serving.simulator import simulate_at_time_scale
from syncsafe.schedules.span import placements_in_span, span_count
from syncsafe.serving.vllm_plan import span_draws

#: Wall seconds a replay takes beyond its span: the lead before the first arrival, the drain after the last.
OVERHEAD_S = 1.25
#: Synthetic realisations per power estimate; block length of the gate (trace seconds).
REALISATIONS = 32
BLOCK_S = 10.0
#: Candidate spans per control cycle.
GRID_PER_CYCLE = 4
#: Per-request log noise assumed when the noise probe measured none.
DEFAULT_NOISE_SD = 0.1


@dataclass(frozen=True)
class SeedInputs:
    """One planned seed: its request table, load timeline, controller schedules and no-sync schedule."""

    seed: int
    requests: pd.DataFrame
    timeline: pd.DataFrame
    controllers: dict[str, Schedule]
    no_sync: Schedule


@dataclass(frozen=True)
class RegimeDesign:
    """What a regime's plan is sized from (see the module docstring)."""

    regime: str
    seeds: list[SeedInputs]
    space: ActionSpace
    time_scale: float
    prior: Calibration
    noise_log_ratios: np.ndarray
    controls: int


def _cut(schedule: Schedule, span_s: float) -> Schedule:
    return schedule.model_copy(update={"merge_starts_s": [s for s in schedule.merge_starts_s if s < span_s]})


def expected_pairs(design: RegimeDesign, controllers: list[str], span_s: float, draws: int) -> GatePairs:
    """Noise-free gate pairs of the planned replays: simulated latency with merges (`mine`) and without
    (`twin`, also `other`), of the requests the gate will count as merge-active."""
    parts = []
    for index, seed in enumerate(design.seeds):
        requests = seed.requests[seed.requests["arrival_s"] < span_s].reset_index(drop=True)
        if requests.empty:
            continue
        sim = lambda s: simulate_at_time_scale(  # noqa: E731
            requests, seed.timeline, _cut(s, span_s), design.prior, seed.seed, design.time_scale)
        twin = sim(seed.no_sync)
        twin_e2e = twin["e2e_ms"].to_numpy(dtype=float)
        arrival = twin["arrival_s"].to_numpy(dtype=float)
        life_s = float(np.median(twin_e2e)) / 1000.0 * design.time_scale
        for name in controllers:
            controller = seed.controllers[name]
            for schedule in [controller, *span_draws(controller, design.space, span_s, draws)]:
                active = merge_active(_cut(schedule, span_s), arrival, life_s)
                if not active.any():
                    continue
                mine = sim(schedule)["e2e_ms"].to_numpy(dtype=float)
                parts.append(GatePairs(mine[active], twin_e2e[active], twin_e2e[active],
                                       block_ids(index, arrival[active], BLOCK_S)))
    return GatePairs.concat(parts)


def realisations(pairs: GatePairs, noise_log_ratios: np.ndarray, n: int, seed: int) -> list[GatePairs]:
    """`n` noisy copies of `pairs`: every latency times exp(a draw of the noise / sqrt 2), so that two
    controls of the same request differ as the noise probe's two runs did."""
    rng = np.random.default_rng([seed, 0x9A1E])
    noise = np.asarray(noise_log_ratios, dtype=float)
    if noise.size < 2:
        noise = rng.normal(0.0, DEFAULT_NOISE_SD * math.sqrt(2.0), 1000)
    out = []
    for _ in range(n):
        a, b, c = (np.exp(rng.choice(noise, pairs.size) / math.sqrt(2.0)) for _ in range(3))
        out.append(GatePairs(pairs.mine * c, pairs.twin * a, pairs.other * b, pairs.block))
    return out


def plan_power(design: RegimeDesign, controllers: list[str], span_s: float, draws: int, threshold: float
               ) -> GatePower:
    pairs = expected_pairs(design, controllers, span_s, draws)
    if pairs.size == 0:
        return GatePower(power=0.0, log_gate=float("nan"), sd=float("nan"), margin=float("nan"), n_pairs=0)
    return gate_power(realisations(pairs, design.noise_log_ratios, REALISATIONS, seed=len(controllers)), threshold)


def wall_s(design: RegimeDesign, n_controllers: int, draws: int, span_s: float) -> float:
    """Planned wall seconds of a regime's replays."""
    per_seed = design.controls + n_controllers * (1 + draws)
    return len(design.seeds) * per_seed * (span_s / design.time_scale + OVERHEAD_S)


def informative(design: RegimeDesign, controller: str, span_s: float) -> bool:
    """True when on every planned seed where `controller` merges at all, its span holds a merge and its
    span-matched draws can place it differently (`placements_in_span` >= 2): otherwise that seed's real
    controller-minus-random compares a replay with itself."""
    for seed in design.seeds:
        schedule = seed.controllers[controller]
        if not schedule.merge_starts_s:
            continue
        target = span_count(schedule.merge_starts_s, schedule.window_s, span_s)
        if target.merges == 0 or placements_in_span(design.space, schedule.n_merges, span_s, target) < 2:
            return False
    return True


@dataclass(frozen=True)
class SizedRegime:
    controllers: list[str]
    draws: int
    span_s: float
    power: GatePower
    wall_s: float


def _grid(design: RegimeDesign) -> list[float]:
    """Candidate spans: every quarter control cycle up to the regime's duration."""
    step = design.space.cycle_s / GRID_PER_CYCLE
    return [round(step * i, 6) for i in range(1, int(design.space.duration_s // step + 1e-9) + 1)]


def _shortest_powered(power_at: Callable[[float], GatePower], grid: list[float], target: float) -> float | None:
    """The shortest span of `grid` whose power reaches `target` (bisection: power grows with the span)."""
    if power_at(grid[-1]).power < target:
        return None
    lo, hi = -1, len(grid) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_at(grid[mid]).power >= target:
            hi = mid
        else:
            lo = mid
    return grid[hi]


def size_plans(designs: dict[str, RegimeDesign], controllers: list[str], budget_s: float, threshold: float,
               power_target: float, max_draws: int, fixed_span_s: float | None = None) -> dict[str, SizedRegime]:
    """Controllers, draws and span per regime, in this order of priority (see the module docstring):

    1. the primary controller, powered, on spans where its real comparison with random carries
       information on every planned seed (`informative`), with as many draws (up to `max_draws`)
       as the budget allows;
    2. the further controllers, in order, while the budget allows;
    3. what is left of the budget lengthens every span alike.
    Without a plan that fits, the primary alone with one draw gets the longest spans the budget allows
    (informative or not: the budget is a limit, and the plan's power then says what it buys).
    """
    cache: dict[tuple[str, int, int, float], GatePower] = {}

    def power(regime: str, n: int, draws: int, span: float) -> GatePower:
        key = (regime, n, draws, span)
        if key not in cache:
            cache[key] = plan_power(designs[regime], controllers[:n], span, draws, threshold)
        return cache[key]

    def total(spans: dict[str, float], n: int, draws: int) -> float:
        return sum(wall_s(designs[r], n, draws, spans[r]) for r in designs)

    # candidate spans: where the primary's real comparison with random carries information (else all)
    grids = {r: [g for g in _grid(d) if informative(d, controllers[0], g)] or _grid(d) for r, d in designs.items()}

    def shortest(n: int, draws: int) -> dict[str, float] | None:
        if fixed_span_s is not None:
            return {r: min(fixed_span_s, d.space.duration_s) for r, d in designs.items()}
        out = {}
        for r in designs:
            found = _shortest_powered(lambda s, r=r: power(r, n, draws, s), grids[r], power_target)
            if found is None:
                return None
            out[r] = found
        return out

    chosen: tuple[int, int, dict[str, float]] | None = None
    for draws in range(max_draws, 0, -1):
        spans = shortest(1, draws)
        if spans is not None and total(spans, 1, draws) <= budget_s:
            chosen = (1, draws, spans)
            break
    if chosen is not None:
        n_chosen, draws, spans = chosen
        for n in range(2, len(controllers) + 1):
            more = shortest(n, draws)
            if more is None or total(more, n, draws) > budget_s:
                break
            n_chosen, spans = n, more
        if fixed_span_s is None:
            spans = _fill_budget(designs, grids, n_chosen, draws, spans, budget_s)
    else:  # nothing powered fits: the primary with one draw, any span, as long as the budget allows
        n_chosen, draws = 1, 1
        every = {r: _grid(d) for r, d in designs.items()}
        spans = shortest(1, 1) if fixed_span_s is not None else _fill_budget(designs, every, 1, 1, {}, budget_s)
        assert spans is not None
    return {r: SizedRegime(controllers[:n_chosen], draws, spans[r], power(r, n_chosen, draws, spans[r]),
                           wall_s(designs[r], n_chosen, draws, spans[r])) for r in designs}


def _fill_budget(designs: dict[str, RegimeDesign], grids: dict[str, list[float]], n: int, draws: int,
                 spans: dict[str, float], budget_s: float) -> dict[str, float]:
    """Every span scaled alike (onto its regime's candidate spans) as far as the budget allows: lengthened
    from the powered spans, shortened when they do not fit, and from the longest candidate when none is powered."""
    start = {r: spans.get(r, grids[r][-1]) for r in designs}
    best = {r: grids[r][0] for r in designs}
    for factor in np.geomspace(0.01, 50.0, 600):
        trial = {}
        for r in designs:
            fitting = [g for g in grids[r] if g <= start[r] * factor + 1e-9]
            trial[r] = fitting[-1] if fitting else grids[r][0]
        if sum(wall_s(designs[r], n, draws, trial[r]) for r in designs) > budget_s:
            break
        best = trial
    return best
