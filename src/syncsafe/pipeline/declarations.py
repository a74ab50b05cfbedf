"""Every pipeline stage, declared once: params, inputs, outputs, entry function, DAG queue.

dvc.yaml (`syncsafe dvc-yaml`), the thin `stages/<stage>.py` entries (through
`syncsafe.pipeline.runner`), the `syncsafe` stage commands and the nightly DAG's
task order are all read from `STAGES`. Paths are the project-root-relative forms
of `syncsafe.artifacts.layout`; ``{regime}`` stands for the regime of a
per-regime stage (DVC's ``${key}``).

This module imports nothing of the package but the layout: the runner loads it
in every stage process, and the entries are named as strings (imported
lazily), so a stage's import closure holds its own entry alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

from syncsafe.artifacts import layout as L

#: `regimes` of a stage: one run per regime of params.yaml (DVC `foreach`), one run per
#: regime of `live.regimes` inside one DVC stage, or one run for all regimes.
RegimeLoop = Literal["params", "live", "none"]
REGIME = "{regime}"


@dataclass(frozen=True)
class Plot:
    path: str
    x: str
    y: str
    template: str = "linear"


@dataclass(frozen=True)
class StageSpec:
    """One DVC stage and what runs it."""

    name: str
    description: str
    entry: str  # "module:function"; called as function(params, root, regime, params_path)
    regimes: RegimeLoop
    params: tuple[str, ...]  # params.yaml keys (DVC params, and the params the stage run logs)
    inputs: tuple[str, ...]  # data it reads: other stages' outputs or shipped files
    outputs: tuple[str, ...]
    queue: Literal["cpu", "gpu"] = "cpu"  # where the nightly DAG runs it
    system_metrics: bool = False  # sample CPU/GPU/memory while it runs
    exclusive: bool = False  # times a real server: `syncsafe run` starts it on an idle machine, nothing beside it
    cores: tuple[str, ...] = ()  # params keys whose product is the cores it keeps busy; none: one core
    switch: str | None = None  # a params key that, when false, turns the stage into `entry`'s `off`
    notes: tuple[str, ...] = ()  # comment lines for dvc.yaml
    metrics: tuple[str, ...] = ()  # DVC metrics files (not cached)
    plots: tuple[Plot, ...] = ()
    # "module:function" of params -> the wall seconds the stage declares it takes (its budget), for the
    # time left of `syncsafe run` before the stage was ever timed on this machine
    declared_wall: str | None = None

    @property
    def per_regime(self) -> bool:
        return self.regimes == "params"

    @property
    def script(self) -> str:
        return f"stages/{self.name.replace('-', '_')}.py"

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0]

    def argv(self, regime: str) -> list[str]:
        """The stage's command after ``python``, for `regime` (DVC's ``${key}`` in dvc.yaml)."""
        return [self.script, *(["--regime", regime] if self.per_regime else [])]

    def paths(self, kind: Literal["inputs", "outputs", "params"], regime: str | None) -> list[str]:
        """`inputs`, `outputs` or `params` with ``{regime}`` filled in (None: DVC's ``${key}``)."""
        value = "${key}" if regime is None else regime
        return [p.replace(REGIME, value) for p in getattr(self, kind)]


_E = "syncsafe.pipeline.entries"
#: Shipped request traces of `kind: trace` regimes (inputs of the traces stage, not a stage output).
SHIPPED_TRACES = "assets/traces"


#: The keys of `replay.vllm` the server profile depends on (the server, its load target, the warm-up, the probes).
PROFILE_KEYS = ("enabled", "python", "model", "regimes", "server_args", "engine_profile", "engine_profile_probe_s", "time_scale",
                "target_utilisation", "capacity_ttft_factor", "capacity_probe_s", "startup_timeout_s",
                "request_timeout_s", "max_in_flight", "warmup_s", "warmup_alpha", "warmup_stable_probes",
                "warmup_max_s", "interference", "interference_workers", "client_cpus")


def _p(*paths: PurePath) -> tuple[str, ...]:
    return tuple(path.as_posix() for path in paths)


STAGES: tuple[StageSpec, ...] = (
    StageSpec(
        name="traces",
        description="load timeline and request list per regime and seed",
        entry=f"{_E}.traces:run",
        regimes="params",
        params=("seeds", "traces", "regimes.{regime}",
                "replay.vllm.server_args",  # --max-model-len: the token limit trace requests are clipped to
                "train.model.max_position_embeddings"),
        inputs=(SHIPPED_TRACES,),
        outputs=_p(L.traces_rel(REGIME)),
    ),
    StageSpec(
        name="train",
        description="DiLoCo islands as processes, merges gated by each policy, per regime x policy x seed",
        entry=f"{_E}.train:run",
        regimes="params",
        params=("profile", "seeds", "merge", "control", "train", "schedules.source", "regimes.{regime}"),
        inputs=_p(L.traces_rel(REGIME)),
        outputs=_p(L.train_rel(REGIME)),
        queue="gpu",
        system_metrics=True,
        cores=("train.islands", "train.torch_threads"),
    ),
    StageSpec(
        name="schedules",
        description="controller schedules plus matched-random, offline-bound and no-sync baselines",
        entry=f"{_E}.schedules:run",
        regimes="params",
        params=("seeds", "merge", "control", "harness", "schedules", "regimes.{regime}"),
        inputs=_p(L.traces_rel(REGIME), L.train_rel(REGIME)),
        outputs=_p(L.schedule_set_rel(REGIME)),
    ),
    StageSpec(
        name="schedule-index",
        description="join the per-regime schedule indexes into runs/schedules/index.csv",
        entry=f"{_E}.schedule_index:run",
        regimes="none",
        params=("seeds", "regimes", "control.policies"),
        inputs=_p(L.SCHEDULE_SETS),
        outputs=_p(L.SCHEDULE_INDEX),
    ),
    StageSpec(
        name="profile-vllm",
        description="the server profile: capacity per regime, time scale, noise and engine costs of a real vLLM server",
        entry=f"{_E}.profile_vllm:run",
        regimes="none",
        # what the measurement depends on, nothing more: a new budget or policy list reuses the profile
        params=("seeds", "merge.window_s", "analysis.primary.regime", "train.source", "train.hub.model",
                *(f"replay.vllm.{key}" for key in PROFILE_KEYS)),
        inputs=_p(L.TRACES, L.TRAIN),
        outputs=_p(L.SERVER_PROFILE),
        queue="gpu",
        system_metrics=True,
        exclusive=True,
        declared_wall="syncsafe.realarm.design:declared_profile_wall_s",
        notes=("measured once per machine and model, reused until these inputs change; re-profile on purpose",
               "with `syncsafe run --redo profile-vllm` (or `dvc repro --force profile-vllm`)"),
    ),
    StageSpec(
        name="replay-vllm",
        description="the configured subset of schedules against a real vLLM server",
        entry=f"{_E}.replay_vllm:run",
        regimes="none",
        params=("seeds", "regimes", "control", "merge", "replay.slo", "replay.high_pressure", "replay.vllm",
                "analysis.primary", "analysis.gate_ratio_threshold"),
        inputs=_p(L.TRACES, L.TRAIN, L.SCHEDULE_INDEX, L.SERVER_PROFILE),
        outputs=_p(L.VLLM_SET),
        queue="gpu",
        system_metrics=True,
        exclusive=True,
        declared_wall="syncsafe.realarm.design:declared_wall_s",
    ),
    StageSpec(
        name="calibrate-fit",
        description="fit the iteration-level simulator to the server profile and the fit seeds' vLLM replays",
        entry=f"{_E}.calibrate_fit:run",
        regimes="none",
        params=("replay", "analysis.gate_ratio_threshold", "analysis.fidelity_refits"),
        inputs=_p(L.VLLM_SET, L.SERVER_PROFILE, L.SCHEDULE_SETS, L.TRACES),
        outputs=_p(L.CALIBRATION),
        notes=("real vLLM replays of the fit seeds + the server profile only: no simulator replay, so no cycle",),
    ),
    StageSpec(
        name="replay-simulator",
        description="every schedule against the calibrated simulator under each seed's load",
        entry=f"{_E}.replay_simulator:run",
        regimes="params",
        params=("control", "merge", "regimes.{regime}", "replay.slo", "replay.high_pressure", "replay.simulator"),
        inputs=_p(L.traces_rel(REGIME), L.schedule_set_rel(REGIME), L.FITTED_CALIBRATION, L.VLLM_PLAN),
        outputs=_p(L.replay_set_rel(L.SIMULATOR, REGIME)),
    ),
    StageSpec(
        name="headroom",
        description="each headroom policy's matched-random -> oracle gap split into its online bound and foresight",
        entry=f"{_E}.headroom:run",
        regimes="params",
        params=("seeds", "control", "merge", "harness", "schedules.random_draws", "regimes.{regime}", "replay.slo",
                "replay.high_pressure", "replay.simulator", "analysis.headroom_policies"),
        inputs=_p(L.traces_rel(REGIME), L.FITTED_CALIBRATION, L.VLLM_PLAN),
        outputs=_p(L.headroom_rel(REGIME)),
        notes=("simulator, the stress harness's learners: per seed the best point of the policy's knob grid at",
               "its merge count, chosen with hindsight (the online bound), between matched random and the oracle"),
    ),
    StageSpec(
        name="replay-index",
        description="join the replay sets of the regimes, seeds and policies in params into runs/replay/index.csv",
        entry=f"{_E}.replay_index:run",
        regimes="none",
        params=("seeds", "regimes", "control.policies"),
        inputs=_p(L.REPLAY_SETS),
        outputs=_p(L.REPLAY_INDEX),
    ),
    StageSpec(
        name="fidelity",
        description="the simulator's calibration judged on the held-out seeds' real replays",
        entry=f"{_E}.fidelity:run",
        regimes="none",
        params=("replay", "analysis.fidelity", "analysis.primary"),
        inputs=_p(L.VLLM_SET, L.replay_set_rel(L.SIMULATOR), L.FITTED_CALIBRATION, L.REFITS, L.SCHEDULE_SETS,
                  L.TRACES),
        outputs=_p(L.FIDELITY),
        notes=("held-out seeds' real replays, simulated with the calibration the simulator replays used",),
    ),
    StageSpec(
        name="live",
        description="the controller as a sidecar beside a real vLLM server on the wall clock, gating real merges",
        entry=f"{_E}.live:run",
        regimes="live",
        params=("live", "replay.slo", "replay.high_pressure", "replay.vllm", "control", "merge", "train"),
        inputs=_p(L.TRACES, L.TRAIN),
        outputs=_p(L.LIVE),
        queue="gpu",
        system_metrics=True,
        exclusive=True,
        switch="live.enabled",
        notes=("the controller as a sidecar beside a real vLLM server; with live.enabled: false (the cpu",
               "default: it does not fit the run budget) it only writes an empty runs/live/index.csv"),
    ),
    StageSpec(
        name="analyze",
        description="the evidence protocol (sync-excess, envelope, rank test, multiplicity, claim tiers) and the report",
        entry=f"{_E}.analyze:run",
        regimes="none",
        params=("seeds", "regimes", "control.policies", "analysis"),
        inputs=_p(L.CALIBRATION, L.FIDELITY, L.REPLAY_INDEX, L.REPLAY_SETS, L.SCHEDULE_INDEX, L.TRAIN, L.LIVE,
                  L.HEADROOM),
        outputs=_p(*(L.report_rel(name) for name in (L.POLICY_TABLE_FILE, L.ENVELOPE_FILE, L.REPORT_FILE,
                                                     L.ENVELOPE_FIGURE_FILE, L.FIGURES_DIR))),
        metrics=_p(L.report_rel(L.REPORT_METRICS_FILE)),
        plots=(Plot(L.report_rel(L.LOSS_CURVES_FILE).as_posix(), x="step", y="loss"),),
    ),
)

BY_NAME: dict[str, StageSpec] = {s.name: s for s in STAGES}


def stage(name: str) -> StageSpec:
    """The declaration of stage `name` (KeyError names the known stages)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no stage {name!r} (have {sorted(BY_NAME)})") from None


def overlaps(a: str, b: str) -> bool:
    """Whether two project paths (``{regime}`` compared as a wildcard segment) are one inside the other."""
    pa, pb = a.split("/"), b.split("/")
    return all(x == y or REGIME in (x, y) for x, y in zip(pa, pb))


def upstream(spec: StageSpec, stages: Iterable[StageSpec] = STAGES) -> list[str]:
    """The stages whose outputs `spec` reads, in declaration order."""
    return [o.name for o in stages if o is not spec
            and any(overlaps(i, out) for i in spec.inputs for out in (*o.outputs, *o.metrics))]


def topological_order(stages: Iterable[StageSpec] = STAGES) -> list[str]:
    """Stage names, each after every stage it reads from (ties in declaration order)."""
    stages = list(stages)
    after = {s.name: set(upstream(s, stages)) for s in stages}
    order: list[str] = []
    while len(order) < len(stages):
        ready = [s.name for s in stages if s.name not in order and after[s.name] <= set(order)]
        if not ready:
            raise ValueError(f"stages read each other's outputs in a cycle: {sorted(set(after) - set(order))}")
        order.append(ready[0])
    return order
