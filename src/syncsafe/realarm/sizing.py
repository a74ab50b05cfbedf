"""Size the real arm's plan so that its mechanism gate is powered, within its wall-clock budget.

Before any real replay, for a candidate plan of a regime (controllers, span
`span_s`) the planned replays are simulated: every seed's no-sync schedule
and each controller with its span-matched draws and span cadence (the very
schedules the replay will use), on the regime's requests cut to the span, at the regime's time
scale, with the server's profiled costs (`engine_profile.profile_prior`: the
iteration costs and the merge's compute share measured by the engine
profile). That gives the merge-active requests the gate will see and their
expected slowdown. Per-request noise comes from the noise probe of the
capacity measurement (two identical no-merge probes): each synthetic
realisation multiplies every latency by a draw of it, and every replay's
latencies by one replay-level shock at the planned `replay_sd`, the wander
the gate's bounds will carry (`gate.ReplayNoise`, on the plan's control
degrees of freedom). `gate.gate_power` turns the realisations into the
chance that the gate passes.

Sizing (`size_plans`), per regime on a grid of spans (quarter control
cycles): the shortest span whose power reaches `power_target`, in which the
primary controller merges on every planned seed where its draws could
place that merge differently (else that seed's real controller-minus-random
compares a replay with itself), and in which every planned replay meets the
request floor (`floor_met`: at least `min_requests` requests, and at least
`min_merge_active` arriving inside a merge window of each schedule with
merges: enough to estimate a p95 per replay); regimes in order while their planned wall
time (replays x (span / time_scale + `OVERHEAD_S`)) fits `budget_s` (a regime
that does not fit is left out with the reason, never replayed on a span that
cannot measure it), with as many draws as fit; then the controllers of
`replay.vllm.policies`, in order, while the budget allows a span where each
of them is informative and meets the request floor too; what is left of the
budget then lengthens every span alike. The first regime is the declared
primary's (`design.vllm_regimes`): when it has a powered span that the
budget cannot pay for, sizing fails (`PlanError`, naming the budget it
needs) instead of planning without it. When no regime can be powered, the
first regime alone gets the longest informative span the budget allows, and
its plan says how much power that buys (the gate will then report
*underpowered* when it does not pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncsafe.control.serving_model import Calibration
from syncsafe.errors import BadInput
from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import Schedule
from syncsafe.realarm.gate import GatePairs, GatePower, ReplayNoise, block_ids, gate_power, merge_active
from syncsafe.serving.simulator import simulate_at_time_scale
from syncsafe.schedules.span import placements_in_span, span_count
from syncsafe.realarm.design import replays_per_seed, span_cadence, span_draws

#: Wall seconds a replay takes beyond its span: the lead before the first arrival, the drain after the last.
OVERHEAD_S = 1.25
#: Synthetic realisations per power estimate; block length of the gate (trace seconds).
REALISATIONS = 32
BLOCK_S = 10.0
#: Candidate spans per control cycle.
GRID_PER_CYCLE = 4
#: Fewest span-matched draws per controller the plan gives way to (when `replay.vllm.draws` allows as many):
#: with one draw the exact rank test's smallest p over four seeds is 2^-4 = 0.0625, never below alpha 0.05.
MIN_DRAWS = 2
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
    #: The request floor every planned replay must meet (see the module docstring).
    min_requests: int = 0
    min_merge_active: int = 0
    #: The planned replay-level wander of log p95 (`replay.vllm.replay_sd`).
    replay_sd: float = 0.0

    def replay_noise(self) -> ReplayNoise | None:
        """The noise the gate's bounds will carry: the planned wander on the planned controls' degrees of freedom."""
        df = len(self.seeds) * (self.controls - 1)
        return ReplayNoise(var=self.replay_sd**2, df=df) if self.replay_sd > 0 and df else None


class PlanError(BadInput):
    """The plan cannot measure what it must (the primary's regime) within the declared budget."""


def _cut(schedule: Schedule, span_s: float) -> Schedule:
    return schedule.model_copy(update={"merge_starts_s": [s for s in schedule.merge_starts_s if s < span_s]})


def expected_pairs(design: RegimeDesign, controllers: list[str], span_s: float, draws: int) -> GatePairs:
    """Noise-free gate pairs of the planned replays: simulated latency with merges (`mine`) and without
    (`twin`, also `other`), of the requests the gate will count as merge-active; replay ids per seed: its
    two controls, then each replay with merges."""
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
        schedules = [s for name in controllers for s in [
            seed.controllers[name], *span_draws(seed.controllers[name], design.space, span_s, draws),
            span_cadence(seed.controllers[name], design.space, span_s)]]
        for k, schedule in enumerate(schedules):
            active = merge_active(_cut(schedule, span_s), arrival, life_s)
            if not active.any():
                continue
            mine = sim(schedule)["e2e_ms"].to_numpy(dtype=float)
            first = index * (2 + len(schedules))  # the seed's ids: its two controls, then its replays with merges
            parts.append(GatePairs.of_replays(mine[active], twin_e2e[active], twin_e2e[active],
                                              block_ids(index, arrival[active], BLOCK_S),
                                              (first + 2 + k, first, first + 1)))
    return GatePairs.concat(parts)


def realisations(pairs: GatePairs, noise_log_ratios: np.ndarray, n: int, seed: int, replay_sd: float = 0.0
                 ) -> list[GatePairs]:
    """`n` noisy copies of `pairs`: every latency times exp(a draw of the noise / sqrt 2), so that two
    controls of the same request differ as the noise probe's two runs did, and (with replay ids) every
    replay's latencies times exp(a normal shock of sd `replay_sd`)."""
    rng = np.random.default_rng([seed, 0x9A1E])
    noise = np.asarray(noise_log_ratios, dtype=float)
    if noise.size < 2:
        noise = rng.normal(0.0, DEFAULT_NOISE_SD * math.sqrt(2.0), 1000)
    replays, column = pairs.replay_columns() if pairs.replay is not None and replay_sd > 0 else (0, None)
    out = []
    for _ in range(n):
        factors = np.exp(rng.choice(noise, (3, pairs.size))[[2, 0, 1]] / math.sqrt(2.0))  # twin, other, mine drawn
        if column is not None:
            factors *= np.exp(rng.normal(0.0, replay_sd, replays))[column]
        out.append(pairs.scaled(factors))
    return out


def plan_power(design: RegimeDesign, controllers: list[str], span_s: float, draws: int, threshold: float
               ) -> GatePower:
    pairs = expected_pairs(design, controllers, span_s, draws)
    if pairs.size == 0:
        return GatePower(power=0.0, log_gate=float("nan"), sd=float("nan"), margin=float("nan"), n_pairs=0)
    designs = realisations(pairs, design.noise_log_ratios, REALISATIONS, seed=len(controllers),
                           replay_sd=design.replay_sd)
    return gate_power(designs, threshold, noise=design.replay_noise())


def wall_s(design: RegimeDesign, n_controllers: int, draws: int, span_s: float) -> float:
    """Planned wall seconds of a regime's replays."""
    per_seed = replays_per_seed(design.controls, n_controllers, draws)
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


def nominal_lives(design: RegimeDesign) -> list[float]:
    """Per planned seed, the nominal request lifetime the gate will use (trace seconds): the median E2E of
    its no-sync replay, simulated with the profiled costs over the whole trace."""
    lives = []
    for seed in design.seeds:
        twin = simulate_at_time_scale(seed.requests, seed.timeline, seed.no_sync, design.prior, seed.seed,
                                      design.time_scale)
        e2e = twin["e2e_ms"].to_numpy(dtype=float)
        e2e = e2e[np.isfinite(e2e)]
        lives.append(float(np.median(e2e)) / 1000.0 * design.time_scale if e2e.size else 0.0)
    return lives


def floor_met(design: RegimeDesign, controller: str, span_s: float, draws: int,
              lives: list[float] | None = None) -> bool:
    """True when every planned replay of `controller` in [0, span_s) meets the request floor: each seed's span
    holds `min_requests` requests, and the controller, its `draws` span-matched draws and its span cadence
    each have `min_merge_active` requests the gate counts as merge-active (`gate.merge_active` with the
    seed's nominal lifetime, `nominal_lives`; 0 without, which counts arrivals inside windows only)."""
    for index, seed in enumerate(design.seeds):
        arrival = seed.requests["arrival_s"].to_numpy(dtype=float)
        arrival = arrival[arrival < span_s]
        if arrival.size < design.min_requests:
            return False
        controller_schedule = seed.controllers[controller]
        if not controller_schedule.merge_starts_s or design.min_merge_active == 0:
            continue
        life_s = lives[index] if lives is not None else 0.0
        schedules = [controller_schedule, *span_draws(controller_schedule, design.space, span_s, draws),
                     span_cadence(controller_schedule, design.space, span_s)]
        if any(int(merge_active(_cut(s, span_s), arrival, life_s).sum()) < design.min_merge_active
               for s in schedules):
            return False
    return True


@dataclass(frozen=True)
class SizedRegime:
    controllers: list[str]
    draws: int
    span_s: float
    power: GatePower
    wall_s: float


def _fixed_span_short(design: RegimeDesign, controller: str, span_s: float, draws: int,
                      lives: list[float] | None) -> str | None:
    """Why a fixed span (`replay.vllm.span_s`) leaves `design`'s planned replays below the request floor, with
    the shortest span that meets it; None when it meets it."""
    span_s = min(span_s, design.space.duration_s)
    if floor_met(design, controller, span_s, draws, lives):
        return None
    meets = [g for g in _grid(design) if floor_met(design, controller, g, draws, lives)]
    return (f"replay.vllm.span_s {span_s:g} s leaves a planned replay below the request floor "
            f"({design.min_requests} requests, {design.min_merge_active} in the merge windows of {controller}, its "
            f"draws and its cadence); " + (f"the shortest span that meets it is {meets[0]:g} s (or span_s: null)"
                                           if meets else "no span of the regime meets it"))


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


@dataclass(frozen=True)
class Sizing:
    """The sized plan: the regimes replayed, and why each other regime is not."""

    regimes: dict[str, SizedRegime]
    left_out: dict[str, str]


def size_plans(designs: dict[str, RegimeDesign], controllers: list[str], budget_s: float, threshold: float,
               power_target: float, max_draws: int, fixed_spans: dict[str, float] | None = None,
               fill_budget: bool = True) -> Sizing:
    """Regimes, controllers, draws and span per regime, in this order of priority (see the module docstring):

    1. the regimes in order (`designs`' order: `replay.vllm.regimes`), each with the primary controller
       at its shortest powered span where its real comparison with random carries information on every
       planned seed (`informative`), while the budget allows; the number of draws (from `max_draws`
       down to `MIN_DRAWS`) that lets the most regimes in, the most draws on a tie;
    2. the further controllers, in order, while the budget allows a span where each of them, too, is
       informative and meets the request floor (a controller whose merges the span misses is not replayed);
    3. what is left of the budget lengthens every span alike (unless `fill_budget` is false: then the
       budget is a ceiling and every regime keeps its shortest span that meets 1 and 2).
    A regime that does not fit is left out, with the reason, rather than replayed on a span that
    cannot measure it; the first regime (the primary's) never is: `PlanError` when it has no span
    meeting the request floor, or a powered span the budget cannot pay for. When no span powers it,
    it alone gets the longest informative span the budget allows, with one draw,
    and its plan says how much power that buys (the gate will then report *underpowered* when it does
    not pass). A pinned span (`fixed_spans[regime]`, `replay.vllm.span_s`) is used as given, powered or not,
    but never below the request floor: a regime whose planned replays it leaves short is left out with the
    reason, the first one fails, and a further controller whose replays it leaves short is not added. Its
    floor counts arrivals inside merge windows (no simulated request lifetime), so that with a pinned time
    scale the plan is the same on every machine; `fill_budget` lengthens only a plan with no pinned span.
    """
    sizer = _Sizer(designs, controllers, budget_s, threshold, power_target, max_draws, dict(fixed_spans or {}))
    first = next(iter(designs))
    fewest = min(MIN_DRAWS, max_draws)
    candidates = [(draws, *sizer.admit(draws)) for draws in range(max_draws, fewest - 1, -1)]
    draws, spans, left_out = max(candidates, key=lambda c: (first in c[1], len(c[1]), c[0]))
    if first not in spans:
        sizer.refuse_primary(first, fewest, left_out)  # raises unless no span powers the primary's regime
        n_chosen, draws, spans, left_out = sizer.underpowered(first)
    else:
        n_chosen, spans = sizer.add_controllers(spans, draws)
        if fill_budget and not sizer.fixed_spans:
            included = {r: designs[r] for r in spans}
            spans = _fill_budget(included, {r: sizer.measurable(r, n_chosen) for r in included}, n_chosen, draws,
                                 spans, budget_s)
    sized = {r: SizedRegime(controllers[:n_chosen], draws, spans[r], sizer.power(r, n_chosen, draws, spans[r]),
                            wall_s(designs[r], n_chosen, draws, spans[r])) for r in spans}
    return Sizing(sized, {r: left_out[r] for r in designs if r not in sized})


class _Sizer:
    """The searches `size_plans` is made of, over one set of designs, with their power and span grids cached."""

    def __init__(self, designs: dict[str, RegimeDesign], controllers: list[str], budget_s: float, threshold: float,
                 power_target: float, max_draws: int, fixed_spans: dict[str, float]) -> None:
        self.designs, self.controllers, self.budget_s = designs, controllers, budget_s
        self.threshold, self.power_target, self.max_draws = threshold, power_target, max_draws
        self.fixed_spans = fixed_spans
        self._powers: dict[tuple[str, int, int, float], GatePower] = {}
        self._grids: dict[tuple[str, int], list[float]] = {}
        # a pinned span's floor counts arrivals in merge windows only (no simulated lifetimes: machine-free)
        self.lives = {r: nominal_lives(d) if d.min_merge_active and r not in fixed_spans else None
                      for r, d in designs.items()}
        self.fixed_short = {r: _fixed_span_short(d, controllers[0], fixed_spans[r], max_draws, self.lives[r])
                            for r, d in designs.items() if r in fixed_spans}

    def power(self, regime: str, n: int, draws: int, span: float) -> GatePower:
        key = (regime, n, draws, span)
        if key not in self._powers:
            self._powers[key] = plan_power(self.designs[regime], self.controllers[:n], span, draws, self.threshold)
        return self._powers[key]

    def measurable(self, regime: str, n: int) -> list[float]:
        """Candidate spans where the real comparison of each of the first `n` controllers with random carries
        information and all their planned replays meet the request floor."""
        if (regime, n) not in self._grids:
            d, c = self.designs[regime], self.controllers[n - 1]
            base = _grid(d) if n == 1 else self.measurable(regime, n - 1)
            self._grids[regime, n] = [g for g in base if informative(d, c, g)
                                      and floor_met(d, c, g, self.max_draws, self.lives[regime])]
        return self._grids[regime, n]

    def shortest(self, regime: str, n: int, draws: int) -> float | None:
        """The span of `regime` with the first `n` controllers: the pinned one where it meets the floor, else the
        shortest measurable span reaching the power target; None when there is none."""
        design = self.designs[regime]
        if regime in self.fixed_spans:
            span = min(self.fixed_spans[regime], design.space.duration_s)
            further = all(floor_met(design, c, span, self.max_draws, self.lives[regime])
                          for c in self.controllers[1:n])
            return None if self.fixed_short[regime] or not further else span
        grid = self.measurable(regime, n)
        if not grid:
            return None
        return _shortest_powered(lambda s: self.power(regime, n, draws, s), grid, self.power_target)

    def admit(self, draws: int) -> tuple[dict[str, float], dict[str, str]]:
        """The regimes, in order, that the budget pays for at their shortest span with the primary and `draws`
        draws; the others with the reason."""
        spans: dict[str, float] = {}
        left_out: dict[str, str] = {}
        used = 0.0
        for regime, design in self.designs.items():
            span = self.shortest(regime, 1, draws)
            if span is None:
                left_out[regime] = self.fixed_short.get(regime) or self._no_span(regime, draws)
                continue
            cost = wall_s(design, 1, draws, span)
            if used + cost > self.budget_s:
                left_out[regime] = (f"its shortest powered span ({span:g} s, about {cost:.0f} s of replays) "
                                    f"does not fit the {max(self.budget_s - used, 0.0):.0f} s of budget_s left")
                continue
            spans[regime], used = span, used + cost
        return spans, left_out

    def _no_span(self, regime: str, draws: int) -> str:
        design = self.designs[regime]
        if not self.measurable(regime, 1):
            return (f"no span where {self.controllers[0]} merges on every planned seed, its draws can place those "
                    f"merges differently and every replay has {design.min_requests} requests "
                    f"({design.min_merge_active} in merge windows)")
        return f"no span reaches gate power {self.power_target:.0%} with {draws} draw(s)"

    def refuse_primary(self, first: str, fewest: int, left_out: dict[str, str]) -> None:
        """`PlanError` when the primary's regime cannot be replayed at all: a pinned span below the floor, no
        measurable span, or a powered span the budget cannot pay for. Returns when only power is missing."""
        if self.fixed_short.get(first):
            raise PlanError(f"the primary's regime {first}: {self.fixed_short[first]}")
        if not self.measurable(first, 1):
            raise PlanError(f"the primary's regime {first} has no span: {left_out[first]}")
        if (span := self.shortest(first, 1, fewest)) is not None:
            raise PlanError(f"replay.vllm.budget_s {self.budget_s:g} s cannot pay for the primary's regime {first}: "
                            f"its shortest powered span ({span:g} s) needs about "
                            f"{wall_s(self.designs[first], 1, fewest, span):.0f} s of replays with {fewest} draw(s); "
                            "raise budget_s")

    def add_controllers(self, spans: dict[str, float], draws: int) -> tuple[int, dict[str, float]]:
        """The further controllers, in order, while every admitted regime has a span for them and the budget pays
        for it; the number of controllers and their spans."""
        n_chosen = 1
        for n in range(2, len(self.controllers) + 1):
            more = {r: self.shortest(r, n, draws) for r in spans}
            if any(v is None for v in more.values()):
                break
            if sum(wall_s(self.designs[r], n, draws, v) for r, v in more.items() if v is not None) > self.budget_s:
                break
            n_chosen, spans = n, {r: v for r, v in more.items() if v is not None}
        return n_chosen, spans

    def underpowered(self, first: str) -> tuple[int, int, dict[str, float], dict[str, str]]:
        """No span powers the primary's regime: it alone, one draw, on its pinned span or its longest informative
        span the budget allows; (controllers, draws, spans, left out)."""
        design = self.designs[first]
        if first in self.fixed_spans:
            span = self.shortest(first, 1, 1)
            spans = {first: span} if span is not None else {}
        else:
            fits = [g for g in self.measurable(first, 1) if wall_s(design, 1, 1, g) <= self.budget_s]
            spans = _fill_budget({first: design}, {first: fits or self.measurable(first, 1)[:1]}, 1, 1, {},
                                 self.budget_s)
        left_out = {r: f"{why}; the budget powers no regime, so only the first one is replayed"
                    for r, why in self.admit(1)[1].items() if r != first}
        return 1, 1, spans, left_out


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
