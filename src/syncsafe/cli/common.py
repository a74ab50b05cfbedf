"""What the `syncsafe` commands share: the params file, root and regime options, and running a pipeline stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ParamsOpt = Annotated[Path, typer.Option("--params", help="params.yaml to read")]
RootOpt = Annotated[Path, typer.Option("--root", help="project root that data/ and runs/ live under")]
RegimeOpt = Annotated[list[str] | None, typer.Option("--regime", help="regime(s) to run; default: all")]


def run_stage_command(stage: str, params: Path, root: Path, regimes: list[str] | None = None, **options) -> None:
    """Stage `stage` through the pipeline runner (tracked), its lines echoed."""
    from syncsafe.config import load_params
    from syncsafe.pipeline.runner import run_stage

    run_stage(stage, load_params(params), root, params, regimes, echo=typer.echo, **options)
