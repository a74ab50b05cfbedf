"""`syncsafe study ...`: studies (studies/<name>.yaml) as DVC experiments, one per point."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from syncsafe.cli.common import RootOpt
from syncsafe.errors import BadInput
from syncsafe.pipeline.failures import fails_cleanly as _fails_cleanly

study_app = typer.Typer(help="Studies (studies/<name>.yaml): ablations and sensitivity sweeps as DVC experiments.",
                        no_args_is_help=True)

StudyArg = Annotated[str, typer.Argument(help="a study file's name: studies/<name>.yaml")]
FullOpt = Annotated[bool, typer.Option("--full", help="leave out the study's cheap overrides (trained "
                                                      "schedules, real replays: the nightly's version)")]


@study_app.command("run")
@_fails_cleanly
def study_run(name: StudyArg, full: FullOpt = False,
              dry_run: Annotated[bool, typer.Option("--dry-run", help="print the queue commands only")] = False,
              root: RootOpt = Path(".")) -> None:
    """Queue one DVC experiment per point (`dvc exp run --queue -S ...`), run them one at a time, then report."""
    from syncsafe.studies.report import write_study_report
    from syncsafe.studies.run import queue_commands, run_study
    from syncsafe.studies.spec import load_study

    study = load_study(root, name, full=full)
    if dry_run:
        for command in queue_commands(study):
            typer.echo(" ".join(command))
        return
    run_study(root, study, echo=typer.echo)
    typer.echo(f"study {name}: report in {write_study_report(root, study)}")


@study_app.command("points")
@_fails_cleanly
def study_points(name: StudyArg, full: FullOpt = False, root: RootOpt = Path(".")) -> None:
    """The study's points as JSON (slug, experiment, whether it trains): what the study DAG maps over."""
    import json

    from syncsafe.studies.spec import load_study, point_params

    study = load_study(root, name, full=full)
    typer.echo(json.dumps([{"point": p.name, "slug": p.slug, "experiment": study.experiment(p),
                            "trains": point_params(study, p).schedules.source == "train"}
                           for p in study.distinct()]))


@study_app.command("point")
@_fails_cleanly
def study_point(name: StudyArg, point: Annotated[str, typer.Argument(help="the point's slug (`study points`)")],
                full: FullOpt = False, root: RootOpt = Path(".")) -> None:
    """Run one point in the foreground as a DVC experiment (`dvc exp run --temp`)."""
    from syncsafe.studies.run import run_point
    from syncsafe.studies.spec import load_study

    study = load_study(root, name, full=full)
    chosen = [p for p in study.distinct() if p.slug == point]
    if not chosen:
        raise BadInput(f"point {point!r}: not a point of study {name} that runs ({', '.join(p.slug for p in study.distinct())})")
    record = run_point(root, study, chosen[0], echo=typer.echo)
    typer.echo(f"point {record.point}: experiment {record.experiment}; ran {len(record.ran)} stage(s), "
               f"reused {len(record.reused)}")


@study_app.command("report")
@_fails_cleanly
def study_report(name: StudyArg, full: FullOpt = False, root: RootOpt = Path(".")) -> None:
    """Judge the study's points from their DVC experiments (nothing reruns): reports/studies/<name>/."""
    from syncsafe.studies.report import write_study_report
    from syncsafe.studies.spec import load_study

    typer.echo(str(write_study_report(root, load_study(root, name, full=full))))
