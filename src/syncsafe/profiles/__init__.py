"""Profiles: overlays on params.yaml (`cpu` is params.yaml itself; `gpu.yaml` ships here)."""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import yaml

from syncsafe.config import ConfigError

PROFILES = ("cpu", "gpu")


def overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`base` with `top` merged in: mappings merge key by key, anything else replaces."""
    merged = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = overlay(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def apply_profile(raw: dict[str, Any], profile: str) -> dict[str, Any]:
    """params.yaml contents with the profile's overlay applied (`cpu`: unchanged)."""
    if profile not in PROFILES:
        raise ConfigError(f"profile {profile!r}: expected one of {list(PROFILES)}")
    if profile == "cpu":
        return copy.deepcopy(raw)
    text = resources.files(__package__).joinpath(f"{profile}.yaml").read_text(encoding="utf-8")
    return overlay(raw, yaml.safe_load(text))
