"""Budget matching inside a replayed span: random schedules with the controller's count *in the span*.

A real replay covers only the span [0, span_s) of a schedule's trace. A
matched-random draw of the controller's whole-trace merge count can place
more or fewer of its merges inside that span than the controller did, and
then the real replay compares different merge budgets: the bias matched
random exists to remove. So the real arm's draws are drawn uniformly from
the controller's action space (`syncsafe.schedules.action_space`) with the
controller's total count n **and** the same `SpanCount` in the span: m
merges starting before `span_s`, and whether the last of them runs past
`span_s` (a window the span cuts).

In gap terms (start_i = K_i * cycle + (i - 1) * window, K_i the sum of the
first i gaps): m merges in the span and the cut are conditions on K_m, and
"no further merge starts inside" a condition on the next gap k_{m+1}. The
number of schedules with a given (total K, K_m = j, k_{m+1} = k) is
ways(m, j) * ways(n - m - 1, K - j - k), so `sample_in_span` draws
(K, j, k) with exactly that weight, then the first m gaps uniformly with
sum j and the rest uniformly with sum K - j - k: exactly uniform over the
conditioned set (checked against enumeration in the tests).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from syncsafe.schedules.action_space import ActionSpace, ActionSpaceError, pick


@dataclass(frozen=True)
class SpanCount:
    """Merges a schedule starts before the span's end, and whether the span cuts the last of them."""

    merges: int
    cut: bool

    def describe(self) -> str:
        return f"{self.merges} merge(s) in the span" + (", the last cut by its end" if self.cut else "")


def span_count(starts: Sequence[float], window_s: float, span_s: float) -> SpanCount:
    """The `SpanCount` of merge starts `starts` in [0, span_s)."""
    inside = sorted(s for s in starts if s < span_s)
    return SpanCount(len(inside), bool(inside) and inside[-1] + window_s > span_s)


def _combos(space: ActionSpace, n: int, span_s: float, target: SpanCount) -> Iterator[tuple[int, int, int, int]]:
    """(total K, prefix j = K_m, next gap k or 0, count) of every gap-sequence class with the target count."""
    m, c, w, r = target.merges, space.cycle_s, space.window_s, space.max_cycles
    if m > n or (m == 0 and target.cut):
        return
    for total in space.feasible_totals(n):
        if m == 0:
            prefixes = [0]
        else:
            prefixes = [j for j in range(m, min(m * r, total) + 1)
                        if (start := round(j * c + (m - 1) * w, 6)) < span_s and (start + w > span_s) == target.cut]
        for j in prefixes:
            if m == n:
                if j == total and (count := space.ways(n, total)):
                    yield total, j, 0, count
                continue
            for k in range(1, r + 1):
                if round((j + k) * c + m * w, 6) < span_s:
                    continue  # merge m + 1 would start inside the span
                count = space.ways(m, j) * space.ways(n - m - 1, total - j - k)
                if count:
                    yield total, j, k, count


def count_in_span(space: ActionSpace, n: int, span_s: float, target: SpanCount) -> int:
    """How many schedules with n merges have `target` in [0, span_s)."""
    return sum(count for *_, count in _combos(space, n, span_s, target))


def placements_in_span(space: ActionSpace, n: int, span_s: float, target: SpanCount) -> int:
    """How many different placements of merges inside [0, span_s) the schedules counted by
    `count_in_span` have: the in-span starts are the first `target.merges` gaps, so this counts those
    prefixes (1 when the span holds no merge). Below 2, every draw replays the controller's span exactly."""
    prefixes = {j for _, j, _, _ in _combos(space, n, span_s, target)}
    return sum(space.ways(target.merges, j) for j in prefixes)


def sample_in_span(space: ActionSpace, n: int, span_s: float, target: SpanCount, rng: np.random.Generator
                   ) -> list[float]:
    """Merge starts drawn uniformly from the schedules with n merges and `target` in [0, span_s)."""
    combos = list(_combos(space, n, span_s, target))
    if not combos:
        raise ActionSpaceError(f"no controller schedule with {n} merges has {target.describe()} "
                               f"(span {span_s:g} s, {space})")
    total, j, k, _ = pick(rng, combos, [count for *_, count in combos])
    m = target.merges
    if m == n:
        return space.starts(space.gaps_with_total(n, total, rng))
    gaps = space.gaps_with_total(m, j, rng) + [k] + space.gaps_with_total(n - m - 1, total - j - k, rng)
    return space.starts(gaps)


def _even_split(length: int, total: int) -> list[int]:
    """`total` cycles over `length` gaps as evenly as the grid allows (the longer ones first)."""
    if length == 0:
        return []
    base, extra = divmod(total, length)
    return [base + 1] * extra + [base] * (length - extra)


def even_in_span(space: ActionSpace, n: int, span_s: float, target: SpanCount) -> list[float]:
    """The most evenly spaced schedule with n merges and `target` in [0, span_s): the fixed cadence a
    real replay of the span can compare a controller with at the same budget where the server sees it.

    Among the gap-sequence classes of `sample_in_span`, each split evenly (first m gaps, the gap after
    the span's last merge, the rest), the one whose gaps are most alike (smallest spread, then variance,
    then the total nearest the middle feasible total) wins: deterministic, no draw involved."""
    combos = list(_combos(space, n, span_s, target))
    if not combos:
        raise ActionSpaceError(f"no controller schedule with {n} merges has {target.describe()} "
                               f"(span {span_s:g} s, {space})")
    totals = space.feasible_totals(n)
    middle = totals[len(totals) // 2]
    m = target.merges

    def gaps_of(total: int, j: int, k: int) -> list[int]:
        if m == n:
            return _even_split(n, total)
        return _even_split(m, j) + [k] + _even_split(n - m - 1, total - j - k)

    def evenness(gaps: list[int], total: int) -> tuple[float, float, int]:
        g = np.asarray(gaps, dtype=float)
        return (float(g.max() - g.min()), float(g.var()), abs(total - middle)) if g.size else (0.0, 0.0, 0)

    best = min(((gaps_of(t, j, k), t) for t, j, k, _ in combos), key=lambda c: (evenness(*c), c[0]))
    return space.starts(best[0])
