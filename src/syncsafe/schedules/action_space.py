"""The controller's action space: every merge schedule a controller can produce.

The trace-time controller (`syncsafe.control.controller`) decides once per
control cycle of `cycle_s = min_h * step_s` trace seconds. A merge starts at
the decision time, occupies `window_s`, and the next cycle begins when the
window ends. A merge is forced once `max_h` steps have passed, i.e. after
`max_cycles = ceil(max_h / min_h)` cycles, and a merge only happens when its
window fits before `duration_s`. So a schedule of n merges is a sequence of
cycle gaps k_1..k_n, each in 1..max_cycles, with

    start_i = (k_1 + ... + k_i) * cycle_s + (i - 1) * window_s
    start_n + window_s <= duration_s                      (the last one fits)
    start_n + window_s + max_cycles * cycle_s + window_s > duration_s
                                                          (no room left for a forced merge)

(with n = 0: `max_cycles * cycle_s + window_s > duration_s`).

A matched-random draw must come from exactly this set, with the controller's
merge count: a wider set (continuous starts, bunched merges, holes longer than
`max_h`) would let "beats matched random" come from spacing no controller can
choose. :meth:`ActionSpace.sample` draws uniformly from it, exactly: the number
of gap sequences with a given sum is counted by dynamic programming (Python
integers, no overflow), a total is drawn with probability proportional to its
count, then each gap with probability proportional to the completions it
leaves.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from syncsafe.config import Params

EPS = 1e-6


class ActionSpaceError(ValueError):
    """A schedule or merge count outside the controller's action space."""


@dataclass(frozen=True)
class ActionSpace:
    """Merge schedules of a trace-time controller (see the module docstring)."""

    cycle_s: float
    window_s: float
    duration_s: float
    max_cycles: int

    def __post_init__(self) -> None:
        if not (self.cycle_s > 0 and self.window_s > 0 and self.duration_s > 0 and self.max_cycles >= 1):
            raise ActionSpaceError(f"not an action space: {self}")

    @classmethod
    def of_params(cls, params: Params, regime: str) -> ActionSpace:
        """The action space of every controller of `regime` under `params`."""
        c = params.control
        return cls.of_controller(c.step_s, c.min_h, c.max_h, params.merge.window_s, params.regimes[regime].duration_s)

    @classmethod
    def of_controller(cls, step_s: float, min_h: int, max_h: int, window_s: float, duration_s: float) -> ActionSpace:
        return cls(cycle_s=min_h * step_s, window_s=window_s, duration_s=duration_s, max_cycles=math.ceil(max_h / min_h))

    # ------------------------------------------------------------------ geometry

    def starts(self, gaps: list[int] | tuple[int, ...]) -> list[float]:
        """Merge start times (trace s) of a gap sequence."""
        out, cycles = [], 0
        for i, k in enumerate(gaps):
            cycles += k
            out.append(round(cycles * self.cycle_s + i * self.window_s, 6))
        return out

    def gaps(self, starts: list[float]) -> list[int] | None:
        """The gap sequence of `starts`, or None when they are not on the controller's grid."""
        out, prev_end = [], 0.0
        for s in starts:
            k = (s - prev_end) / self.cycle_s
            if abs(k - round(k)) > EPS or round(k) < 1:
                return None
            out.append(int(round(k)))
            prev_end = s + self.window_s
        return out

    def feasible_totals(self, n: int) -> range:
        """Feasible cycle totals K = k_1 + ... + k_n of n merges (empty when n merges cannot happen)."""
        c, w, d, r = self.cycle_s, self.window_s, self.duration_s, self.max_cycles
        if n == 0:  # no merge at all: only if even the first forced merge would not fit
            return range(0, 1) if r * c + w > d + EPS else range(0)
        # last fits: K*c + n*w <= d; no forced merge after: (K + r)*c + (n + 1)*w > d; each gap 1..r
        hi = min(math.floor((d - n * w) / c + EPS), n * r)
        lo = max(n, math.floor((d - (n + 1) * w) / c - r + EPS) + 1)
        return range(lo, hi + 1)

    def contains(self, starts: list[float]) -> bool:
        """True when `starts` is a schedule this controller can produce."""
        gaps = self.gaps(list(starts))
        if gaps is None or any(k > self.max_cycles for k in gaps):
            return False
        return sum(gaps) in self.feasible_totals(len(gaps))

    def merge_counts(self) -> range:
        """Every merge count some controller schedule has."""
        counts = [n for n in range(len(self._ways_table)) if self.count(n) > 0]
        return range(min(counts), max(counts) + 1) if counts else range(0)

    # ------------------------------------------------------------------ counting

    @cached_property
    def _ways_table(self) -> list[list[int]]:
        """ways[i][K]: gap sequences of length i summing to K (each gap 1..max_cycles).

        Every merge takes at least one cycle and one window, so at most
        duration / (cycle + window) + 1 merges and duration / cycle cycles
        matter. Each row is a sliding-window sum of the row before.
        """
        n_max = int(self.duration_s // (self.cycle_s + self.window_s)) + 1
        k_max = int(self.duration_s // self.cycle_s) + 1
        ways = [[1] + [0] * k_max]
        for _ in range(n_max):
            prev, row, window = ways[-1], [0] * (k_max + 1), 0
            for total in range(1, k_max + 1):
                window += prev[total - 1]
                if total - 1 - self.max_cycles >= 0:
                    window -= prev[total - 1 - self.max_cycles]
                row[total] = window
            ways.append(row)
        return ways

    def _ways(self, length: int, total: int) -> int:
        table = self._ways_table
        if length < 0 or length >= len(table) or total < 0 or total >= len(table[0]):
            return 0
        return table[length][total]

    def count(self, n: int) -> int:
        """How many schedules with n merges the controller can produce."""
        if n < 0:
            return 0
        if n == 0:
            return len(self.feasible_totals(0))
        return sum(self._ways(n, total) for total in self.feasible_totals(n))

    # ------------------------------------------------------------------ sampling

    def sample_gaps(self, n: int, rng: np.random.Generator) -> list[int]:
        """A gap sequence drawn uniformly from all feasible schedules with n merges."""
        total_count = self.count(n)
        if total_count == 0:
            raise ActionSpaceError(
                f"no controller schedule has {n} merges (cycle {self.cycle_s} s, window {self.window_s} s, "
                f"max {self.max_cycles} cycles apart, {self.duration_s} s)"
            )
        if n == 0:
            return []
        totals = list(self.feasible_totals(n))
        return self.gaps_with_total(n, pick(rng, totals, [self._ways(n, t) for t in totals]), rng)

    def ways(self, length: int, total: int) -> int:
        """Gap sequences of `length` gaps (each 1..max_cycles) summing to `total`."""
        return self._ways(length, total)

    def gaps_with_total(self, length: int, total: int, rng: np.random.Generator) -> list[int]:
        """A gap sequence drawn uniformly from those of `length` gaps summing to `total`."""
        if self._ways(length, total) == 0:
            raise ActionSpaceError(f"no {length} gaps of 1..{self.max_cycles} cycles sum to {total}")
        gaps = []
        for i in range(length, 0, -1):
            options = [k for k in range(1, self.max_cycles + 1) if self._ways(i - 1, total - k) > 0]
            k = pick(rng, options, [self._ways(i - 1, total - k) for k in options])
            gaps.append(k)
            total -= k
        return gaps

    def sample(self, n: int, rng: np.random.Generator) -> list[float]:
        """Merge starts drawn uniformly from all feasible schedules with n merges."""
        return self.starts(self.sample_gaps(n, rng))

    def enumerate(self, n: int) -> Iterator[list[int]]:
        """Every feasible gap sequence with n merges (small spaces only: tests, exhaustive search)."""
        allowed = set(self.feasible_totals(n))
        top = max(allowed, default=-1)

        def extend(prefix: list[int], total: int) -> Iterator[list[int]]:
            if len(prefix) == n:
                if total in allowed:
                    yield list(prefix)
                return
            left = n - len(prefix) - 1  # gaps after this one, each at least 1
            for k in range(1, self.max_cycles + 1):
                if total + k + left > top:
                    break
                prefix.append(k)
                yield from extend(prefix, total + k)
                prefix.pop()

        if allowed:
            yield from extend([], 0)

    def evenly_spaced_gaps(self, n: int) -> list[int]:
        """The most even feasible gap sequence with n merges: fixed cadence at the controller's own count.

        The gaps spread the middle feasible total as evenly as the grid allows
        (they differ by at most one cycle, the longer ones first).
        """
        totals = self.feasible_totals(n)
        if self.count(n) == 0:
            raise ActionSpaceError(f"no controller schedule has {n} merges")
        if n == 0:
            return []
        total = totals[len(totals) // 2]
        base, extra = divmod(total, n)
        return [base + 1] * extra + [base] * (n - extra)


def pick(rng: np.random.Generator, options: list, weights: list[int]):
    """One of `options` with probability exactly proportional to the integer `weights`."""
    total = sum(weights)
    # an exact uniform integer in [0, total) from 62-bit chunks (total may exceed 2**64)
    u = _uniform_below(rng, total)
    for option, weight in zip(options, weights):
        if u < weight:
            return option
        u -= weight
    raise AssertionError("weights exhausted")  # unreachable: u < total


def _uniform_below(rng: np.random.Generator, bound: int) -> int:
    bits = max(bound.bit_length(), 1)
    chunks = -(-bits // 62)
    while True:  # rejection sampling keeps it exactly uniform
        value = 0
        for _ in range(chunks):
            value = (value << 62) | int(rng.integers(0, 1 << 62))
        value >>= chunks * 62 - bits
        if value < bound:
            return value
