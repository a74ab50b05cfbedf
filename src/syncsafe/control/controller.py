"""The trace-time controller loop shared by the stress harness and training.

Each control cycle the learners train `min_h` inner steps, the trace clock
advances `min_h * step_s` seconds, the policy sees the fleet samples of the
cycle and decides at the cycle's trace time. A merge starts then, occupies
the fleet for `window_s` trace seconds (islands wait), and resets the step
count. A run is therefore exactly reproducible on any machine.

Learners are anything with `train_cycle(steps) -> reports` and `merge()`:
the learner-progress model of the harness, or the real DiLoCo islands.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from syncsafe.control.policies import Policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.control.types import ClockState, LearnerReport


class Learners(Protocol):
    def train_cycle(self, steps: int) -> Sequence[LearnerReport]: ...

    def merge(self) -> None: ...


@dataclass(frozen=True)
class ControlPlan:
    step_s: float
    min_h: int
    max_h: int
    window_s: float
    min_gap_s: float
    duration_s: float

    @property
    def cycle_s(self) -> float:
        return self.min_h * self.step_s


@dataclass
class DecisionRecord:
    """One line of the decision log."""

    cycle: int
    t_s: float
    step: int
    steps_since_merge: int
    merge: bool
    forced: bool
    reason: str
    score: float | None
    signals: dict[str, Any]
    reports: list[dict[str, Any]]
    decide_us: float


@dataclass
class ControlResult:
    merge_starts_s: list[float] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)


def run_controller(policy: Policy, learners: Learners, signals: TimelineSignals, plan: ControlPlan) -> ControlResult:
    """Drive `learners` through the trace, asking `policy` every cycle."""
    result = ControlResult()
    t = 0.0
    step = since = cycle = 0
    last_seen = 0.0
    while t + plan.cycle_s <= plan.duration_s + 1e-9:
        reports = list(learners.train_cycle(plan.min_h))
        t += plan.cycle_s
        step += plan.min_h
        since += plan.min_h
        policy.observe(signals.between(last_seen, t))
        last_seen = t
        now = signals.at(t)
        clock = ClockState(t_s=t, step=step, steps_since_merge=since, min_h=plan.min_h, max_h=plan.max_h, cycle=cycle)
        started = time.perf_counter()
        decision = policy.decide(reports, now, clock)
        decide_us = (time.perf_counter() - started) * 1e6
        fits = t + plan.window_s <= plan.duration_s + 1e-9
        merge = decision.merge and fits
        reason = decision.reason if fits or not decision.merge else f"{decision.reason}; no merge: window would pass trace end"
        result.decisions.append(
            DecisionRecord(
                cycle=cycle,
                t_s=round(t, 6),
                step=step,
                steps_since_merge=since,
                merge=merge,
                forced=decision.forced and merge,
                reason=reason,
                score=decision.score,
                signals=now.as_dict(),
                reports=[asdict(r) for r in reports],
                decide_us=decide_us,
            )
        )
        if merge:
            if result.merge_starts_s:
                gap = t - (result.merge_starts_s[-1] + plan.window_s)
                assert gap >= plan.min_gap_s - 1e-9, f"controller broke min_gap_s: gap {gap}"
            result.merge_starts_s.append(round(t, 6))
            learners.merge()
            t += plan.window_s
            since = 0
        cycle += 1
    return result
