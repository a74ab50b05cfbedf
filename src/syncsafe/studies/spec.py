"""A study as data: `studies/<name>.yaml`, its points and the params each point runs with.

A study asks one question of many points, each point the project's params with a few overrides:

- `question: ablation`: which term of a workload-aware policy earns its keep? `ablations` names ablated
  variants (`wa_diloco-pressure`, config.ABLATABLE_TERMS); the point of a variant runs its full policy and
  the variant side by side (`control.policies: [fixed_h, full, variant]`, the full one the declared primary).
- `question: sensitivity`: does the verdict survive another setting? `axes` lists params keys and their
  values; a point per (axis, value). A key may name every regime at once (`regimes.*.load_scale`).

`cheap` holds the overrides that make the study run in minutes on 2 cores (the stress-harness schedules, no
real server); `syncsafe study run --full` leaves them out. Overrides are dotted params keys; `null` removes a
key (its schema default applies). Every point's params are validated before anything is queued, on the
params its experiment will run with (DVC's own `-S` composition, studies.dvc_overrides): an unknown key, a
bad value or an override DVC would apply otherwise is one line naming the study file, the point and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from syncsafe.config import (ConfigError, Params, PolicyName, Strict, apply_overrides, parse_params, read_yaml,
                             split_policy)
from syncsafe.studies.dvc_overrides import check_same, set_param_args

#: Where study files live, relative to the project root.
STUDIES_DIR = Path("studies")
#: Between a study's name and a point's slug in its experiment names: in neither of them.
EXPERIMENT_SEP = "."
#: The regime wildcard of an axis key: `regimes.*.load_scale` sets the key of every regime.
_EVERY_REGIME = "regimes.*."


class Axis(Strict):
    """One varied setting: `keys` all take each of `values` together (a point per value)."""

    name: str = Field(min_length=1)
    keys: list[str] = Field(min_length=1)
    values: list[Any] = Field(min_length=1)


class StudySpec(Strict):
    description: str = Field(min_length=1)
    question: Literal["ablation", "sensitivity"]
    #: Overrides every point gets unless `--full` (the CPU-cheap default).
    cheap: dict[str, Any] = Field(default_factory=dict)
    #: Overrides every point gets, cheap or full.
    common: dict[str, Any] = Field(default_factory=dict)
    ablations: list[PolicyName] = Field(default_factory=list)
    #: sensitivity: the policy whose verdict is followed (null: the params' analysis.primary.policy).
    policy: PolicyName | None = None
    axes: list[Axis] = Field(default_factory=list)

    @model_validator(mode="after")
    def _question_has_points(self) -> StudySpec:
        if self.question == "ablation":
            if not self.ablations or self.axes:
                raise ValueError("question ablation: list `ablations` (ablated variants) and no `axes`")
            for name in self.ablations:
                if split_policy(name)[1] is None:
                    raise ValueError(f"ablations: {name!r} is a whole policy, not an ablated variant `<policy>-<term>`")
        if self.question == "sensitivity" and (not self.axes or self.ablations):
            raise ValueError("question sensitivity: list `axes` (params keys and values) and no `ablations`")
        return self


@dataclass(frozen=True)
class Point:
    """One point of a study: its name, the varied setting's label and value, and its overrides."""

    name: str
    axis: str
    value: Any
    overrides: dict[str, Any]

    @property
    def slug(self) -> str:
        return slug(self.name)


@dataclass(frozen=True)
class Study:
    name: str
    path: Path
    spec: StudySpec
    points: tuple[Point, ...]
    #: sensitivity: the policy whose verdict each point follows (ablation: None, each point has its own pair).
    policy: str | None
    #: Whether the cheap overrides were left out (`--full`).
    full: bool
    #: The overrides every point gets before its own: `common`, then `cheap` unless full.
    shared: dict[str, Any]
    #: point slug -> the slug of the first point with the very same params (itself if none came before): DVC
    #: keeps one experiment per content, so points that land on the same params share it.
    same_as: dict[str, str]
    #: The project's params.yaml the points override (what `dvc exp run -S` applies them to).
    base: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: point slug -> the params it runs with, validated once when the study is loaded.
    params: dict[str, Params] = field(default_factory=dict, compare=False, repr=False)

    def experiment(self, point: Point) -> str:
        """The DVC experiment name of a point (the first point's with the same params): `<study>.<point>`.
        Neither a study's name nor a point's slug holds a `.`, so a name belongs to one point of one study."""
        return f"{self.name}{EXPERIMENT_SEP}{self.same_as.get(point.slug, point.slug)}"

    def overrides(self, point: Point) -> dict[str, Any]:
        """A point's overrides as its experiment gets them: the study's shared ones, then the point's own."""
        return {**self.shared, **point.overrides}

    def param_args(self, point: Point) -> list[str]:
        """The point's `dvc exp run -S` arguments (studies.dvc_overrides.set_param_args)."""
        return set_param_args(self.overrides(point), self.base)

    def distinct(self) -> list[Point]:
        """The points that run: one per distinct params."""
        return [p for p in self.points if self.same_as.get(p.slug, p.slug) == p.slug]


def slug(text: str) -> str:
    """`text` as a git-ref-safe name: letters, digits, `_` and `-` (a `.` in a number becomes `p`)."""
    text = re.sub(r"(?<=\d)\.(?=\d)", "p", text)
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-") or "point"


def study_path(root: Path, name: str) -> Path:
    return root / STUDIES_DIR / f"{name}.yaml"


def available(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / STUDIES_DIR).glob("*.yaml"))


def load_study(root: Path, name: str, *, full: bool = False) -> Study:
    """Read studies/<name>.yaml and build its points, each validated against the project's params."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ConfigError(f"study {name!r}: a study's name is letters, digits, `_` and `-` (studies/<name>.yaml)")
    path = study_path(root, name)
    if not path.is_file():
        raise ConfigError(f"{path}: no such study (have {', '.join(available(root)) or 'none'})")
    raw = read_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping (description, question, ...)")
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
    params_path = root / "params.yaml"
    base = read_yaml(params_path.read_text(encoding="utf-8"), str(params_path))
    shared = {**spec.common, **({} if full else spec.cheap)}
    base_params = _validated(base, shared, f"{path}: common/cheap overrides")
    if spec.question == "ablation":
        points = tuple(_ablation_point(name) for name in spec.ablations)
        policy = None
    else:
        points = tuple(p for axis in spec.axes for p in _axis_points(axis, base_params, path))
        policy = spec.policy or base_params.analysis.primary.policy
        if policy not in base_params.control.policies:
            raise ConfigError(f"{path}: policy {policy!r} is not among control.policies {base_params.control.policies}")
    names = [p.slug for p in points]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{path}: points {twice} share a name")
    same_as: dict[str, str] = {}
    validated: dict[str, Params] = {}
    for point in points:
        params = _validated(base, {**shared, **point.overrides}, f"{path}: point {point.name}")
        same_as[point.slug] = next((slug for slug, earlier in validated.items() if earlier == params), point.slug)
        validated[point.slug] = params
    return Study(name=name, path=path, spec=spec, points=points, policy=policy, full=full, shared=shared,
                 same_as=same_as, base=base, params=validated)


def point_params(study: Study, point: Point) -> Params:
    """The params a point runs with (what its DVC experiment's params.yaml holds), as validated at load."""
    return study.params[point.slug]


def _ablation_point(variant: str) -> Point:
    base, _ = split_policy(variant)
    # fixed_h stays: the protocol also judges every controller against the fixed cadence
    overrides = {"control.policies": ["fixed_h", base, variant], "analysis.primary.policy": base,
                 "replay.vllm.policies": [], "live.policy": base}
    return Point(name=variant, axis="ablated term", value=variant, overrides=overrides)


def _axis_points(axis: Axis, params: Params, path: Path) -> list[Point]:
    keys: list[str] = []
    for key in axis.keys:
        if key.startswith(_EVERY_REGIME):
            keys += [f"regimes.{regime}.{key.removeprefix(_EVERY_REGIME)}" for regime in params.regimes]
        elif "*" in key:
            raise ConfigError(f"{path}: axes {axis.name}: {key!r}: a wildcard may only stand for the regime "
                              f"({_EVERY_REGIME}<key>)")
        else:
            keys.append(key)
    return [Point(name=f"{axis.name}={_text(value)}", axis=axis.name, value=value,
                  overrides={key: value for key in keys}) for value in axis.values]


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _validated(base: dict[str, Any], overrides: dict[str, Any], where: str) -> Params:
    """The params of `overrides` on `base`, checked by the schema and against what DVC's `-S` will run."""
    try:
        ours = apply_overrides(base, overrides)
        params = parse_params(ours, "params.yaml")
        check_same(ours, base, overrides)
        return params
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
