"""The workload sections of params.yaml: generated request shapes and the regimes (synthetic and trace)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from syncsafe.config.base import Fraction, PositiveFloat, Strict

# --------------------------------------------------------------------------- traces


class RequestShape(Strict):
    """Token-length distributions of generated requests (log-normal, clipped)."""

    prompt_tokens_median: PositiveFloat = 48
    prompt_tokens_sigma: Annotated[float, Field(ge=0)] = 0.5
    prompt_tokens_max: Annotated[int, Field(ge=1)] = 256
    output_tokens_median: PositiveFloat = 24
    output_tokens_sigma: Annotated[float, Field(ge=0)] = 0.5
    output_tokens_max: Annotated[int, Field(ge=1)] = 128
    #: Coefficient of variation of per-step arrival counts (1 = Poisson; >1 = clumpier).
    arrival_cv: Annotated[float, Field(ge=1)] = 1.0


class TracesConfig(Strict):
    step_s: PositiveFloat = 0.5
    requests: RequestShape = RequestShape()


class _RegimeBase(Strict):
    duration_s: PositiveFloat
    #: Background network load from other jobs, 0..1.
    network_base: Fraction = 0.1
    #: Mean checkpoint writes per hour by other jobs sharing storage.
    checkpoints_per_hour: Annotated[float, Field(ge=0)] = 6.0
    checkpoint_s: PositiveFloat = 10.0
    #: Multiplier on the regime's request arrival rate (a load sweep's knob; a trace regime applies it on
    #: top of `rate_scale`). 1 leaves the regime as specified.
    load_scale: PositiveFloat = 1.0


class BurstyRegime(_RegimeBase):
    """Busy windows of `window_s` every `period_s`, the first starting at `phase_s`."""

    kind: Literal["bursty"]
    period_s: PositiveFloat = 120.0
    window_s: PositiveFloat = 30.0
    phase_s: Annotated[float, Field(ge=0)] = 0.0
    quiet_rate: PositiveFloat = 1.0
    busy_rate: PositiveFloat = 6.0
    #: Log-normal sigma of each burst's intensity around `busy_rate`.
    burst_jitter: Annotated[float, Field(ge=0)] = 0.2

    @model_validator(mode="after")
    def _window_fits_period(self) -> BurstyRegime:
        if self.window_s > self.period_s:
            raise ValueError(
                f"window_s ({self.window_s}) must not be longer than period_s ({self.period_s})"
            )
        if self.busy_rate < self.quiet_rate:
            raise ValueError(f"busy_rate ({self.busy_rate}) must be >= quiet_rate ({self.quiet_rate})")
        return self


class SteadyRegime(_RegimeBase):
    """Slow sinusoidal load: the 'mixed' regime, busy above `busy_above` of the peak."""

    kind: Literal["steady"]
    period_s: PositiveFloat = 300.0
    phase_s: Annotated[float, Field(ge=0)] = 0.0
    mean_rate: PositiveFloat = 3.0
    amplitude: Annotated[float, Field(ge=0, lt=1)] = 0.6
    busy_above: Fraction = 0.75


class PressureHeavyRegime(_RegimeBase):
    """High inference and network pressure that merges cannot avoid: random busy episodes."""

    kind: Literal["pressure_heavy"]
    base_rate: PositiveFloat = 4.0
    busy_rate: PositiveFloat = 7.0
    episodes_per_hour: Annotated[float, Field(ge=0)] = 40.0
    episode_s: PositiveFloat = 45.0
    network_base: Fraction = 0.6


class TraceRegime(_RegimeBase):
    """Segments of a recorded request trace: seed s replays [offset_s + s * stride_s, + duration_s).

    Rules (syncsafe.traces.trace_regime): arrivals re-based to 0; `output_scale`
    scales output lengths; `rate_scale` thins (< 1) or replicates (> 1) requests, seeded; token counts clipped to the
    served model's context; the load timeline derived from the segment's own
    arrivals (trailing `smooth_s` token load against levels of the whole trace).
    """

    kind: Literal["trace"]
    #: CSV/JSONL/Parquet file; a relative path is read from the directory the stage runs in (the project root).
    path: str
    format: Literal["azure", "burstgpt", "mooncake", "requests"] = "requests"
    #: Trace second where seed 0's segment starts.
    offset_s: Annotated[float, Field(ge=0)] = 0.0
    #: Seed s starts at offset_s + s * stride_s; null = duration_s (segments side by side).
    stride_s: PositiveFloat | None = None
    #: Arrival-rate multiplier to fit the served model.
    rate_scale: PositiveFloat = 1.0
    #: Output-length multiplier (each request keeps at least one output token): lets a small served model take
    #: the trace's arrival pattern at its own rate where the trace's answers are longer than it can serve.
    output_scale: PositiveFloat = 1.0
    #: Trailing window (s) over which the token load is averaged.
    smooth_s: PositiveFloat = 30.0
    #: busy where the smoothed token load exceeds this quantile of the whole trace's.
    busy_quantile: Annotated[float, Field(gt=0, lt=1)] = 0.75
    #: inference_pressure = smoothed token load / this quantile of the whole trace's (capped at 1).
    pressure_quantile: Annotated[float, Field(gt=0, le=1)] = 0.99

    @property
    def segment_stride_s(self) -> float:
        return self.duration_s if self.stride_s is None else self.stride_s


Regime = Annotated[BurstyRegime | SteadyRegime | PressureHeavyRegime | TraceRegime, Field(discriminator="kind")]
