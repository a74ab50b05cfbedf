"""The safe action when live signals cannot be trusted.

`SafeFallback` wraps any policy. While `problem()` (e.g.
`LiveSignals.problem`) names something wrong, the server unhealthy or its
`/metrics` unreachable or stale, the wrapped policy is not asked: the
decision is the documented safe action, defer until `max_h` inner steps have
passed since the last merge, then merge (the shared forced-merge rule). Every
such cycle is counted and its reason starts with `degraded:`, so a run that
fell back is marked degraded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from syncsafe.control.policies import Policy
from syncsafe.control.types import ClockState, Decision, FleetSignals, LearnerReport

DEGRADED = "degraded"


class SafeFallback(Policy):
    def __init__(self, inner: Policy, problem: Callable[[], str | None]) -> None:
        self.inner = inner
        self.problem = problem
        self.name = inner.name
        self.degraded_cycles = 0
        self._why = ""

    def observe(self, samples: Sequence[FleetSignals]) -> None:
        self.inner.observe(samples)

    def decide(self, reports: Sequence[LearnerReport], signals: FleetSignals, clock: ClockState) -> Decision:
        why = self.problem()
        if why is None:
            return self.inner.decide(reports, signals, clock)
        self.degraded_cycles += 1
        self._why = why
        decision = super().decide(reports, signals, clock)  # min_h / forced max_h, else _decide
        return Decision(decision.merge, f"{DEGRADED}: {why}; safe action: {decision.reason}", None, decision.forced)

    def _decide(self, reports, signals, clock):
        return Decision(False, f"defer until max_h {clock.max_h} ({clock.steps_since_merge} steps since merge)")
