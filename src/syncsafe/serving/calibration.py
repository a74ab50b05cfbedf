"""Serving calibration: how much a merge and fleet pressure slow serving.

The calibrate stage fits these parameters to real replays and writes them as
JSON; the simulator and the `wa_calibrated` policy read them. Until a fit
exists the shipped defaults below stand in (flagged by `fitted: false`).

The service-time fields describe one request on an idle server (the model the
simulator runs is in `syncsafe.serving.simulator`):

    prefill_ms = base_ms + prefill_ms_per_token * prompt_tokens
    decode_ms  = decode_ms_per_token * output_tokens

and the multipliers that slow it down: fleet pressure
(`1 + pressure_slowdown * inference_pressure`), a merge window
(`merge_slowdown`) and a fuller batch
(`1 + batch_slowdown * (in_flight - 1) / max_batch`). The defaults stand for a
tiny Llama served by the vLLM CPU build: a median request (48 prompt, 24 output
tokens) takes ~0.27 s alone, and a full batch of 8 such requests saturates at
~15 requests/s without pressure and ~10 at full pressure, so queueing takes
over near `capacity_rps` when the fleet is pressured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from syncsafe.control.types import FleetSignals


#: A number or an array of numbers (the multipliers work elementwise).
Numeric = TypeVar("Numeric", float, np.ndarray)


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
    #: Fixed per-request cost (scheduling, tokenization), paid in the prefill phase.
    base_ms: Annotated[float, Field(ge=0)] = 10.0
    #: Prefill cost per prompt token on an idle server.
    prefill_ms_per_token: Annotated[float, Field(ge=0)] = 0.5
    #: Decode cost per output token on an idle server.
    decode_ms_per_token: Annotated[float, Field(ge=0)] = 10.0
    #: Concurrent requests the server batches; further arrivals wait in a FIFO queue.
    max_batch: Annotated[int, Field(ge=1)] = 8
    #: Batching cost: latency multiplier 1 + batch_slowdown * (in_flight - 1) / max_batch.
    batch_slowdown: Annotated[float, Field(ge=0)] = 1.0
    #: Sigma of the per-request log-normal latency residual (median 1).
    residual_sigma: Annotated[float, Field(ge=0)] = 0.2
    #: True once the calibrate stage has fitted the values to real replays.
    fitted: bool = False

    def expected_merge_cost(self, signals: FleetSignals) -> float:
        """Expected serving cost of a merge started now, in [0, ~1].

        The share of serving capacity in use (requests a merge would slow)
        times the extra latency a merge adds at the current pressure.
        """
        load = min(signals.arrival_rate / self.capacity_rps, 1.0)
        slowdown = (self.merge_slowdown - 1.0) * self.pressure_multiplier(signals.inference_pressure)
        return load * slowdown

    def prefill_ms(self, prompt_tokens: ArrayLike) -> np.ndarray:
        """Prefill time of each request on an idle server, before any slowdown."""
        return self.base_ms + self.prefill_ms_per_token * np.asarray(prompt_tokens, dtype=float)

    def decode_ms(self, output_tokens: ArrayLike) -> np.ndarray:
        """Decode time of each request on an idle server, before any slowdown."""
        return self.decode_ms_per_token * np.asarray(output_tokens, dtype=float)

    def pressure_multiplier(self, inference_pressure: Numeric) -> Numeric:
        """Latency multiplier of fleet inference pressure: 1 + pressure_slowdown * p."""
        return 1.0 + self.pressure_slowdown * inference_pressure

    def batch_multiplier(self, in_flight: Numeric) -> Numeric:
        """Latency multiplier of a batch holding `in_flight` requests (the request itself included)."""
        return 1.0 + self.batch_slowdown * (in_flight - 1.0) / self.max_batch


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
