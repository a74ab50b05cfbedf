"""Schedules derived from a controller schedule: the evidence protocol's baselines.

- `matched_random`: the same merge count drawn uniformly from the
  controller's own action space (`syncsafe.schedules.action_space`: the
  control-cycle grid, 1..max_h/min_h cycles apart, no room left for a forced
  merge), seeded per (regime, controller, seed, draw) so a draw is the same
  wherever it is made. The primary baseline.
- `matched_random_free`: the secondary reference of earlier versions: the
  same count, window and min gap placed uniformly over all continuous
  placements (wider than any controller's choices: it can bunch merges or
  leave holes no controller can make).
- `even_cadence`: the same count evenly spaced in the action space; "beats
  fixed cadence" is judged against it (fixed_h itself may merge a different
  number of times).
- `no_sync`: no merges at all; the load-matched baseline of sync-excess.
- `offline_bound`: the placement of the same count with the least busy
  overlap (ties broken by least inference pressure), found with full
  knowledge of the timeline. Not deployable: it shows the headroom.
"""

from __future__ import annotations

import zlib

import numpy as np

from syncsafe.schedules.action_space import ActionSpace, ActionSpaceError
from syncsafe.schedules.schedule import LoadIntegral, Schedule, ScheduleError

#: Random stream of the free (continuous) sampler, apart from the action-space draws.
FREE_STREAM = 1


def _draw_rng(controller: Schedule, draw: int, stream: int = 0) -> np.random.Generator:
    key = zlib.crc32(f"{controller.regime}/{controller.policy}".encode())
    return np.random.default_rng([controller.seed, draw, key, stream] if stream else [controller.seed, draw, key])


def random_placement(n: int, duration_s: float, window_s: float, min_gap_s: float, rng: np.random.Generator) -> list[float]:
    """n merge starts uniform over all placements that fit with the min gap.

    Feasible placements are in one-to-one, volume-preserving correspondence
    with sorted points in [0, slack] (start_i = u_(i) + i * (window + gap)),
    so sorting n uniform points gives a uniform feasible placement.
    """
    if n == 0:
        return []
    pitch = window_s + min_gap_s
    slack = duration_s - window_s - (n - 1) * pitch
    if slack < 0:
        raise ValueError(f"{n} merges of {window_s}s with min gap {min_gap_s}s do not fit in {duration_s}s")
    u = np.floor(np.sort(rng.uniform(0.0, slack, n)) * 1000.0) / 1000.0  # ms resolution
    return [round(float(x) + i * pitch, 6) for i, x in enumerate(u)]


def _derived(controller: Schedule, policy: str, starts: list[float], draw: int | None = None) -> Schedule:
    return controller.model_copy(
        update={"policy": policy, "draw": draw, "matched_to": controller.policy, "source": policy, "merge_starts_s": starts}
    )


def _in_space(controller: Schedule, space: ActionSpace) -> None:
    if not space.contains(controller.merge_starts_s):
        raise ScheduleError(
            f"{controller.regime}/{controller.policy}/seed-{controller.seed}: schedule {controller.merge_starts_s} "
            f"is not in the controller's action space ({space}); matched baselines would not be fair"
        )


def matched_random(controller: Schedule, draw: int, space: ActionSpace) -> Schedule:
    """Draw `draw` of the matched-random envelope of `controller`, from its own action space."""
    _in_space(controller, space)
    return _derived(controller, "matched_random", space.sample(controller.n_merges, _draw_rng(controller, draw)), draw)


def matched_random_free(controller: Schedule, draw: int) -> Schedule:
    """Draw `draw` of the free (continuous placement) reference envelope of `controller`."""
    starts = random_placement(
        controller.n_merges, controller.duration_s, controller.window_s, controller.min_gap_s,
        _draw_rng(controller, draw, FREE_STREAM),
    )
    return _derived(controller, "matched_random_free", starts, draw)


def even_cadence(controller: Schedule, space: ActionSpace) -> Schedule:
    """The controller's merge count, evenly spaced in its action space."""
    _in_space(controller, space)
    try:
        starts = space.starts(space.evenly_spaced_gaps(controller.n_merges))
    except ActionSpaceError as err:
        raise ScheduleError(f"{controller.regime}/{controller.policy}/seed-{controller.seed}: {err}") from None
    return _derived(controller, "even_cadence", starts)


def no_sync(regime: str, seed: int, duration_s: float, window_s: float, min_gap_s: float) -> Schedule:
    return Schedule(
        regime=regime,
        policy="no_sync",
        seed=seed,
        source="no_sync",
        duration_s=duration_s,
        window_s=window_s,
        min_gap_s=min_gap_s,
        merge_starts_s=[],
    )


def offline_bound(controller: Schedule, load: LoadIntegral) -> Schedule:
    """The least-busy-overlap placement of the controller's merge count.

    Exact: busy overlap as a function of each start is piecewise linear with
    kinks on the timeline grid, and window and min gap are multiples of the
    grid step, so an optimal placement exists on the grid; a dynamic program
    over grid starts finds it in O(n * grid).
    """
    n = controller.n_merges
    step = load.step_s
    w, g, d = controller.window_s, controller.min_gap_s, controller.duration_s
    if n == 0:
        starts: list[float] = []
    else:
        grid = np.arange(int(round((d - w) / step)) + 1) * step
        busy = load.over("busy", grid, w)
        pressure = load.over("inference_pressure", grid, w)
        # Lexicographic cost: any busy difference (a multiple of `step`) outweighs all pressure.
        cost = busy * (2.0 * n * w / step + 1.0) + pressure
        starts = [float(grid[j]) for j in _best_placement(cost, n, int(round((w + g) / step)))]
    return controller.model_copy(
        update={"policy": "offline_bound", "matched_to": controller.policy, "source": "offline_bound", "merge_starts_s": starts}
    )


def _best_placement(cost: np.ndarray, n: int, pitch: int) -> list[int]:
    """Indices j_1 < ... < j_n with j_{i+1} - j_i >= pitch minimising the summed cost."""
    m = cost.size
    if (n - 1) * pitch >= m:
        raise ValueError(f"{n} merges with pitch {pitch} do not fit on a grid of {m} starts")
    best = cost.copy()  # best[j]: least cost of i+1 merges, the last at j
    back = np.zeros((n, m), dtype=np.int64)
    for i in range(1, n):
        prev = np.full(m, np.inf)
        arg = np.zeros(m, dtype=np.int64)
        # the previous merge ends at least `pitch` grid steps earlier: prefix minimum of best
        run_arg = _running_argmin(best)
        prev[pitch:] = best[run_arg[: m - pitch]]
        arg[pitch:] = run_arg[: m - pitch]
        back[i] = arg
        best = prev + cost
    j = int(np.argmin(best))
    picks = [j]
    for i in range(n - 1, 0, -1):
        j = int(back[i][j])
        picks.append(j)
    return picks[::-1]


def _running_argmin(x: np.ndarray) -> np.ndarray:
    """Index of the first minimum of x[: k + 1] for every k."""
    run_min = np.minimum.accumulate(x)
    new_min = np.concatenate([[True], x[1:] < run_min[:-1]])
    return np.maximum.accumulate(np.where(new_min, np.arange(x.size), 0))
