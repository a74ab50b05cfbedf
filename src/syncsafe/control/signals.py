"""Fleet signals on the trace clock: read from a load timeline."""

from __future__ import annotations

import pandas as pd

from syncsafe.control.types import FleetSignals


class TimelineSignals:
    """Fleet signals at trace time `t`: the timeline row in force at `t`."""

    def __init__(self, timeline: pd.DataFrame) -> None:
        self._t = timeline["t_s"].to_numpy()
        self.step_s = float(self._t[1] - self._t[0]) if len(self._t) > 1 else 1.0
        self._rows = [
            FleetSignals(
                t_s=float(r.t_s),
                busy=bool(r.busy),
                arrival_rate=float(r.arrival_rate),
                inference_pressure=float(r.inference_pressure),
                network_pressure=float(r.network_pressure),
                checkpoint_pressure=float(r.checkpoint_pressure),
            )
            for r in timeline.itertuples(index=False)
        ]

    def _index(self, t_s: float) -> int:
        return min(max(int(t_s // self.step_s), 0), len(self._rows) - 1)

    def at(self, t_s: float) -> FleetSignals:
        return self._rows[self._index(t_s)]

    def between(self, t0_s: float, t1_s: float) -> list[FleetSignals]:
        """Samples observed in (t0_s, t1_s]: what a monitor saw since the last look."""
        lo = self._index(t0_s) + 1 if t0_s > 0 else 0
        return self._rows[lo : self._index(t1_s) + 1]
