"""The controller's clocks: trace time (reproducible) or the wall clock (live).

The controller loop (`syncsafe.control.controller.run_controller`) keeps its
own time in trace seconds: a cycle advances it by `min_h * step_s`, a merge
by `window_s`. Before each decision it calls `clock.reach(t_s)`:

- `TraceClock` returns at once: time is whatever the loop says it is, so a
  run is exactly reproducible on any machine.
- `WallClock` waits until real time (`syncsafe.timebase`, monotonic) reaches `start_epoch + t_s /
  time_scale` (trace seconds run `time_scale` times faster than wall
  seconds, like the load generator's arrivals), so the decision is taken
  when the serving node is at that point of its load. When the islands'
  work ran past the decision time, the decision is late; every `reach`
  records its lag, and the largest lag is reported with the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from syncsafe import timebase


class Clock(Protocol):
    def reach(self, t_s: float) -> None: ...


class TraceClock:
    """Trace time: the loop's own arithmetic, nothing waits."""

    def reach(self, t_s: float) -> None:
        return None


TRACE_CLOCK = TraceClock()


@dataclass
class WallClock:
    """Trace seconds on the wall clock, from `start_epoch`, `time_scale` trace seconds per wall second."""

    start_epoch: float
    time_scale: float = 1.0
    #: (trace s, epoch reached on `syncsafe.timebase`, lag s) of every `reach`.
    log: list[tuple[float, float, float]] = field(default_factory=list)

    def epoch(self, t_s: float) -> float:
        """Wall epoch of trace time `t_s`."""
        return self.start_epoch + t_s / self.time_scale

    def now_s(self) -> float:
        """Trace seconds since the start, now."""
        return (timebase.now() - self.start_epoch) * self.time_scale

    def reach(self, t_s: float) -> None:
        target = self.epoch(t_s)
        while (left := target - timebase.now()) > 0:
            time.sleep(min(left, 0.5))
        now = timebase.now()
        self.log.append((t_s, now, now - target))

    @property
    def max_lag_s(self) -> float:
        return max((lag for _, _, lag in self.log), default=0.0)
