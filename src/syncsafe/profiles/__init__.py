"""Profiles: named overlays on params.yaml, composed by one function (`compose`).

params.yaml is the `cpu` profile: no overlay. Every other profile is a YAML
file in this package (`gpu.yaml`, `tiny.yaml`) read as a JSON Merge Patch
(RFC 7386) on the params: mappings merge key by key, `null` removes a key (its
schema default applies, or the entry is gone, e.g. a regime), anything else
replaces. `compose` applies the named overlays in order, records them in
`overlays`, sets the `profile` label to match and validates the result; the
schema refuses a `profile` label that does not match `overlays`, so setting
the label by hand never yields a half-applied profile.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from syncsafe.config import BASE_PROFILE, ConfigError, parse_params, profile_label, read_yaml

#: Keys `compose` writes itself; an overlay file must not set them.
_RECORD_KEYS = ("profile", "overlays")


def available() -> list[str]:
    """Every profile name: `cpu` (params.yaml itself) and one per overlay file here."""
    files = sorted(p.name.removesuffix(".yaml") for p in resources.files(__package__).iterdir()
                   if p.name.endswith(".yaml"))
    return [BASE_PROFILE, *files]


def merge_patch(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`base` with `patch` applied (RFC 7386): mappings merge, `null` removes the key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict):  # onto a mapping key by key; onto anything else as a new mapping (its nulls gone)
            merged[key] = merge_patch(merged[key] if isinstance(merged.get(key), dict) else {}, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read_overlay(name: str) -> dict[str, Any]:
    """The overlay file of profile `name` (`cpu`: the empty overlay)."""
    if name not in available():
        raise ConfigError(f"profile {name!r}: expected one of {available()}")
    if name == BASE_PROFILE:
        return {}
    source = f"syncsafe/profiles/{name}.yaml"
    raw = read_yaml(resources.files(__package__).joinpath(f"{name}.yaml").read_text(encoding="utf-8"), source)
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of params sections")
    for key in _RECORD_KEYS:
        if key in raw:
            raise ConfigError(f"{source}: {key}: set by `compose`, not by an overlay")
    return raw


def compose(base: dict[str, Any], names: Sequence[str], source: str = "params.yaml") -> dict[str, Any]:
    """The params of profile(s) `names` on `base` (a params mapping with no overlay yet), validated.

    Params that already hold exactly `names` come back as they are; params
    composed from other overlays are refused (overlays cannot be taken off).
    Returns the raw mapping (to write as YAML); raises ConfigError naming the
    profile or the key that is wrong.
    """
    names = [n for n in names if n != BASE_PROFILE]
    if len(set(names)) != len(names):
        raise ConfigError(f"profiles {list(names)}: each profile may be applied once")
    already = base.get("overlays") or []
    if names == already:
        names = []
    if names and already:
        raise ConfigError(f"{source}: already composed from {already} (profile "
                          f"{base.get('profile')!r}); compose from the base params.yaml")
    raw = copy.deepcopy(base)
    for name in names:
        raw = merge_patch(raw, read_overlay(name))
    if names:
        raw["overlays"] = list(names)
        raw["profile"] = profile_label(names)
    parse_params(raw, f"{source} + profile {profile_label(names)}" if names else source)
    return raw


def compose_file(path: str | Path, names: Sequence[str]) -> dict[str, Any]:
    """`compose` on the params file at `path`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    base = read_yaml(text, str(path))
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return compose(base, names, str(path))
