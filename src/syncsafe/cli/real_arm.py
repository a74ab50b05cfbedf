"""`syncsafe real-arm`: the real (vLLM) arm's plan and outputs, beside the pipeline's stages.

`plan` proposes the time scales and spans to pin from a server profile and a budget (a tool run on
purpose: the run itself never sizes its plan from the machine); `compare A B` checks that two runs reproduce;
`record ROOT OUT` keeps a finished run's real-arm result (with its commit, machine and profile) as a folder
that `compare` takes in place of a project root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from syncsafe.cli.common import ParamsOpt, RootOpt
from syncsafe.pipeline.failures import fails_cleanly as _fails_cleanly

real_arm_app = typer.Typer(help="The real (vLLM) arm: `plan` sizes what to pin, `compare A B` checks that two runs "
                                "reproduce, `record ROOT OUT` keeps a run's result as a reference to compare with.",
                           no_args_is_help=True)


@real_arm_app.command("plan")
@_fails_cleanly
def real_arm_plan(
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    budget_s: Annotated[float | None, typer.Option("--budget-s", min=1.0,
                                                   help="wall seconds of replays; default replay.vllm.budget_s")] = None,
) -> None:
    """The plan this machine's server profile (runs/server-profile/) would pin within a budget: per regime the
    time scale its capacity holds at the target utilisation and the span the gate's power needs, with the
    `replay.vllm` keys to pin it. Run it on the slowest machine the plan must hold on. Exit 2 names a missing
    profile or schedule index."""
    from syncsafe.config import load_params
    from syncsafe.realarm.plan import describe_plan, pinned_params, size_from_profile

    plan = size_from_profile(load_params(params), root, budget_s)
    for line in describe_plan(plan):
        typer.echo(line)
    typer.echo("to pin it, in params.yaml under replay.vllm:")
    typer.echo(yaml.safe_dump(pinned_params(plan), sort_keys=False).rstrip())


@real_arm_app.command("compare")
@_fails_cleanly
def real_arm_compare(
    a: Annotated[Path, typer.Argument(help="project root of the first run (its runs/ and reports/)")],
    b: Annotated[Path, typer.Argument(help="project root of the second run")],
    time_scale_tolerance: Annotated[
        float, typer.Option("--time-scale-tolerance", min=0.0, help="largest relative gap of the plans' time scales")
    ] = 0.10,
) -> None:
    """Does the real arm reproduce? Plans, tiers, gate ratios, held-out fidelity and the real controller minus
    matched random of run A against run B.

    Exit 0: everything reproduces; 1: something does not (one line per failure on stderr); 2: an input file
    is missing or malformed (named).
    """
    from syncsafe.analysis.reproduce import compare_real_arms, render

    result = compare_real_arms(a, b, time_scale_tolerance=time_scale_tolerance)
    for line in render(result):
        typer.echo(line)
    failures = result.failures
    if failures:
        for line in failures:
            typer.echo(f"not reproduced: {line}", err=True)
        raise typer.Exit(1)
    typer.echo("reproduces: same plan and tiers; gate, fidelity and real-vs-random agree")


@real_arm_app.command("record")
@_fails_cleanly
def real_arm_record(
    root: Annotated[Path, typer.Argument(help="project root of a finished run (its runs/ and reports/)")],
    out: Annotated[Path, typer.Argument(help="folder to record it in (replaced whole), e.g. evidence/<date>-<name>")],
    profile: Annotated[str, typer.Option("--profile", help="the params profile the run used (cpu, powered, ...)")] = "cpu",
) -> None:
    """Record a run's real-arm result as a reference: the plan, blocks, gate, fidelity, tiers and real replays'
    index, with the commit, machine and profile that made it. `syncsafe real-arm compare NEW OUT` then holds a new
    run against it. Exit 2 names a missing or malformed input file."""
    import datetime

    from syncsafe.analysis.record import record_real_arm
    from syncsafe.realarm.server_profile import machine
    from syncsafe.tracking.settings import git_commit

    provenance = {"commit": git_commit(root), "machine": machine(), "profile": profile,
                  "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    files = record_real_arm(root, out, provenance)
    typer.echo(f"recorded {len(files)} files of {root} in {out} (commit {provenance['commit'][:12] or 'unknown'}, "
               f"profile {profile}); compare a new run with: syncsafe real-arm compare NEW {out}")
