"""A controller's knobs: the params keys its decisions read, the grid a tuning searches, and applying a point.

Each policy's default grid spans the keys its rule reads (`control.policies`
says which): a wide enough range that the best point is rarely on an edge
(the tune output flags one that is). `--knob KEY=V1,V2,...` replaces or
adds one key's values. A point is a mapping of dotted params keys to values,
applied with the project's override semantics and validated by the schema,
so a knob that does not exist or a value out of range is one clear error.
"""

from __future__ import annotations

import itertools
from typing import Any

from syncsafe.config import ConfigError, Params, apply_overrides, parse_params, read_yaml, split_policy
from syncsafe.errors import BadInput

_SCORE = {"control.score.threshold": [-0.25, 0.0, 0.25, 0.5, 0.75], "control.score.w_pressure": [0.5, 1.0, 2.0, 4.0]}
_FORECAST = {"control.score.threshold": [0.0, 0.25, 0.5], "control.forecast.w_forecast": [0.25, 0.5, 1.0, 2.0, 4.0]}

#: Default grid per policy (its base name: an ablated variant searches its base's grid).
DEFAULT_GRIDS: dict[str, dict[str, list[Any]]] = {
    "fixed_h": {"control.fixed_h.h": [4, 8, 12, 16]},
    "pressure_gate": {"control.pressure_gate.max_pressure": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]},
    "random_deferral": {"control.random_deferral.defer_prob": [0.25, 0.5, 0.75]},
    "wa_diloco": _SCORE,
    "wa_calibrated": {"control.score.threshold": [0.0, 0.25, 0.5],
                      "control.calibrated.w_cost": [0.5, 1.0, 1.5, 3.0, 6.0]},
    "wa_forecast": _FORECAST,
    "wa_seasonal": _FORECAST,
    "wa_lookahead": {"control.lookahead.w_defer": [0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0],
                     "control.lookahead.history_s": [300.0, 600.0, 1200.0]},
}


def parse_knob(text: str) -> tuple[str, list[Any]]:
    """`KEY=V1,V2,...` -> (KEY, values parsed as YAML scalars)."""
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise BadInput(f"--knob {text!r}: expected KEY=V1,V2,... (e.g. control.lookahead.w_defer=0,0.1,0.25)")
    try:
        parsed = [read_yaml(v.strip(), f"--knob {key}") for v in values.split(",")]
    except ConfigError as err:
        raise BadInput(str(err)) from None
    return key.strip(), parsed


def grid(policy: str, knobs: list[str] = ()) -> list[dict[str, Any]]:
    """Every point of `policy`'s grid (its default, with each `--knob` replacing or adding a key)."""
    try:
        base, _ = split_policy(policy)
    except ValueError as err:
        raise BadInput(str(err)) from None
    axes = dict(DEFAULT_GRIDS.get(base, {}))
    for text in knobs:
        key, values = parse_knob(text)
        axes[key] = values
    if not axes:
        raise BadInput(f"policy {policy!r} has no default knob grid; give one with --knob KEY=V1,V2,...")
    keys = list(axes)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(axes[k] for k in keys))]


def with_knobs(params: Params, point: dict[str, Any]) -> Params:
    """`params` with the point's keys set, validated (ConfigError naming the key otherwise)."""
    return parse_params(apply_overrides(params.model_dump(mode="json", exclude_unset=True), point), "knob point")


def current(params: Params, point: dict[str, Any]) -> dict[str, Any]:
    """The values `params` holds for the keys of `point`."""
    raw = params.model_dump(mode="json")
    out = {}
    for key in point:
        node: Any = raw
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out
