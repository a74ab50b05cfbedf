"""The params.yaml schema: every stage's settings, validated before anything runs.

`load_params` reads params.yaml and returns a `Params` model or raises
`ConfigError` with one line per problem, each naming the key
(`regimes.bursty.window_s: ...`). Unknown keys are errors, not silently
ignored: a typo must never fall back to a default.

Keys that other tools edit and that keep their names: `profile`, `seeds`,
`regimes.<name>.{kind, duration_s, period_s, window_s, phase_s}`,
`merge.window_s`, `merge.min_gap_s`, `schedules.random_draws`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from syncsafe.errors import BadInput

#: Controller policies the trace-time controller can run (derived schedules
#: `matched_random`, `no_sync` and `offline_bound` come from the schedules stage).
CONTROLLER_POLICIES = (
    "fixed_h",
    "pressure_gate",
    "random_deferral",
    "wa_diloco",
    "wa_calibrated",
    "wa_forecast",
    "wa_seasonal",
    "wa_lookahead",
)


#: vLLM server arguments its identity depends on (loopback bind, free port, random
#: served name): the replay sets them, params and DAGs may not.
RESERVED_SERVER_ARGS = ("--host", "--port", "--served-model-name", "--uds")


class ConfigError(BadInput):
    """params.yaml is missing, malformed or describes an impossible run."""


class _Strict(BaseModel):
    # `.inf` / `.nan` in params.yaml are refused like any impossible value, naming the key.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


# --------------------------------------------------------------------------- traces


class RequestShape(_Strict):
    """Token-length distributions of generated requests (log-normal, clipped)."""

    prompt_tokens_median: PositiveFloat = 48
    prompt_tokens_sigma: Annotated[float, Field(ge=0)] = 0.5
    prompt_tokens_max: Annotated[int, Field(ge=1)] = 256
    output_tokens_median: PositiveFloat = 24
    output_tokens_sigma: Annotated[float, Field(ge=0)] = 0.5
    output_tokens_max: Annotated[int, Field(ge=1)] = 128
    #: Coefficient of variation of per-step arrival counts (1 = Poisson; >1 = clumpier).
    arrival_cv: Annotated[float, Field(ge=1)] = 1.0


class TracesConfig(_Strict):
    step_s: PositiveFloat = 0.5
    requests: RequestShape = RequestShape()


class _RegimeBase(_Strict):
    duration_s: PositiveFloat
    #: Background network load from other jobs, 0..1.
    network_base: Fraction = 0.1
    #: Mean checkpoint writes per hour by other jobs sharing storage.
    checkpoints_per_hour: Annotated[float, Field(ge=0)] = 6.0
    checkpoint_s: PositiveFloat = 10.0


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

    Rules (syncsafe.traces.trace_regime): arrivals re-based to 0; `rate_scale`
    thins (< 1) or replicates (> 1) requests, seeded; token counts clipped to the
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


# --------------------------------------------------------------------------- control


class MergeConfig(_Strict):
    """The merge budget a matched-random draw copies."""

    #: How long one merge occupies the fleet (all-reduce + outer step + checkpoint).
    window_s: PositiveFloat = 8.0
    #: Least idle time between the end of one merge window and the next start.
    min_gap_s: Annotated[float, Field(ge=0)] = 10.0


class FixedHConfig(_Strict):
    h: Annotated[int, Field(ge=1)] = 8


class PressureGateConfig(_Strict):
    #: Merge only while fleet pressure is at or below this.
    max_pressure: Fraction = 0.5


class RandomDeferralConfig(_Strict):
    defer_prob: Fraction = 0.5


class ScoreWeights(_Strict):
    """Weights of the workload-aware merge score (see control/policies.py)."""

    w_progress: Annotated[float, Field(ge=0)] = 0.5
    w_staleness: Annotated[float, Field(ge=0)] = 1.0
    w_pressure: Annotated[float, Field(ge=0)] = 1.0
    #: A relative loss drop per cycle of this size counts as full progress.
    progress_scale: PositiveFloat = 0.05
    threshold: float = 0.25


class ForecastConfig(_Strict):
    ewma_alpha: Annotated[float, Field(gt=0, le=1)] = 0.5
    w_forecast: Annotated[float, Field(ge=0)] = 0.5
    #: Seasonal forecaster: shortest and longest period it looks for.
    min_period_s: PositiveFloat = 20.0
    max_period_s: PositiveFloat = 900.0
    #: Autocorrelation a period needs before the seasonal forecast is trusted.
    min_autocorr: Fraction = 0.5


class CalibratedConfig(_Strict):
    w_cost: Annotated[float, Field(ge=0)] = 1.5
    #: Calibration JSON written by the calibrate stage; null = shipped defaults.
    calibration: str | None = None


class LookaheadConfig(_Strict):
    """wa_lookahead (control/lookahead.py): merge now only if now is the cheapest feasible cycle."""

    #: Trace seconds of past fleet samples the cost forecasts and spread come from.
    history_s: PositiveFloat = 600.0
    #: Cost of deferring a merge one cycle, in units of the cost spread per unit of
    #: wa_diloco's progress + staleness terms.
    w_defer: Annotated[float, Field(ge=0)] = 0.25


class ControlConfig(_Strict):
    #: Trace seconds one inner step takes on the `trace` clock.
    step_s: PositiveFloat = 5.0
    #: Inner steps per control cycle; no merge before this many steps.
    min_h: Annotated[int, Field(ge=1)] = 4
    #: A merge is forced once this many steps have passed since the last one.
    max_h: Annotated[int, Field(ge=1)] = 16
    policies: list[Literal[CONTROLLER_POLICIES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(CONTROLLER_POLICIES), min_length=1
    )
    fixed_h: FixedHConfig = FixedHConfig()
    pressure_gate: PressureGateConfig = PressureGateConfig()
    random_deferral: RandomDeferralConfig = RandomDeferralConfig()
    score: ScoreWeights = ScoreWeights()
    forecast: ForecastConfig = ForecastConfig()
    calibrated: CalibratedConfig = CalibratedConfig()
    lookahead: LookaheadConfig = LookaheadConfig()

    @model_validator(mode="after")
    def _h_bounds(self) -> ControlConfig:
        if self.min_h > self.max_h:
            raise ValueError(f"min_h ({self.min_h}) must be <= max_h ({self.max_h})")
        if not self.min_h <= self.fixed_h.h <= self.max_h:
            raise ValueError(
                f"fixed_h.h ({self.fixed_h.h}) must lie between min_h ({self.min_h}) and max_h ({self.max_h})"
            )
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies must not repeat a name")
        return self

    @property
    def cycle_s(self) -> float:
        """Trace seconds one control cycle (min_h inner steps) takes."""
        return self.min_h * self.step_s


class HarnessConfig(_Strict):
    """The learner-progress model that stands in for training in the stress harness."""

    islands: Annotated[int, Field(ge=1)] = 4
    tokens_per_step: Annotated[int, Field(ge=1)] = 40960
    loss_floor: Annotated[float, Field(ge=0)] = 2.0
    loss_span: PositiveFloat = 6.0
    #: Tokens at which the loss has fallen to half its span above the floor.
    half_loss_tokens: PositiveFloat = 2.0e6
    #: Local steps after which a stale pseudo-gradient is worth 1/e of a fresh one.
    staleness_decay_steps: PositiveFloat = 24.0
    loss_noise: Annotated[float, Field(ge=0)] = 0.01


class ModelShape(_Strict):
    """cpu profile: the tiny Llama built locally (vocab comes from the tokenizer)."""

    hidden_size: Annotated[int, Field(ge=8)] = 128
    num_layers: Annotated[int, Field(ge=1)] = 2
    #: head_dim = hidden_size / num_heads; 64 suits vLLM's CPU attention kernels.
    num_heads: Annotated[int, Field(ge=1)] = 2
    intermediate_size: Annotated[int, Field(ge=8)] = 256
    max_position_embeddings: Annotated[int, Field(ge=16)] = 512


class HubSource(_Strict):
    """gpu profile: a Hugging Face model to continue training and a streamed dataset."""

    model: str = "HuggingFaceTB/SmolLM2-135M"
    dataset: str = "HuggingFaceFW/fineweb-edu"
    dataset_config: str | None = "sample-10BT"
    text_field: str = "text"


class TrainConfig(_Strict):
    """Real DiLoCo training: islands, inner AdamW, outer Nesterov step, faults."""

    islands: Annotated[int, Field(ge=1)] = 2
    model: ModelShape = ModelShape()
    hub: HubSource = HubSource()
    vocab_size: Annotated[int, Field(ge=300)] = 1024
    #: Bytes of stdlib source text in the cpu-profile corpus.
    corpus_bytes: Annotated[int, Field(ge=10_000)] = 1_500_000
    seq_len: Annotated[int, Field(ge=2)] = 64
    batch_size: Annotated[int, Field(ge=1)] = 4
    inner_lr: PositiveFloat = 3e-3
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    outer_lr: PositiveFloat = 0.7
    outer_momentum: Annotated[float, Field(ge=0, lt=1)] = 0.9
    #: Weight each island's pseudo-gradient by the tokens it trained on since the last merge.
    token_weighted: bool = False
    #: Held-out batches for the final eval loss; `merge_eval_batches` after every merge.
    eval_batches: Annotated[int, Field(ge=1)] = 8
    merge_eval_batches: Annotated[int, Field(ge=0)] = 2
    #: Every collective fails after this long instead of hanging on a lost island.
    collective_timeout_s: PositiveFloat = 60.0
    #: A lost island either fails the stage, naming it, or the run resumes from
    #: the last merge checkpoint on the surviving islands.
    on_island_failure: Literal["fail", "continue"] = "fail"
    #: Intra-op threads per island process.
    torch_threads: Annotated[int, Field(ge=1)] = 1
    #: Where islands train: auto = CUDA (NCCL) in the gpu profile, CPU (gloo) in the cpu profile;
    #: `cpu` runs the gpu profile's hub model and dataset path on CPU (a rehearsal without GPUs).
    device: Literal["auto", "cpu", "cuda"] = "auto"

    def uses_cuda(self, profile: str) -> bool:
        return self.device == "cuda" or (self.device == "auto" and profile == "gpu")

    @model_validator(mode="after")
    def _shapes(self) -> TrainConfig:
        if self.model.hidden_size % self.model.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.model.hidden_size}) must be a multiple of model.num_heads ({self.model.num_heads})"
            )
        return self


class SloConfig(_Strict):
    """The serving SLO: fixed bounds, or the same seed's no-sync p95 times `multiplier`."""

    multiplier: Annotated[float, Field(gt=0)] = 1.5
    ttft_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


class SimulatorReplay(_Strict):
    #: Calibration JSON (relative to the project root); null = the calibrate-fit stage's
    #: runs/calibration/calibration.json when present, else the shipped defaults (`fitted: false` either way).
    calibration: str | None = None
    #: Simulated replays the SLO oracle's local search may spend per controller schedule.
    oracle_evals: Annotated[int, Field(ge=2)] = 40


class VllmReplay(_Strict):
    """Replay against a real vLLM server: a subset of schedules, sized for the profile."""

    enabled: bool = True
    #: Python of the environment vLLM is installed in (`make vllm-env` builds .venv-vllm).
    python: str = ".venv-vllm/bin/python"
    #: Model to serve: a path or hub name; null = the trained export (cpu) / train.hub.model (gpu).
    model: str | None = None
    regimes: list[str] = Field(default_factory=lambda: ["bursty"], min_length=1)
    #: Seeds to replay; null = the first four of `seeds` (one to fit, three held out).
    seeds: list[int] | None = None
    #: Seeds the calibrate-fit stage fits the simulator on; null = the first replayed seed.
    fit_seeds: list[int] | None = None
    #: Seeds the fidelity stage judges the simulator on (never fitted on); null = the other replayed seeds.
    held_out_seeds: list[int] | None = None
    #: Controllers replayed (with their draws) on every replayed seed besides analysis.primary.policy; null = none.
    policies: list[str] | None = None
    #: Matched-random draws replayed per controller.
    draws: Annotated[int, Field(ge=0)] = 3
    #: Replay each seed's no-sync schedule again after the others (the mechanism gate's drift control);
    #: the replays in between run in a seeded random order.
    repeat_no_sync: bool = True
    #: Probe the server before the replays (iteration time by batch composition, with and without merges).
    profile: bool = True
    #: Wall seconds per profile probe.
    profile_probe_s: PositiveFloat = 2.5
    #: Trace seconds replayed per wall second (1 = real time).
    time_scale: PositiveFloat = 4.0
    #: Replay only the first this-many trace seconds of each schedule.
    max_trace_s: PositiveFloat = 240.0
    startup_timeout_s: PositiveFloat = 900.0
    request_timeout_s: PositiveFloat = 120.0
    #: In-flight cap of the load generator; waits it causes are recorded per request.
    max_in_flight: Annotated[int, Field(ge=1)] = 256
    server_args: list[str] = Field(
        default_factory=lambda: ["--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8",
                                 "--kv-cache-memory-bytes", "64M", "--shutdown-timeout", "2",
                                 "--disable-uvicorn-access-log"]
    )
    #: Trace seconds of the first seed's load sent (and discarded) before the first measured replay.
    warmup_s: Annotated[float, Field(ge=0)] = 20.0
    #: What runs beside the server during merge windows.
    interference: Literal["merge", "stress"] = "merge"
    interference_workers: Annotated[int, Field(ge=1)] = 2
    scrape_interval_s: PositiveFloat = 0.5
    #: A replay with a larger share of failed requests is marked invalid (`valid: false`) and licenses nothing.
    max_failure_rate: Fraction = 0.02
    #: A replay whose send lag p99 (actual send after scheduled arrival) passes this is marked invalid.
    max_send_lag_p99_ms: PositiveFloat = 1000.0

    @model_validator(mode="after")
    def _server_identity_is_ours(self) -> VllmReplay:
        for arg in self.server_args:
            flag = arg.split("=", 1)[0]
            if flag in RESERVED_SERVER_ARGS:
                raise ValueError(f"server_args: {flag} is not allowed (the server binds to 127.0.0.1 on a free "
                                 "port with a random served-model name chosen per start)")
        return self

    @model_validator(mode="after")
    def _fit_and_held_out_apart(self) -> VllmReplay:
        both = set(self.fit_seeds or []) & set(self.held_out_seeds or [])
        if both:
            raise ValueError(f"fit_seeds and held_out_seeds share {sorted(both)}: a held-out seed must never be fitted on")
        for name in ("fit_seeds", "held_out_seeds"):
            extra = set(getattr(self, name) or []) - set(self.seeds or getattr(self, name) or [])
            if self.seeds is not None and extra:
                raise ValueError(f"{name}: {sorted(extra)} not among replay.vllm.seeds {self.seeds}")
        return self


class LiveConfig(_Strict):
    """`syncsafe live`: the controller as a sidecar beside a real vLLM server, on the wall clock.

    Server, load generator and merge-work settings come from `replay.vllm`.
    """

    #: Run the `live` stage (off on the cpu profile: it does not fit the run budget).
    enabled: bool = False
    regimes: list[str] = Field(default_factory=lambda: ["bursty"], min_length=1)
    #: Seeds to run; null = every seed.
    seeds: list[Annotated[int, Field(ge=0)]] | None = None
    #: The controller policy the live run gates merges with.
    policy: Literal[CONTROLLER_POLICIES] = "wa_forecast"  # type: ignore[valid-type]
    #: Trace seconds per wall second (arrivals, control cycles and merge windows alike).
    time_scale: PositiveFloat = 4.0
    #: Trace seconds each live run lasts (its action space's duration).
    duration_s: PositiveFloat = 120.0
    #: Trace seconds of load sent (and discarded) once per server before the measured runs.
    warmup_s: Annotated[float, Field(ge=0)] = 20.0
    #: Wall seconds between /metrics scrapes; signals older than `stale_after_s` are not trusted.
    scrape_interval_s: PositiveFloat = 0.25
    stale_after_s: PositiveFloat = 1.5
    #: Wall seconds over which rates and occupancy are averaged.
    signal_window_s: PositiveFloat = 2.0
    #: Sequences the server runs at once (its --max-num-seqs): occupancy = (running + waiting) / this.
    capacity_seqs: Annotated[int, Field(ge=1)] = 8
    #: Arrival rate (requests per trace second) at which the node counts as fully loaded.
    reference_rps: PositiveFloat = 6.0
    #: Inference pressure at or above which the node counts as busy.
    busy_pressure: Fraction = 0.5


class ReplayConfig(_Strict):
    slo: SloConfig = SloConfig()
    #: Inference pressure at or above this counts as high pressure (pressure p95 ratio).
    high_pressure: Fraction = 0.6
    simulator: SimulatorReplay = SimulatorReplay()
    vllm: VllmReplay = VllmReplay()


class SchedulesConfig(_Strict):
    #: Matched-random draws per controller schedule.
    random_draws: Annotated[int, Field(ge=1)] = 20
    #: Where controller schedules come from: real training runs or the stress harness.
    source: Literal["train", "harness"] = "train"


# --------------------------------------------------------------------------- analysis


class PrimaryTest(_Strict):
    """The one (policy, regime) test declared before the data: tested first, at alpha."""

    policy: str = "wa_diloco"
    regime: str = "bursty"


class FidelityTargets(_Strict):
    """What the simulator must reproduce on held-out real replays before its verdicts count."""

    #: Largest relative error of a replay's E2E p95 (|sim - real| / real), per held-out replay.
    p95_rel_error_max: PositiveFloat = 0.15
    #: Largest absolute error of a replay's SLO-violation rate, in percentage points.
    slo_abs_error_pp_max: PositiveFloat = 3.0
    #: Paired sync ratio simulated / real must lie in [low, high].
    sync_ratio_low: PositiveFloat = 0.8
    sync_ratio_high: PositiveFloat = 1.25

    @model_validator(mode="after")
    def _ordered(self) -> FidelityTargets:
        if self.sync_ratio_low > self.sync_ratio_high:
            raise ValueError(f"sync_ratio_low ({self.sync_ratio_low}) must be <= sync_ratio_high ({self.sync_ratio_high})")
        return self


class AnalysisConfig(_Strict):
    """The evidence protocol's settings (see README, "The evidence protocol")."""

    #: Family-wise error rate of the whole verdict table.
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    primary: PrimaryTest = PrimaryTest()
    #: A policy whose eval loss may exceed fixed_h's by more than this share is flagged "hurts training".
    loss_margin: Annotated[float, Field(ge=0)] = 0.01
    fidelity: FidelityTargets = FidelityTargets()


# --------------------------------------------------------------------------- root


class Params(_Strict):
    profile: Literal["cpu", "gpu"] = "cpu"
    seeds: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    traces: TracesConfig = TracesConfig()
    regimes: dict[str, Regime] = Field(min_length=1)
    merge: MergeConfig = MergeConfig()
    control: ControlConfig = ControlConfig()
    harness: HarnessConfig = HarnessConfig()
    train: TrainConfig = TrainConfig()
    schedules: SchedulesConfig = SchedulesConfig()
    replay: ReplayConfig = ReplayConfig()
    live: LiveConfig = LiveConfig()
    analysis: AnalysisConfig = AnalysisConfig()

    @model_validator(mode="after")
    def _consistent(self) -> Params:
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must not repeat a seed")
        for name in self.regimes:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"regime name {name!r} must be letters, digits, '_' or '-'")
        step = self.traces.step_s
        for key, value in (("merge.window_s", self.merge.window_s), ("merge.min_gap_s", self.merge.min_gap_s)):
            if not _is_multiple(value, step):
                raise ValueError(f"{key} ({value}) must be a multiple of traces.step_s ({step})")
        if self.merge.min_gap_s > self.control.cycle_s:
            raise ValueError(
                f"merge.min_gap_s ({self.merge.min_gap_s}) must be <= control.min_h * control.step_s "
                f"({self.control.cycle_s}) so that controller schedules keep the gap matched draws copy"
            )
        for name, regime in self.regimes.items():
            if regime.duration_s < self.control.cycle_s + self.merge.window_s:
                raise ValueError(
                    f"regimes.{name}.duration_s ({regime.duration_s}) is shorter than one control "
                    f"cycle plus one merge window ({self.control.cycle_s + self.merge.window_s})"
                )
            if not _is_multiple(regime.duration_s, step):
                raise ValueError(f"regimes.{name}.duration_s must be a multiple of traces.step_s ({step})")
        if self.profile == "cpu" and self.train.seq_len > self.train.model.max_position_embeddings:
            raise ValueError(f"train.seq_len ({self.train.seq_len}) must be <= train.model.max_position_embeddings "
                             f"({self.train.model.max_position_embeddings}) in the cpu profile")
        vllm = self.replay.vllm
        for key, chosen, allowed in (
            ("replay.vllm.regimes", vllm.regimes, list(self.regimes)),
            ("replay.vllm.policies", vllm.policies or [], self.control.policies),
            ("replay.vllm.seeds", vllm.seeds or [], self.seeds),
        ):
            unknown = [x for x in chosen if x not in allowed]
            if unknown:
                raise ValueError(f"{key}: {unknown} not among {allowed}")
        primary = self.analysis.primary
        if primary.regime not in self.regimes:
            raise ValueError(f"analysis.primary.regime: {primary.regime!r} not among {list(self.regimes)}")
        if primary.policy not in self.control.policies:
            raise ValueError(f"analysis.primary.policy: {primary.policy!r} not among {self.control.policies}")
        for key, chosen, allowed in (("live.regimes", self.live.regimes, list(self.regimes)),
                                     ("live.seeds", self.live.seeds or [], self.seeds)):
            unknown = [x for x in chosen if x not in allowed]
            if unknown:
                raise ValueError(f"{key}: {unknown} not among {allowed}")
        if self.live.duration_s < self.control.cycle_s + self.merge.window_s:
            raise ValueError(f"live.duration_s ({self.live.duration_s}) is shorter than one control cycle plus one "
                             f"merge window ({self.control.cycle_s + self.merge.window_s})")
        if vllm.draws > self.schedules.random_draws:
            raise ValueError(f"replay.vllm.draws ({vllm.draws}) must be <= schedules.random_draws ({self.schedules.random_draws})")
        return self


def _is_multiple(value: float, step: float) -> bool:
    ratio = value / step
    return math.isclose(ratio, round(ratio), abs_tol=1e-9)


def _format_error(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        if loc[:1] == ["regimes"] and len(loc) >= 3:
            del loc[2]  # the `kind` tag pydantic inserts for the discriminated union
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the params schema)"
        got = "" if e["type"] in ("missing", "value_error", "extra_forbidden") else f" (got {e.get('input')!r})"
        where = ".".join(loc)
        lines.append(f"{source}: {where + ': ' if where else ''}{msg}{got}")
    return "\n".join(lines)


def parse_params(raw: Any, source: str = "params.yaml") -> Params:
    """Validate an already-loaded mapping; raise ConfigError naming the bad key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(source, err)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1}): "
                                  "each key may be given once")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str, source: str) -> Any:
    """Parse YAML text with duplicate keys refused; raise ConfigError naming `source`."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    return parse_params(read_yaml(text, str(path)), str(path))
