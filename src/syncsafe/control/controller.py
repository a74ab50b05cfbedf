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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from syncsafe.control.clock import TRACE_CLOCK, Clock
from syncsafe.control.policies import Policy
from syncsafe.control.signals import TimelineSignals
from syncsafe.control.types import ClockState, LearnerReport, SyncEvent


class Learners(Protocol):
    def train_cycle(self, steps: int) -> Sequence[LearnerReport]: ...

    def merge(self) -> SyncEvent | None:
        """Merge every learner now; what the merge synced (None where the learners are simulated)."""
        ...


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
    """One line of the decision log: trace-time facts only, so a rerun writes the same bytes."""

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
    #: The sync event of a merge: its window in trace time (`start_s`, `end_s`) and, from real islands, the
    #: fragment synced and its bytes (`SyncEvent`); None when the cycle did not merge.
    sync: dict[str, Any] | None = None


@dataclass
class ControlResult:
    """Where the loop stands: trace time, counters, merges so far and the decision log.

    It is also the controller's resumable state: a run checkpointed after a
    merge continues from a copy of it (see `run_controller(state=...)`).
    """

    merge_starts_s: list[float] = field(default_factory=list)
    decisions: list[DecisionRecord] = field(default_factory=list)
    t_s: float = 0.0
    step: int = 0
    steps_since_merge: int = 0
    cycle: int = 0
    #: Wall-clock microseconds of each `policy.decide` call (benchmarks, tracking); never
    #: written to the decision log or the resumable state.
    decide_us: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        state = asdict(self)
        del state["decide_us"]
        return state

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ControlResult:
        raw = {k: v for k, v in raw.items() if k != "decide_us"}
        raw["decisions"] = [DecisionRecord(**{k: v for k, v in d.items() if k != "decide_us"})
                            for d in raw["decisions"]]
        return cls(**raw)


def run_controller(
    policy: Policy,
    learners: Learners,
    signals: TimelineSignals,
    plan: ControlPlan,
    state: ControlResult | None = None,
    on_merge: Callable[[ControlResult], None] | None = None,
    timebase: Clock = TRACE_CLOCK,
) -> ControlResult:
    """Drive `learners` through the trace, asking `policy` every cycle.

    `state` resumes a run (the policy must be restored alongside it);
    `on_merge(state)` is called after every merge, e.g. to checkpoint.
    `timebase` is reached before every decision: trace time (default) or the
    wall clock of a live run (`syncsafe.control.clock`).
    """
    result = state if state is not None else ControlResult()
    while result.t_s + plan.cycle_s <= plan.duration_s + 1e-9:
        reports = list(learners.train_cycle(plan.min_h))
        last_seen = result.decisions[-1].t_s if result.decisions else 0.0  # the policy saw up to here
        result.t_s += plan.cycle_s
        result.step += plan.min_h
        result.steps_since_merge += plan.min_h
        t, since = result.t_s, result.steps_since_merge
        timebase.reach(t)
        policy.observe(signals.between(last_seen, t))
        now = signals.at(t)
        clock = ClockState(t_s=t, step=result.step, steps_since_merge=since, min_h=plan.min_h, max_h=plan.max_h,
                           cycle=result.cycle)
        started = time.perf_counter()
        decision = policy.decide(reports, now, clock)
        result.decide_us.append((time.perf_counter() - started) * 1e6)
        fits = t + plan.window_s <= plan.duration_s + 1e-9
        merge = decision.merge and fits
        reason = decision.reason if fits or not decision.merge else f"{decision.reason}; no merge: window would pass trace end"
        result.decisions.append(
            DecisionRecord(
                cycle=result.cycle,
                t_s=round(t, 6),
                step=result.step,
                steps_since_merge=since,
                merge=merge,
                forced=decision.forced and merge,
                reason=reason,
                score=decision.score,
                signals=now.as_dict(),
                reports=[asdict(r) for r in reports],
            )
        )
        result.cycle += 1
        if merge:
            if result.merge_starts_s:
                gap = t - (result.merge_starts_s[-1] + plan.window_s)
                assert gap >= plan.min_gap_s - 1e-9, f"controller broke min_gap_s: gap {gap}"
            result.merge_starts_s.append(round(t, 6))
            event = learners.merge()
            result.decisions[-1].sync = {"start_s": round(t, 6), "end_s": round(t + plan.window_s, 6),
                                         **(asdict(event) if event is not None else {})}
            result.t_s += plan.window_s
            result.steps_since_merge = 0
            if on_merge is not None:
                on_merge(result)
    return result
