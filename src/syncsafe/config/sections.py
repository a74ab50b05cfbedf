"""The pipeline sections of params.yaml: merges, control, harness, training, replay, live, schedules, analysis."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from syncsafe.config.base import (CONTROLLER_POLICIES, RESERVED_SERVER_ARGS, Fraction, PerRegimeFloat, PolicyName,
                                  PositiveFloat, Strict, max_num_seqs)

# --------------------------------------------------------------------------- control


class MergeConfig(Strict):
    """The merge budget a matched-random draw copies."""

    #: How long one merge occupies the fleet (all-reduce + outer step + checkpoint).
    window_s: PositiveFloat = 8.0
    #: Least idle time between the end of one merge window and the next start.
    min_gap_s: Annotated[float, Field(ge=0)] = 10.0


class FixedHConfig(Strict):
    h: Annotated[int, Field(ge=1)] = 8


class PressureGateConfig(Strict):
    #: Merge only while fleet pressure is at or below this.
    max_pressure: Fraction = 0.5


class RandomDeferralConfig(Strict):
    defer_prob: Fraction = 0.5


class ScoreWeights(Strict):
    """Weights of the workload-aware merge score (see control/policies.py)."""

    w_progress: Annotated[float, Field(ge=0)] = 0.5
    w_staleness: Annotated[float, Field(ge=0)] = 1.0
    w_pressure: Annotated[float, Field(ge=0)] = 1.0
    #: A relative loss drop per cycle of this size counts as full progress.
    progress_scale: PositiveFloat = 0.05
    threshold: float = 0.25


class ForecastConfig(Strict):
    ewma_alpha: Annotated[float, Field(gt=0, le=1)] = 0.5
    w_forecast: Annotated[float, Field(ge=0)] = 0.5
    #: Seasonal forecaster: shortest and longest period it looks for.
    min_period_s: PositiveFloat = 20.0
    max_period_s: PositiveFloat = 900.0
    #: Autocorrelation a period needs before the seasonal forecast is trusted.
    min_autocorr: Fraction = 0.5


class CalibratedConfig(Strict):
    w_cost: Annotated[float, Field(ge=0)] = 1.5
    #: Calibration JSON written by the calibrate stage; null = shipped defaults.
    calibration: str | None = None
    #: Merge link model JSON (`benchmarks/bench_merge_link.py --out`, fitted on test hosts): merges are priced by
    #: how long they take at the regime's network pressure; null = every merge equally long.
    merge_link: str | None = None


class LookaheadConfig(Strict):
    """wa_lookahead (control/lookahead.py): merge now only if now is the cheapest feasible cycle."""

    #: Trace seconds of past fleet samples the cost forecasts and spread come from.
    history_s: PositiveFloat = 600.0
    #: Cost of deferring a merge one cycle, in units of the cost spread per unit of
    #: wa_diloco's progress + staleness terms.
    w_defer: Annotated[float, Field(ge=0)] = 0.25
    #: Control cycles ahead the induction looks at most (null: every cycle up to the forced merge);
    #: 1 compares now with the next cycle only (the `wa_lookahead-lookahead` ablation).
    horizon_cycles: Annotated[int, Field(ge=1)] | None = None


class ControlConfig(Strict):
    #: Trace seconds one inner step takes on the `trace` clock.
    step_s: PositiveFloat = 5.0
    #: Inner steps per control cycle; no merge before this many steps.
    min_h: Annotated[int, Field(ge=1)] = 4
    #: A merge is forced once this many steps have passed since the last one.
    max_h: Annotated[int, Field(ge=1)] = 16
    policies: list[PolicyName] = Field(
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


class HarnessConfig(Strict):
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


class ModelShape(Strict):
    """`train.source: builtin`: the tiny Llama built locally (vocab comes from the tokenizer)."""

    hidden_size: Annotated[int, Field(ge=8)] = 128
    num_layers: Annotated[int, Field(ge=1)] = 2
    #: head_dim = hidden_size / num_heads; 64 suits vLLM's CPU attention kernels.
    num_heads: Annotated[int, Field(ge=1)] = 2
    intermediate_size: Annotated[int, Field(ge=8)] = 256
    max_position_embeddings: Annotated[int, Field(ge=16)] = 512


class HubSource(Strict):
    """`train.source: hub`: a Hugging Face model to continue training and a streamed dataset."""

    model: str = "HuggingFaceTB/SmolLM2-135M"
    dataset: str = "HuggingFaceFW/fineweb-edu"
    dataset_config: str | None = "sample-10BT"
    text_field: str = "text"


class SyncConfig(Strict):
    """How the islands sync at a merge (`syncsafe.diloco.outer`, `syncsafe.diloco.fragments`).

    `full`: every parameter's pseudo-gradient in one all-reduce, then the outer step (DiLoCo). `streaming`
    (Streaming DiLoCo): the model is cut into `fragments` contiguous layer groups and each merge syncs the next
    fragment in turn, so with a merge every H/F steps every fragment syncs every H steps, at offsets f H/F;
    a fragment's all-reduce is launched at the merge and its outer step applied `fragment_sync_delay` inner
    steps later while the islands train on, its local parameters then `fragment_update_alpha` x local +
    (1 - alpha) x global (0: the global ones, as DiLoCo). `overlapped` (one-step delay): a merge launches the
    round's all-reduce and the islands train on at once; its outer step is applied at the next merge
    (`overlap_rounds` 1; 0: at once, the full merge), each island keeping its own progress of the round on
    top of the global parameters until its average arrives.
    """

    mode: Literal["full", "streaming", "overlapped"] = "full"
    fragments: Annotated[int, Field(ge=1)] = 1
    fragment_update_alpha: Annotated[float, Field(ge=0, lt=1)] = 0.0
    #: Streaming: inner steps between a fragment's all-reduce launch and its outer step (at most control.min_h).
    fragment_sync_delay: Annotated[int, Field(ge=0)] = 0
    #: Overlapped: merges between a round's all-reduce launch and its outer step (0: the full merge).
    overlap_rounds: Annotated[int, Field(ge=0, le=1)] = 1

    @model_validator(mode="after")
    def _settings_of_the_mode(self) -> SyncConfig:
        streaming = {"fragments": (self.fragments, 1), "fragment_update_alpha": (self.fragment_update_alpha, 0.0),
                     "fragment_sync_delay": (self.fragment_sync_delay, 0)}
        if self.mode != "streaming":
            set_ = [f"{key} ({value:g})" for key, (value, default) in streaming.items() if value != default]
            if set_:
                raise ValueError(f"{', '.join(set_)}: streaming settings; with mode {self.mode} they are "
                                 f"{', '.join(f'{key} {default:g}' for key, (_, default) in streaming.items())}")
        if self.mode != "overlapped" and "overlap_rounds" in self.model_fields_set:
            raise ValueError(f"overlap_rounds ({self.overlap_rounds}) is an overlapped setting; with mode "
                             f"{self.mode} leave it out")
        return self


class TrainConfig(Strict):
    """Real DiLoCo training: islands, inner AdamW, outer Nesterov step, faults."""

    islands: Annotated[int, Field(ge=1)] = 2
    model: ModelShape = ModelShape()
    hub: HubSource = HubSource()
    vocab_size: Annotated[int, Field(ge=300)] = 1024
    #: Bytes of stdlib source text in the builtin corpus (`source: builtin`).
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
    #: An island whose heartbeat (over the rendezvous store) stops for this long is lost: its peers exit
    #: naming it and its host, on one machine or across hosts, without waiting out a collective.
    heartbeat_timeout_s: PositiveFloat = 10.0
    #: A lost island either fails the stage, naming it, or the run resumes from
    #: the last merge checkpoint on the surviving islands.
    on_island_failure: Literal["fail", "continue"] = "fail"
    #: Intra-op threads per island process.
    torch_threads: Annotated[int, Field(ge=1)] = 1
    #: Where islands train: `cpu` (gloo) or `cuda` (NCCL, one GPU per island process, bfloat16 for a hub model).
    device: Literal["cpu", "cuda"] = "cpu"
    #: What islands train and on which text: `builtin` = a tiny Llama built from `train.model` on the offline
    #: stdlib corpus (`corpus_bytes`) with a BPE tokenizer trained on it (`vocab_size`); `hub` = `train.hub`'s
    #: model, tokenizer and dataset (hub ids or local directories). Also what the vLLM replay serves when
    #: there is no trained export.
    source: Literal["builtin", "hub"] = "builtin"
    sync: SyncConfig = SyncConfig()

    @model_validator(mode="after")
    def _shapes(self) -> TrainConfig:
        if self.source == "builtin" and self.sync.fragments > self.model.num_layers:
            raise ValueError(f"sync.fragments ({self.sync.fragments}) exceeds model.num_layers "
                             f"({self.model.num_layers}): a fragment holds one layer at least")
        if self.model.hidden_size % self.model.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.model.hidden_size}) must be a multiple of model.num_heads ({self.model.num_heads})"
            )
        if self.heartbeat_timeout_s >= self.collective_timeout_s:
            raise ValueError(f"heartbeat_timeout_s ({self.heartbeat_timeout_s:g}) must be below collective_timeout_s "
                             f"({self.collective_timeout_s:g}): a lost island is named before a collective gives up")
        return self


class SloConfig(Strict):
    """The serving SLO: fixed bounds, or the same seed's no-sync p95 times `multiplier`."""

    multiplier: Annotated[float, Field(gt=0)] = 1.5
    ttft_ms: PositiveFloat | None = None
    e2e_ms: PositiveFloat | None = None


class SimulatorReplay(Strict):
    #: Calibration JSON (relative to the project root); null = the calibrate-fit stage's
    #: runs/calibration/calibration.json when present, else the shipped defaults (`fitted: false` either way).
    calibration: str | None = None
    #: Simulated replays the SLO oracle's local search may spend per controller schedule.
    oracle_evals: Annotated[int, Field(ge=2)] = 40


class VllmReplay(Strict):
    """Replay against a real vLLM server: a plan pinned by params (or sized to the server, the budget and the
    gate's power where they leave it null), checked against the server profile.

    See `syncsafe.realarm.design` (what is replayed), `.capacity` (the load) and `.sizing` (the span).
    """

    enabled: bool = True
    #: Python of the environment vLLM is installed in (`make vllm-env` builds .venv-vllm).
    python: str = ".venv-vllm/bin/python"
    #: Model to serve: a path or hub name; null = the trained export, else the model training starts from
    #: (`train.source`).
    model: str | None = None
    regimes: list[str] = Field(default_factory=lambda: ["bursty"], min_length=1)
    #: Seeds to replay; null = the first two of `seeds` (one to fit, one held out: `design.DEFAULT_N_SEEDS`).
    seeds: list[int] | None = None
    #: Seeds the calibrate-fit stage fits the simulator on; null = half the replayed seeds, two at least once one
    #: is left to hold out (`design.default_fit_count`).
    fit_seeds: list[int] | None = None
    #: Seeds the fidelity stage judges the simulator on (never fitted on); null = the other replayed seeds.
    held_out_seeds: list[int] | None = None
    #: Controllers replayed (with their draws) besides analysis.primary.policy, added in this order while
    #: the budget allows; null = none. Each adds 2 + draws replays per seed.
    policies: list[str] | None = Field(default_factory=list)
    #: Span-matched random draws replayed per controller: at most this many, fewer when the budget needs it.
    draws: Annotated[int, Field(ge=1)] = 1
    #: No-sync replays per seed: first, interleaved, last (the gate's drift controls and noise floor).
    no_sync_controls: Annotated[int, Field(ge=3)] = 3
    #: Profile the engine before the replays (iteration time by batch composition, with and without merges).
    engine_profile: bool = True
    #: Wall seconds per engine-profile probe.
    engine_profile_probe_s: PositiveFloat = 2.5
    #: Trace seconds replayed per wall second, one for every regime or per regime (a mapping); the plan is then
    #: pinned and the server profile only checks it (refused when the busiest window would run over
    #: `target_utilisation` of the measured capacity). null (or a regime the mapping leaves out) = set from the
    #: measured capacity, which differs by 2x between machines of one kind: a plan that does not reproduce.
    #: The default is the cpu profile's pin; an overlay removes a regime's pin with `{regime: null}`.
    time_scale: PerRegimeFloat | None = Field(default_factory=lambda: {"bursty": 2.5})
    #: Share of the measured capacity the busiest window of the no-sync load runs at.
    target_utilisation: Annotated[float, Field(gt=0, le=0.9)] = 0.7
    #: Capacity: the highest probed rate whose TTFT p95 stays within this many times the light-load TTFT p95.
    capacity_ttft_factor: Annotated[float, Field(gt=1)] = 3.0
    #: Wall seconds per capacity probe.
    capacity_probe_s: PositiveFloat = 6.0
    #: Trace seconds [0, span_s) every real replay covers, one for every regime or per regime (a mapping);
    #: null (or a regime the mapping leaves out) = sized by the gate's power within `budget_s`.
    span_s: PerRegimeFloat | None = Field(default_factory=lambda: {"bursty": 120.0})
    #: Wall seconds the planned replays may take (server start, profile and capacity probes not counted).
    budget_s: PositiveFloat = 900.0
    #: What the powered plan leaves of `budget_s` lengthens every span alike; false = the budget is a ceiling
    #: and each regime is replayed at its shortest powered span (a plan that does not grow with the budget).
    fill_budget: bool = False
    #: Power of the mechanism gate the plan is sized for, at the profiled effect.
    power_target: Annotated[float, Field(gt=0, lt=1)] = 0.8
    startup_timeout_s: PositiveFloat = 900.0
    request_timeout_s: PositiveFloat = 120.0
    #: In-flight cap of the load generator; waits it causes are recorded per request.
    max_in_flight: Annotated[int, Field(ge=1)] = 256
    server_args: list[str] = Field(
        default_factory=lambda: ["--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "64",
                                 "--stream-interval", "8",
                                 "--kv-cache-memory-bytes", "64M", "--shutdown-timeout", "2",
                                 "--disable-uvicorn-access-log"]
    )
    #: Trace seconds of the primary regime's first seed sent (and discarded) per warm-up probe; 0 = no warm-up.
    warmup_s: Annotated[float, Field(ge=0)] = 20.0
    #: The warm-up repeats its probe until the decode pace stops falling: the slope of log pace over the last
    #: `warmup_stable_probes` probes is not negative at one-sided level `warmup_alpha`; or until `warmup_max_s`
    #: wall seconds are spent (`syncsafe.realarm.warmup`).
    warmup_alpha: Annotated[float, Field(gt=0, lt=1)] = 0.1
    warmup_stable_probes: Annotated[int, Field(ge=3)] = 5
    warmup_max_s: Annotated[float, Field(ge=0)] = 90.0
    #: The request floor of every planned replay: requests in the span, and arrivals inside merge windows
    #: of each replay with merges (enough to estimate a p95 per replay).
    min_requests: Annotated[int, Field(ge=1)] = 150
    min_merge_active: Annotated[int, Field(ge=0)] = 10
    #: Noise floor: a regime whose no-sync controls' p95 follows their replay order (the drift test's p below
    #: this, `realarm.evidence.controls_drift`) gets one more control per seed; still below with them, its
    #: seeds are left out of the evidence with the reason. A stationary server is left out at most this often.
    control_alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.01
    #: The plan's prior for how much a whole replay's log p95 E2E wanders from replay to replay: the planned
    #: gate power carries it, as the measured bounds carry the controls' own estimate
    #: (`realarm.gate.ReplayNoise`). 0.17: pooled over the controls of two cold cpu-default runs.
    replay_sd: Annotated[float, Field(ge=0, le=2)] = 0.17
    #: Bootstrap resamples of each replay's p95 and SLO-rate interval.
    bootstrap_resamples: Annotated[int, Field(ge=100)] = 1000
    #: What runs beside the server during merge windows.
    interference: Literal["merge", "stress"] = "merge"
    interference_workers: Annotated[int, Field(ge=1)] = 2
    #: CPUs set apart for the client (load generator, scraper); the server and merge work get the rest.
    client_cpus: Annotated[int, Field(ge=1)] = 1
    scrape_interval_s: PositiveFloat = 0.5
    #: A replay with a larger share of failed requests is marked invalid (`valid: false`) and licenses nothing.
    max_failure_rate: Fraction = 0.02
    #: A replay whose send lag p99 (actual send after scheduled arrival) passes this is marked invalid.
    max_send_lag_p99_ms: PositiveFloat = 50.0
    #: A replay whose /metrics scrapes failed more often than this is marked invalid.
    max_scrape_failure_rate: Fraction = 0.2
    #: Foreign CPU (cores, mean over a replay) above which the machine counts as busy: the replay is
    #: retried once after `busy_retry_pause_s`, then marked invalid ("machine busy").
    max_foreign_cpu: Annotated[float, Field(ge=0)] = 0.1
    busy_sample_s: PositiveFloat = 1.0
    busy_retry_pause_s: Annotated[float, Field(ge=0)] = 20.0

    def pinned_time_scale(self, regime: str) -> float | None:
        """The regime's time scale pinned by params; None when the profile sizes it."""
        return self.time_scale.get(regime) if isinstance(self.time_scale, dict) else self.time_scale

    def pinned_span_s(self, regime: str) -> float | None:
        """The regime's span pinned by params; None when the plan sizes it."""
        return self.span_s.get(regime) if isinstance(self.span_s, dict) else self.span_s

    @model_validator(mode="after")
    def _server_identity_is_ours(self) -> VllmReplay:
        max_num_seqs(self.server_args)  # a malformed --max-num-seqs is refused here, before any server starts
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


class LiveConfig(Strict):
    """`syncsafe live`: the controller as a sidecar beside a real vLLM server, on the wall clock.

    Server, load generator and merge-work settings come from `replay.vllm`.
    """

    #: Run the `live` stage (off on the cpu profile: it does not fit the run budget).
    enabled: bool = False
    regimes: list[str] = Field(default_factory=lambda: ["bursty"], min_length=1)
    #: Seeds to run; null = every seed.
    seeds: list[Annotated[int, Field(ge=0)]] | None = None
    #: The controller policy the live run gates merges with.
    policy: PolicyName = "wa_forecast"
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
    capacity_seqs: Annotated[int, Field(ge=1)] = 64
    #: Arrival rate (requests per trace second) at which the node counts as fully loaded.
    reference_rps: PositiveFloat = 6.0
    #: Inference pressure at or above which the node counts as busy.
    busy_pressure: Fraction = 0.5


class ReplayConfig(Strict):
    slo: SloConfig = SloConfig()
    #: Inference pressure at or above this counts as high pressure (pressure p95 ratio).
    high_pressure: Fraction = 0.6
    simulator: SimulatorReplay = SimulatorReplay()
    vllm: VllmReplay = VllmReplay()


class SchedulesConfig(Strict):
    #: Matched-random draws per controller schedule.
    random_draws: Annotated[int, Field(ge=1)] = 20
    #: Where controller schedules come from: real training runs or the stress harness.
    source: Literal["train", "harness"] = "train"


# --------------------------------------------------------------------------- analysis


class PrimaryTest(Strict):
    """The one (policy, regime) test declared before the data: tested first, at alpha."""

    policy: str = "wa_diloco"
    regime: str = "bursty"


class FidelityTargets(Strict):
    """What the simulator must reproduce on held-out real replays before its verdicts count.

    The defaults are the protocol's targets and also its limits: a user may demand more (lower errors, a
    narrower ratio band), never less.
    """

    #: Largest relative error of a replay's E2E p95 (|sim - real| / real), per held-out replay.
    p95_rel_error_max: Annotated[float, Field(gt=0, le=0.15)] = 0.15
    #: Largest absolute error of a replay's SLO-violation rate, in percentage points.
    slo_abs_error_pp_max: Annotated[float, Field(gt=0, le=3.0)] = 3.0
    #: The paired sync ratio (merge-active p95 / the same requests' p95 in no-sync), simulated / real,
    #: must lie in [sync_ratio_paired_low, sync_ratio_paired_high].
    sync_ratio_paired_low: Annotated[float, Field(ge=0.8)] = 0.8
    sync_ratio_paired_high: Annotated[float, Field(gt=0, le=1.25)] = 1.25

    @model_validator(mode="after")
    def _ordered(self) -> FidelityTargets:
        if self.sync_ratio_paired_low > self.sync_ratio_paired_high:
            raise ValueError(f"sync_ratio_paired_low ({self.sync_ratio_paired_low}) must be <= "
                             f"sync_ratio_paired_high ({self.sync_ratio_paired_high})")
        return self


class AnalysisConfig(Strict):
    """The evidence protocol's settings (see README, "The evidence protocol")."""

    #: Family-wise error rate of the whole verdict table (at most 0.1: a verdict at a laxer level claims nothing).
    alpha: Annotated[float, Field(gt=0, le=0.1)] = 0.05
    primary: PrimaryTest = PrimaryTest()
    #: A policy whose eval loss may exceed fixed_h's by more than this share is flagged "hurts training"
    #: (at most 0.01: a user may demand more, never less).
    loss_margin: Annotated[float, Field(ge=0, le=0.01)] = 0.01
    #: The mechanism gate passes when the lower 95 % bound of the drift-corrected paired sync ratio exceeds
    #: this (a user may demand more, never less).
    gate_ratio_threshold: Annotated[float, Field(ge=1.05)] = 1.05
    fidelity: FidelityTargets = FidelityTargets()
    #: Refits of the calibration on the fit seeds' replays shocked at the server's replay wander
    #: (`analysis.calibration.refits`): the held-out fidelity bounds carry the fit's run-to-run variation
    #: through them. 0: the bounds carry the held-out replays' wander only.
    fidelity_refits: Annotated[int, Field(ge=0)] = 12
    #: Policies whose matched-random -> oracle gap the headroom stage splits per regime into an online bound
    #: and what only foresight buys (each needs a knob grid: `syncsafe.tuning.knobs.DEFAULT_GRIDS`).
    headroom_policies: list[PolicyName] = ["wa_diloco", "wa_lookahead"]
