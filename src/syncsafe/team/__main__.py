"""``python -m syncsafe.team up|down|status|trigger`` (``scripts/team.sh``): the team setup on one machine,
or spread over the hosts of a fleet (``up --fleet NAME --hosts N``, see :mod:`syncsafe.team.placement`).

Exit codes: 0 done; 1 a part failed to start or stop (one line, then the
failing part's log tail), or ``down`` left a process or port behind; 2 bad
input, one line naming the option (a ``--conf`` that is not a JSON object, a
``--timeout-s`` that is not a positive number, a fleet of no hosts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated
from syncsafe.procs import sigterm_raises
from syncsafe.team import stack
from syncsafe.team.daemons import TeamError
from syncsafe.team.placement import Placement, fleet_placement

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
DirOpt = Annotated[Optional[Path], typer.Option("--dir", help="state folder (default $SYNCSAFE_TEAM_DIR, else .team/)")]


def _bad_input(message: str) -> None:
    """One line naming the option and what it expects; exit 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _fail(err: Exception) -> None:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(EXIT_FAILED)


@app.command()
def up(
    dir: DirOpt = None,
    scheduled: Annotated[bool, typer.Option(help="let the scheduler start cron runs (syncsafe_nightly @daily)")] = False,
    free_ports: Annotated[bool, typer.Option(help="any free ports, not 8080/5000/5432/6379")] = False,
    env: Annotated[list[str], typer.Option("--env", help="KEY=VALUE for every Airflow process (repeatable)")] = [],
    fleet: Annotated[Optional[str], typer.Option(
        "--fleet", help="spread over this fleet's hosts (scripts/fleet.sh up --name NAME first): services on a, "
                        "the gpu worker on b, the cpu worker on c (else on a)")] = None,
    hosts: Annotated[int, typer.Option("--hosts", help="the fleet's number of hosts (with --fleet)")] = 2,
    subnet: Annotated[Optional[str], typer.Option("--subnet", help="the fleet's subnet (with --fleet)")] = None,
) -> None:
    """Start PostgreSQL, Redis, the MLflow server and Airflow (CeleryExecutor, two workers) on 127.0.0.1,
    or with --fleet across the fleet's hosts, each bound to its host's address."""
    extra = dict(item.split("=", 1) for item in env if "=" in item)
    layout = stack.Layout.at(dir)
    try:
        where = fleet_placement(fleet, hosts, subnet) if fleet else Placement.single()
    except BadInput as err:
        _bad_input(str(err))
    try:
        with sigterm_raises():  # stopped while starting: what it started goes down (stack.up)
            stack.up(layout, scheduled=scheduled, preferred_ports=not free_ports, extra_env=extra, where=where)
    except TeamError as err:
        _fail(err)
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        typer.echo(f"error: team up {'terminated (SIGTERM)' if terminated else 'interrupted'}: "
                   "everything it had started is down", err=True)
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    _print_status(layout)
    # never the password itself: CI logs and terminals keep what is printed
    typer.echo(f"Airflow user admin, password in {stack.admin_password_file(layout)} (owner-only, mode 0600)")


@app.command()
def down(dir: DirOpt = None) -> None:
    """Stop everything `up` started, on every host; fails if a process or port is left."""
    try:
        left = stack.down(stack.Layout.at(dir))
    except TeamError as err:
        _fail(err)
    if left:
        _fail(TeamError("left behind: " + "; ".join(left)))
    typer.echo("team setup stopped: no process or port left")


@app.command()
def status(
    dir: DirOpt = None,
    env: Annotated[bool, typer.Option("--env", help="write the Airflow settings as shell exports to an owner-only "
                                                    "file and print its path")] = False,
) -> None:
    """Each part (running or not, log), the URLs; exit 1 unless everything runs."""
    layout = stack.Layout.at(dir)
    if env:
        state = stack.load(layout)
        if not state:
            _fail(TeamError(f"no team setup in {layout.root}"))
        path = stack.write_env_file(layout, state)  # secrets inside: never on stdout
        typer.echo(f"the Airflow settings (secrets included, owner-only): {path}; in a shell: . {path}")
        return
    if not _print_status(layout):
        raise typer.Exit(EXIT_FAILED)


def _print_status(layout: stack.Layout) -> bool:
    info = stack.status(layout)
    typer.echo(f"team setup in {info['root']}: {'up' if info['up'] else 'not up'}")
    if "placement" in info:
        typer.echo(f"  placement: {info['placement']}")
    for name, part in info["parts"].items():
        host = f"host {part['host']}" if part.get("host") else ""
        typer.echo(f"  {name:24s} {'running' if part['running'] else 'stopped':8s} {host:8s} {part['log']}")
    for name, url in info.get("urls", {}).items():
        typer.echo(f"  {name:24s} {url}")
    return bool(info["up"])


@app.command()
def trigger(
    dag_id: Annotated[str, typer.Argument(help="e.g. syncsafe_nightly")],
    conf: Annotated[str, typer.Option(help="the run's params, a JSON object")] = "{}",
    wait: Annotated[bool, typer.Option(help="wait for the run to finish; exit 1 unless it succeeded")] = False,
    timeout_s: Annotated[float, typer.Option(help="how long to wait")] = 3600,
    dir: DirOpt = None,
) -> None:
    """Unpause a DAG and start a run of it through the REST API."""
    try:
        params = json.loads(conf)
    except json.JSONDecodeError as err:
        params = err
    if not isinstance(params, dict):
        _bad_input(f"--conf: expected a JSON object, got {conf!r}")
    if not timeout_s > 0:  # NaN too
        _bad_input(f"--timeout-s: expected a positive number of seconds, got {timeout_s:g}")
    try:
        client = stack.client(stack.Layout.at(dir))
        client.wait_for_dag(dag_id)
        client.unpause(dag_id)
        run_id = client.trigger(dag_id, params)
        typer.echo(f"{dag_id}: run {run_id}")
        if wait:
            state = client.wait_run(dag_id, run_id, timeout_s)
            typer.echo(f"{dag_id}: run {run_id} {state}")
            if state != "success":
                raise typer.Exit(EXIT_FAILED)
    except TeamError as err:
        _fail(err)


def main() -> None:  # pragma: no cover - entry point
    app(prog_name="scripts/team.sh")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
