"""The SLO oracle: the headroom of merge timing, in the controller's own action space.

For a controller schedule with n merges, `slo_oracle` looks for the schedule
of the same count, from the same action space (`syncsafe.schedules.
action_space`), with the fewest *simulated* SLO violations under the seed's
load. It is not deployable (it knows the whole trace); it is the far end of
the headline metric *gap closed* = (matched random - controller) /
(matched random - oracle).

Violations do not separate per merge window (a merge's queue outlasts it),
so no exact dynamic program exists. The search is:

1. a start from a dynamic program over the action space's grid on a
   separable proxy: the requests that arrive while the window runs or during
   an aftermath of `aftermath_s` (weighted by the timeline's pressure
   multiplier), exact for that proxy;
2. the best of the controller's own matched-random draws (already simulated)
   and the controller schedule itself, as rival starts;
3. first-improvement local search from the best start, with the real
   simulator, moving one merge by one cycle at a time (its neighbour's gap
   compensating, so the schedule stays feasible), up to `max_evals`
   simulations.

The result is never worse than any draw it was given (they are candidates),
deterministic, and its cost is the simulator's: about `max_evals` replays per
controller schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from syncsafe.schedules.action_space import ActionSpace
from syncsafe.schedules.schedule import LoadIntegral, Schedule
from syncsafe.control.serving_model import Calibration
from syncsafe.serving.metrics import SloSpec, violation_mask
from syncsafe.serving.simulator import simulate_at_time_scale

#: Proxy aftermath: requests arriving this long after a window still meet its queue.
DEFAULT_AFTERMATH_S = 10.0
DEFAULT_MAX_EVALS = 40


@dataclass(frozen=True)
class OracleResult:
    schedule: Schedule
    violations: int
    evaluations: int
    #: Where the winning schedule's search started: "proxy", "draw" or "controller".
    start: str


def slo_oracle(
    controller: Schedule,
    space: ActionSpace,
    requests: pd.DataFrame,
    timeline: pd.DataFrame,
    calibration: Calibration,
    seed: int,
    slo: SloSpec,
    rivals: Sequence[tuple[Schedule, int]] = (),
    *,
    max_evals: int = DEFAULT_MAX_EVALS,
    aftermath_s: float = DEFAULT_AFTERMATH_S,
    time_scale: float = 1.0,
) -> OracleResult:
    """The fewest-violation schedule found for `controller`'s merge count (see the module docstring).

    `rivals` are already simulated schedules of the same count (matched-random
    draws) with their violation counts; the controller itself is simulated here,
    at `time_scale` like them (`simulate_at_time_scale`).
    """
    n = controller.n_merges

    def violations(starts: list[float]) -> int:
        trial = controller.model_copy(update={"merge_starts_s": starts})
        results = simulate_at_time_scale(requests, timeline, trial, calibration, seed, time_scale)
        return int(violation_mask(results, slo).sum())

    candidates: list[tuple[int, list[int], str]] = []
    evals = 0
    if n > 0:
        proxy = _proxy_gaps(space, n, timeline, calibration, aftermath_s)
        candidates.append((violations(space.starts(proxy)), proxy, "proxy"))
        candidates.append((violations(list(controller.merge_starts_s)), _gaps(space, controller.merge_starts_s), "controller"))
        evals = 2
        for rival, count in rivals:
            if rival.n_merges == n and space.contains(rival.merge_starts_s):
                candidates.append((int(count), _gaps(space, rival.merge_starts_s), "draw"))
    else:
        candidates.append((violations([]), [], "controller"))
        evals = 1
    best, gaps, start = min(candidates, key=lambda c: (c[0], c[1]))
    best, gaps, searched = _local_search(space, gaps, best, lambda g: violations(space.starts(g)), max_evals - evals)
    oracle = controller.model_copy(
        update={"policy": "slo_oracle", "source": "slo_oracle", "matched_to": controller.policy, "draw": None,
                "merge_starts_s": space.starts(gaps)}
    )
    return OracleResult(schedule=oracle, violations=best, evaluations=evals + searched, start=start)


def _gaps(space: ActionSpace, starts: Sequence[float]) -> list[int]:
    gaps = space.gaps(list(starts))
    if gaps is None:
        raise ValueError(f"schedule {list(starts)} is not on the action space's cycle grid")
    return gaps


def _local_search(
    space: ActionSpace, gaps: list[int], best: int, cost: Callable[[list[int]], int], budget: int
) -> tuple[int, list[int], int]:
    """First-improvement search over one-cycle moves of a single merge; returns (cost, gaps, evaluations)."""
    evals = 0
    improved = True
    while improved and evals < budget and best > 0:
        improved = False
        for move in _moves(space, gaps):
            if evals >= budget:
                break
            evals += 1
            value = cost(move)
            if value < best:
                best, gaps, improved = value, move, True
                break
    return best, gaps, evals


def _moves(space: ActionSpace, gaps: list[int]) -> list[list[int]]:
    """Feasible neighbours: merge j one cycle earlier or later, merge j+1 staying put (or the last one moving)."""
    out = []
    for j in range(len(gaps)):
        for delta in (-1, 1):
            move = list(gaps)
            move[j] += delta
            if j + 1 < len(gaps):
                move[j + 1] -= delta
            if space.contains(space.starts(move)):
                out.append(move)
    return out


def _proxy_gaps(space: ActionSpace, n: int, timeline: pd.DataFrame, calibration: Calibration, aftermath_s: float) -> list[int]:
    """Exact minimiser of the summed per-merge proxy cost over every feasible gap sequence with n merges.

    Merge i (0-based) after K cycles in total starts at K * cycle + i * window;
    the DP runs over (i, K) and reads the proxy cost of that start: the
    pressure-weighted arrivals over the window and its aftermath.
    """
    weighted = timeline["arrival_rate"].to_numpy(dtype=float) * calibration.pressure_multiplier(
        timeline["inference_pressure"].to_numpy(dtype=float))
    load = LoadIntegral(pd.DataFrame({"t_s": timeline["t_s"], "merge_load": weighted}))
    r = space.max_cycles
    totals = set(space.feasible_totals(n))
    k_max = max(totals)
    cycles = np.arange(k_max + 1)
    # cost[i][k]: proxy cost of merge i starting after k cycles in total
    cost = [load.over("merge_load", cycles * space.cycle_s + i * space.window_s, space.window_s + aftermath_s)
            for i in range(n)]
    inf = float("inf")
    # best[i][k]: least proxy cost of merges 0..i with k cycles in total; back[i][k]: gap of merge i
    best = [[inf] * (k_max + 1) for _ in range(n)]
    back = [[0] * (k_max + 1) for _ in range(n)]
    for k in range(1, min(r, k_max) + 1):
        best[0][k], back[0][k] = float(cost[0][k]), k
    for i in range(1, n):
        for k in range(i + 1, k_max + 1):
            for gap in range(1, min(r, k) + 1):
                total = best[i - 1][k - gap] + float(cost[i][k])
                if total < best[i][k]:
                    best[i][k], back[i][k] = total, gap
    k = min(totals, key=lambda total: (best[n - 1][total], total))
    gaps = []
    for i in range(n - 1, -1, -1):
        gap = back[i][k]
        gaps.append(gap)
        k -= gap
    return gaps[::-1]
