"""A study point's overrides as `dvc exp run -S` applies them, checked to mean what the study means.

A study states its overrides with the project's semantics (`config.apply_overrides`): a dotted key is
set, a mapping *replaces* the section it names, `null` removes a key (a no-op when it is absent), strings
are literal. DVC applies `-S` through Hydra's override grammar on params.yaml, whose semantics differ: a
mapping is *merged* into the section, `~key` fails when the key is absent, and `${...}` in a value is an
OmegaConf interpolation, resolved. So:

- `set_param_args` writes the `-S` arguments that give the project's semantics under Hydra: a mapping that
  replaces an existing section is deleted first (`~key`, then `++key={...}`), a removal of an absent key
  is left out, and a string holding `${` is refused (no interpolation reaches a run).
- `dvc_applied` applies those arguments with DVC's own function (`dvc.utils.hydra.apply_overrides`, the
  one `dvc exp run -S` calls) to a copy of the base params, so a point is validated on the params its
  experiment will really run with.
- `check_same` refuses a point whose two results differ, naming the first key that does.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import yaml

from syncsafe.config import ConfigError


def _lookup(raw: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def set_param_args(overrides: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """`dvc exp run -S` arguments that apply `overrides` to `base` with the project's semantics."""
    args = []
    for key, value in overrides.items():
        present, current = _lookup(base, key)
        if value is None:
            if present:
                args += ["-S", f"~{key}"]
            continue
        if isinstance(value, dict) and present and isinstance(current, dict):
            args += ["-S", f"~{key}"]  # Hydra merges a mapping into a section; the study replaces it
        args += ["-S", f"++{key}={_hydra_value(value, key)}"]
    return args


def _hydra_value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if "${" in value:
            raise ConfigError(f"{key}: {value!r}: `${{...}}` would be an OmegaConf interpolation under "
                              "`dvc exp run -S`; a study's values are literal")
        # Hydra's quoted strings: a quote is escaped, and so are backslashes before a quote or at the end
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v, key) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(v, f'{key}.{k}')}" for k, v in value.items()) + "}"
    raise ConfigError(f"{key}: override value {value!r}: expected a number, string, boolean, list or mapping")


def dvc_applied(base: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """`base` after `dvc exp run` applies the `-S` arguments `args`, by DVC's own function, on a copy."""
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory(prefix="syncsafe-study-") as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(base, sort_keys=False), encoding="utf-8")
        try:
            apply_overrides(path, args[1::2])
        except InvalidArgumentError as err:
            cause = err.__cause__
            raise ConfigError(f"`dvc exp run {' '.join(args)}` is refused by DVC: {cause or err}") from None
        return yaml.safe_load(path.read_text(encoding="utf-8"))


def first_difference(ours: Any, theirs: Any, at: str = "") -> tuple[str, Any, Any] | None:
    """The first dotted key where two params trees differ, with both values; None when they are equal."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            found = first_difference(ours.get(key, _ABSENT), theirs.get(key, _ABSENT), f"{at}.{key}" if at else key)
            if found:
                return found
        return None
    return None if ours == theirs else (at or "(top level)", ours, theirs)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def check_same(ours: dict[str, Any], base: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Refuse overrides whose `dvc exp run -S` result is not `ours` (the project's semantics)."""
    args = set_param_args(overrides, base)
    differs = first_difference(ours, dvc_applied(base, args))
    if differs:
        key, want, got = differs
        raise ConfigError(f"{key}: `dvc exp run -S` would run it with {got!r}, the study means {want!r}")
