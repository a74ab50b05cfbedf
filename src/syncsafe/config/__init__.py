"""The params.yaml schema: every stage's settings, validated before anything runs.

`load_params` reads params.yaml and returns a `Params` model or raises
`ConfigError` with one line per problem, each naming the key
(`regimes.bursty.window_s: ...`). Unknown keys are errors, not silently
ignored: a typo must never fall back to a default.

`profile` is a label, never read for behaviour: what runs where is spelled
by explicit settings (`train.device`, `train.source`, ...). The label must
match `overlays`, the profile overlays the params were composed from
(`syncsafe.profiles.compose`), so a hand-set label cannot make a hybrid.

Keys that other tools edit and that keep their names: `profile`, `seeds`,
`regimes.<name>.{kind, duration_s, period_s, window_s, phase_s}`,
`merge.window_s`, `merge.min_gap_s`, `schedules.random_draws`.

The sections' models live in `config.workload` (traces, regimes) and
`config.sections` (everything else); this module joins them into `Params`
and reads the file. Every model is importable from `syncsafe.config`.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, model_validator

from syncsafe.config.base import (
    ABLATABLE_TERMS,
    CONTROLLER_POLICIES,
    PolicyName,
    RESERVED_SERVER_ARGS,
    ConfigError,
    Fraction,
    PositiveFloat,
    Strict,
    UNION_TAGS,
    max_num_seqs,
    policy_label,
    split_policy,
)
from syncsafe.config.sections import (
    AnalysisConfig,
    CalibratedConfig,
    ControlConfig,
    FidelityTargets,
    FixedHConfig,
    ForecastConfig,
    HarnessConfig,
    HubSource,
    LiveConfig,
    LookaheadConfig,
    MergeConfig,
    ModelShape,
    PressureGateConfig,
    PrimaryTest,
    RandomDeferralConfig,
    ReplayConfig,
    SchedulesConfig,
    ScoreWeights,
    SimulatorReplay,
    SloConfig,
    SyncConfig,
    TrainConfig,
    VllmReplay,
)
from syncsafe.config.workload import BurstyRegime, PressureHeavyRegime, Regime, RequestShape, SteadyRegime, TraceRegime, TracesConfig

__all__ = ["ABLATABLE_TERMS", "AnalysisConfig", "BurstyRegime", "CONTROLLER_POLICIES", "CalibratedConfig", "ConfigError", "ControlConfig", "FidelityTargets", "FixedHConfig", "ForecastConfig", "Fraction", "HarnessConfig", "HubSource", "LiveConfig", "LookaheadConfig", "MergeConfig", "ModelShape", "PolicyName", "PositiveFloat", "PressureGateConfig", "PressureHeavyRegime", "PrimaryTest", "RESERVED_SERVER_ARGS", "RandomDeferralConfig", "Regime", "ReplayConfig", "RequestShape", "SchedulesConfig", "ScoreWeights", "SimulatorReplay", "SloConfig", "SteadyRegime", "Strict", "SyncConfig", "TraceRegime", "TracesConfig", "TrainConfig", "VllmReplay", "BASE_PROFILE", "max_num_seqs", "policy_label", "split_policy", "Params", "load_params", "profile_label", "parse_params", "read_yaml", "apply_overrides"]

# --------------------------------------------------------------------------- root

#: The `profile` label of params.yaml itself (no overlay applied).
BASE_PROFILE = "cpu"


class Params(Strict):
    #: A label only (tracking tags, reports): the overlays these params were composed from, joined by "+",
    #: or `cpu` for params.yaml itself. Written by `syncsafe profile`, checked against `overlays`.
    profile: str = BASE_PROFILE
    #: The profile overlays (`syncsafe.profiles`) applied to the base params, in order.
    overlays: list[str] = Field(default_factory=list)
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
        label = profile_label(self.overlays)
        if self.profile != label:
            raise ValueError(f"profile: {self.profile!r} does not match the overlays these params hold "
                             f"({self.overlays}, label {label!r}); write a profile's params with "
                             f"`syncsafe profile {self.profile}` instead of setting the label by hand")
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
        if self.train.sync.fragment_sync_delay > self.control.min_h:
            raise ValueError(f"train.sync.fragment_sync_delay ({self.train.sync.fragment_sync_delay}) must be <= "
                             f"control.min_h ({self.control.min_h}): a fragment's outer step is applied before "
                             "the next merge can launch")
        if self.train.source == "builtin" and self.train.seq_len > self.train.model.max_position_embeddings:
            raise ValueError(f"train.seq_len ({self.train.seq_len}) must be <= train.model.max_position_embeddings "
                             f"({self.train.model.max_position_embeddings}) with train.source: builtin")
        vllm = self.replay.vllm
        for key, chosen, allowed in (
            ("replay.vllm.regimes", vllm.regimes, list(self.regimes)),
            ("replay.vllm.policies", vllm.policies or [], self.control.policies),
            ("replay.vllm.seeds", vllm.seeds or [], self.seeds),
        ):
            unknown = [x for x in chosen if x not in allowed]
            if unknown:
                raise ValueError(f"{key}: {unknown} not among {allowed}")
        for key, value in (("replay.vllm.time_scale", vllm.time_scale), ("replay.vllm.span_s", vllm.span_s)):
            unknown = [r for r in value if r not in self.regimes] if isinstance(value, dict) else []
            if unknown:  # a misspelt regime would leave the regime it meant unpinned without a word
                raise ValueError(f"{key}: regime(s) {unknown} not among the regimes {list(self.regimes)}")
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


def profile_label(overlays: list[str]) -> str:
    """The `profile` label of params composed from `overlays`: their names joined by "+", `cpu` for none."""
    return "+".join(overlays) or BASE_PROFILE


def _is_multiple(value: float, step: float) -> bool:
    ratio = value / step
    return math.isclose(ratio, round(ratio), abs_tol=1e-9)


def _format_error(source: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        if loc[:1] == ["regimes"] and len(loc) >= 3:
            del loc[2]  # the `kind` tag pydantic inserts for the discriminated union
        loc = [p for p in loc if p not in UNION_TAGS]  # a value given once or per regime
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the params schema)"
        got = "" if e["type"] in ("missing", "value_error", "extra_forbidden") else f" (got {e.get('input')!r})"
        where = ".".join(loc)
        lines.append(f"{source}: {where + ': ' if where else ''}{msg}{got}")
    return "\n".join(lines)


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`raw` with each dotted key set (`None` removes it); intermediate mappings are created."""
    out = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        if not all(parts):
            raise ConfigError(f"{dotted!r}: not a dotted params key")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{dotted}: {'.'.join(parts[: i + 1])} is a value, not a section")
            node = child
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = copy.deepcopy(value)
    return out


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
