"""The values that cross the policy boundary: reports in, a decision out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SyncEvent:
    """What one merge synced, as real learners report it: the fragment (0: the whole model when there is one),
    the bytes of its all-reduce buffer, what each island sends of it in a ring (2 x payload x (W - 1) / W),
    and the inner step its outer step is applied at (the merge's own step unless the islands train on while
    its all-reduce runs: `fragment_sync_delay` steps later, or -1: at the next merge, overlapped)."""

    fragment: int
    payload_bytes: int
    bytes_communicated: int
    applied_step: int


@dataclass(frozen=True)
class LearnerReport:
    """What one island tells the controller at the end of a control cycle."""

    island: int
    loss_start: float
    loss_end: float
    tokens_since_merge: int
    #: Inner steps since the island last merged.
    staleness_steps: int

    @property
    def relative_progress(self) -> float:
        """Relative loss drop over the cycle (positive while the island learns)."""
        return (self.loss_start - self.loss_end) / self.loss_start if self.loss_start > 0 else 0.0


@dataclass(frozen=True)
class FleetSignals:
    """The serving fleet at one moment: load and the pressures a merge competes with."""

    t_s: float
    busy: bool
    arrival_rate: float
    inference_pressure: float
    network_pressure: float
    checkpoint_pressure: float

    @property
    def pressure(self) -> float:
        """Fleet pressure: the most pressured of inference, network and checkpoint I/O."""
        return max(self.inference_pressure, self.network_pressure, self.checkpoint_pressure)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClockState:
    """Where the run stands when the policy is asked."""

    t_s: float
    step: int
    steps_since_merge: int
    min_h: int
    max_h: int
    cycle: int

    @property
    def staleness(self) -> float:
        """Steps since the last merge as a fraction of max_h (1 = a merge is forced)."""
        return min(self.steps_since_merge / self.max_h, 1.0)


@dataclass(frozen=True)
class Decision:
    """A policy's answer for one control cycle."""

    merge: bool
    reason: str
    score: float | None = None
    forced: bool = False
