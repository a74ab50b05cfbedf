"""Serving calibration: how much a merge and fleet pressure slow serving.

The calibrate stage fits these parameters to real replays and writes them as
JSON; the simulator and the `wa_calibrated` policy read them. Until a fit
exists the shipped defaults below stand in (flagged by `fitted: false`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from syncsafe.control.types import FleetSignals


class CalibrationError(ValueError):
    """A calibration file is missing or malformed."""


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Latency multiplier for requests served while a merge is active.
    merge_slowdown: Annotated[float, Field(ge=1)] = 1.8
    #: Extra latency multiplier per unit of inference pressure: 1 + pressure_slowdown * p.
    pressure_slowdown: Annotated[float, Field(ge=0)] = 0.6
    #: Requests/s the server sustains before queueing dominates.
    capacity_rps: Annotated[float, Field(gt=0)] = 8.0
    #: True once the calibrate stage has fitted the values to real replays.
    fitted: bool = False

    def expected_merge_cost(self, signals: FleetSignals) -> float:
        """Expected serving cost of a merge started now, in [0, ~1].

        The share of serving capacity in use (requests a merge would slow)
        times the extra latency a merge adds at the current pressure.
        """
        load = min(signals.arrival_rate / self.capacity_rps, 1.0)
        slowdown = (self.merge_slowdown - 1.0) * (1.0 + self.pressure_slowdown * signals.inference_pressure)
        return load * slowdown


def load_calibration(path: str | Path | None) -> Calibration:
    """The calibration at `path`, or the shipped defaults when `path` is None."""
    if path is None:
        return Calibration()
    path = Path(path)
    try:
        return Calibration.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CalibrationError(f"{path}: calibration file not found (run the calibrate stage or set it to null)") from None
    except ValidationError as err:
        raise CalibrationError(f"{path}: not a calibration file: {err}") from None
