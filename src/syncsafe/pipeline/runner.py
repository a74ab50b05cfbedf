"""Run a declared stage: `stages/<stage>.py` calls `main("<stage>")`, the `syncsafe` commands call `run_stage`.

Both load params.yaml, choose the regimes (per the stage's declaration), import
the stage's entry lazily (only that stage's code is loaded) and call it once per
regime inside the stage's tracking: the one place a stage run is tracked. First
they clear what a killed earlier run left: scratch folders of processes that are
gone (`procs.reap_scratch`) and temporary or half-swapped files of the stage's
outputs (`io.reap_leftovers`).
Bad input is one line on stderr and exit 2 (`syncsafe.pipeline.failures`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from syncsafe.config import ConfigError, Params, load_params
from syncsafe.io import reap_leftovers
from syncsafe.pipeline.declarations import REGIME, StageSpec, stage
from syncsafe.pipeline.failures import fails_cleanly
from syncsafe.procs import reap_scratch


def entry_function(spec: StageSpec, attr: str | None = None) -> Callable[..., str]:
    """The stage's entry (`module:function`), or another function `attr` of its module."""
    module, _, function = spec.entry.partition(":")
    return getattr(importlib.import_module(module), attr or function)


def param(params: Params, key: str) -> Any:
    """The value of a dotted params key (``train.islands``)."""
    node: Any = params
    for part in key.split("."):
        node = getattr(node, part)
    return node


def switched_on(spec: StageSpec, params: Params) -> bool:
    """Whether the stage does its work (no `switch`, or its params key is true)."""
    return spec.switch is None or bool(param(params, spec.switch))


def regimes_of(spec: StageSpec, params: Params, chosen: Sequence[str] | None = None) -> list[str | None]:
    """The regimes the stage runs once each: chosen ones (checked against params), else its declared loop."""
    for name in chosen or []:
        if name not in params.regimes:
            raise ConfigError(f"--regime {name!r}: not a regime in params.yaml (have {sorted(params.regimes)})")
    if spec.regimes == "none":
        if chosen:
            raise ConfigError(f"--regime does not apply to stage {spec.name} (it runs once for all regimes)")
        return [None]
    if chosen:
        return list(chosen)
    return list(params.regimes) if spec.regimes == "params" else list(params.live.regimes)


def run_stage(name: str, params: Params, root: Path, params_path: Path, regimes: Sequence[str] | None = None, *,
              honor_switch: bool = True, echo: Callable[[str], None] = print, **options: Any) -> None:
    """Run stage `name` once per regime, each run tracked; `options` go to its entry function."""
    from syncsafe.tracking import tracked_stage

    spec = stage(name)
    if honor_switch and not switched_on(spec, params):
        echo(entry_function(spec, "off")(params, root))
        return
    entry = entry_function(spec)
    reap_scratch(Path(root))
    for regime in regimes_of(spec, params, regimes):
        for output in spec.outputs:  # what a killed earlier run of this stage left half-written
            reap_leftovers(Path(root) / (output.replace(REGIME, regime) if regime else output))
        with tracked_stage(spec.name, root=Path(root), params=params, regime=regime, sections=list(spec.params),
                           system_metrics=spec.system_metrics):
            message = entry(params, Path(root), regime, Path(params_path), **options)
        echo(message)


def parse_args(spec: StageSpec, argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=spec.script, description=f"DVC stage {spec.name}: {spec.description}")
    if spec.regimes != "none":
        parser.add_argument("--regime", action="append", help="regime(s) to run; default: all")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="params.yaml to read")
    parser.add_argument("--root", type=Path, default=Path("."), help="project root that data/ and runs/ live under")
    return parser.parse_args(argv)


def main(name: str, argv: Sequence[str] | None = None) -> None:
    """The entry of `stages/<name>.py`: exits 0 done, 1 a run failed, 2 bad input, 3 a lost island."""
    spec = stage(name)
    args = parse_args(spec, sys.argv[1:] if argv is None else argv)
    fails_cleanly(_main)(spec, args)


def _main(spec: StageSpec, args: argparse.Namespace) -> None:
    params = load_params(args.params)
    run_stage(spec.name, params, args.root, args.params, getattr(args, "regime", None))
