"""``python -m syncsafe.fleet up|down|status|shape|cut|restore`` (``scripts/fleet.sh``): test hosts on one machine.

Exit codes: 0 done; 1 a step failed (one line naming the ``ip``/``tc``
command and what it said; a failed ``up`` has already removed what it made);
2 bad input (a host or subnet that is not what is expected).
"""

from __future__ import annotations

from typing import Annotated

import typer

from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput
from syncsafe.fleet import links, netns
from syncsafe.fleet.hosts import DEFAULT_NAME, DEFAULT_SUBNET, HOST_IFNAME, Fleet

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
Hosts = Annotated[int, typer.Option("--hosts", help="number of hosts, named a, b, c, ...")]
Name = Annotated[str, typer.Option("--name", help="prefix of the fleet's namespaces")]
Subnet = Annotated[str, typer.Option("--subnet", help="private IPv4 range of the hosts' addresses")]


def _fleet(hosts: int, name: str, subnet: str) -> Fleet:
    try:
        return Fleet.of(hosts, name=name, subnet=subnet)
    except BadInput as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _do(step, *args) -> None:
    try:
        step(*args)
    except BadInput as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except netns.FleetError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except FileNotFoundError as err:  # `ip` or `tc` missing: one line, not a traceback
        typer.echo(f"error: {err.filename or err} not found on PATH (the fleet needs iproute2's ip and tc)",
                   err=True)
        raise typer.Exit(EXIT_FAILED) from None


@app.command()
def up(hosts: Hosts = 2, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Make the hosts' namespaces, the switch and the links (root only)."""
    fleet = _fleet(hosts, name, subnet)
    _do(netns.up, fleet)
    status(hosts, name, subnet)


@app.command()
def down(hosts: Hosts = 8, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Stop what runs on the hosts and delete every namespace of the fleet."""
    fleet = _fleet(hosts, name, subnet)
    _do(netns.down, fleet)
    typer.echo(f"fleet {name}: down")


@app.command()
def status(hosts: Hosts = 2, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Each host's namespace and address, and whether it exists."""
    fleet = _fleet(hosts, name, subnet)
    found: list[str] = []
    _do(lambda: found.extend(netns.existing(fleet)))
    present = set(found)
    for host in fleet.hosts:
        ns = fleet.namespace(host)
        state = "up" if ns in present else "absent"
        typer.echo(f"{host}\t{ns}\t{HOST_IFNAME} {fleet.address(host)}/{fleet.prefixlen}\t{state}")


@app.command()
def shape(host: str, rate_mbit: Annotated[float, typer.Option(help="link rate, Mbit/s (0: line rate)")] = 0.0,
          delay_ms: Annotated[float, typer.Option(help="delay added each way, ms")] = 0.0,
          hosts: Hosts = 2, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Shape HOST's link both ways (tc netem where the kernel has it, else a token bucket for the rate)."""
    fleet = _fleet(hosts, name, subnet)
    _do(lambda: links.shape(fleet, host, links.Shape(rate_mbit or None, delay_ms)))


@app.command()
def cut(host: str, hosts: Hosts = 2, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Take HOST's link down (ip link set ... down at the switch)."""
    fleet = _fleet(hosts, name, subnet)
    _do(links.cut, fleet, host)


@app.command()
def restore(host: str, hosts: Hosts = 2, name: Name = DEFAULT_NAME, subnet: Subnet = DEFAULT_SUBNET) -> None:
    """Bring HOST's link back up."""
    fleet = _fleet(hosts, name, subnet)
    _do(links.restore, fleet, host)


if __name__ == "__main__":
    app()
