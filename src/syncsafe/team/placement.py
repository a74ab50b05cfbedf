"""Where each process of the team setup runs and which address it binds: one machine, or fleet hosts.

On one machine (:meth:`Placement.single`) every process runs on the machine itself and every service
binds 127.0.0.1, as the setup always did. Across a fleet of test hosts (:meth:`Placement.across`, see
:mod:`syncsafe.fleet`):

- the first host (A) runs PostgreSQL, Redis, the MLflow server and Airflow's api-server, scheduler and
  dag-processor, each bound to A's fleet address only (not 0.0.0.0, not A's loopback);
- the ``gpu`` Celery worker runs on the second host (B), the ``cpu`` worker on the third (C) when the
  fleet has one, else on A; further hosts stay unused. Workers listen on nothing (their log server is
  off, see :mod:`syncsafe.team.airflow`);
- every URL a process is given (metadata DB, broker, result backend, MLflow tracking URI, the
  execution API) names A's address.

Each process starts inside its host's namespace (``fleet.exec_argv``: ``ip netns exec``), so what it
forks (the stage processes of the tasks a worker runs) runs on that host too. The machine's own
namespace cannot reach the fleet's addresses: checks and clients run through :meth:`Placement.call`,
on a thread inside A's namespace. This module has no side effects except :func:`check_fleet` and
:meth:`Placement.call`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from syncsafe.errors import BadInput
from syncsafe.fleet.hosts import Fleet
from syncsafe.procs import LOOPBACK
from syncsafe.team.daemons import TeamError

T = TypeVar("T")
#: The processes that serve the others, all on one host (A).
SERVICES = ("postgres", "redis", "mlflow", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor")
WORKER_PREFIX = "airflow-worker-"
#: A worker's host in a fleet: the host at this index, or the first host when the fleet is smaller.
WORKER_HOST_INDEX = {"gpu": 1, "cpu": 2}


@dataclass(frozen=True)
class Site:
    """Where one process runs: ``host`` (a fleet host; None: the machine itself) and ``address``, the
    address of that host it binds when it serves anything."""

    host: str | None
    address: str


@dataclass(frozen=True)
class Placement:
    """The team setup on one machine (``fleet`` None) or spread over ``fleet``'s hosts."""

    fleet: Fleet | None = None

    @classmethod
    def single(cls) -> Placement:
        return cls(None)

    @classmethod
    def across(cls, fleet: Fleet) -> Placement:
        return cls(fleet)

    @property
    def services_host(self) -> str | None:
        """The host of PostgreSQL, Redis, MLflow and Airflow's core processes (A)."""
        return self.fleet.hosts[0] if self.fleet else None

    @property
    def address(self) -> str:
        """The address every service binds and every URL names."""
        return self.fleet.address(self.fleet.hosts[0]) if self.fleet else LOOPBACK

    def host(self, process: str) -> str | None:
        """The host ``process`` runs on (None: the machine itself)."""
        if process in SERVICES:
            return self.services_host
        if not process.startswith(WORKER_PREFIX):
            raise TeamError(f"no placement for process {process!r} (expected one of {', '.join(SERVICES)} "
                            f"or {WORKER_PREFIX}<worker>)")
        if self.fleet is None:
            return None
        index = WORKER_HOST_INDEX.get(process.removeprefix(WORKER_PREFIX), 0)
        return self.fleet.hosts[index] if index < len(self.fleet.hosts) else self.fleet.hosts[0]

    def site(self, process: str) -> Site:
        host = self.host(process)
        return Site(host, self.fleet.address(host) if self.fleet and host else LOOPBACK)

    def sites(self, workers: tuple[str, ...] = ("cpu", "gpu")) -> dict[str, Site]:
        """Every process of the setup and its site."""
        return {name: self.site(name) for name in (*SERVICES, *(WORKER_PREFIX + w for w in workers))}

    def worker_host(self, worker: str) -> str | None:
        return self.host(WORKER_PREFIX + worker)

    def argv(self, process: str, cmd: list[str]) -> list[str]:
        """``cmd`` as started on ``process``'s host: in its namespace with ``SYNCSAFE_HOST`` naming it."""
        host = self.host(process)
        return self.fleet.exec_argv(host, list(cmd)) if self.fleet and host else list(cmd)

    def worker_label(self, worker: str) -> str:
        """The Celery node name of ``worker``: ``<worker>@<fleet host>``, or ``<worker>@%h`` (the machine)."""
        host = self.worker_host(worker)
        return f"{worker}@{host}" if host else f"{worker}@%h"

    def client_addresses(self, workers: tuple[str, ...] = ("cpu", "gpu")) -> list[str]:
        """The addresses the services' clients connect from: each host that runs a process of the setup."""
        seen = dict.fromkeys(site.address for site in self.sites(workers).values())
        return list(seen)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` where the services are reachable: here, or inside A's namespace."""
        if self.fleet is None:
            return fn(*args, **kwargs)
        from syncsafe.team.netns_call import call_in

        return call_in(self.fleet.namespace(self.fleet.hosts[0]), fn, *args, **kwargs)

    def describe(self) -> str:
        if self.fleet is None:
            return f"one machine, {LOOPBACK}"
        hosts = {h: [p for p, s in self.sites().items() if s.host == h] for h in self.fleet.hosts}
        return f"fleet {self.fleet.name}: " + "; ".join(
            f"{h} {self.fleet.address(h)} ({', '.join(ps) or 'unused'})" for h, ps in hosts.items())

    def to_json(self) -> dict[str, Any] | None:
        if self.fleet is None:
            return None
        return {"name": self.fleet.name, "hosts": list(self.fleet.hosts), "subnet": self.fleet.subnet}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Placement:
        """The placement saved in ``team.json`` (absent: one machine)."""
        if not data:
            return cls.single()
        try:
            return cls(Fleet(name=data["name"], hosts=tuple(data["hosts"]), subnet=data["subnet"]))
        except (KeyError, TypeError, BadInput) as err:
            raise TeamError(f"team.json: bad placement {data!r}: {err}") from None


def fleet_placement(name: str, hosts: int, subnet: str | None = None) -> Placement:
    """The placement across fleet ``name`` of ``hosts`` hosts (a, b, ...); bad input is a BadInput naming the
    options."""
    from syncsafe.fleet.hosts import DEFAULT_SUBNET

    try:
        return Placement.across(Fleet.of(hosts, name=name, subnet=subnet or DEFAULT_SUBNET))
    except BadInput as err:
        raise BadInput(f"--fleet {name} --hosts {hosts}: {err}") from None


def check_fleet(placement: Placement) -> None:
    """Fail unless the placement's fleet is up and each host holds the address the placement expects."""
    if placement.fleet is None:
        return
    from syncsafe.fleet import netns

    fleet = placement.fleet
    try:
        netns.require_root()
        missing = sorted(set(fleet.namespaces()) - set(netns.existing(fleet)))
        if missing:
            raise TeamError(f"fleet {fleet.name} is not up (namespaces {', '.join(missing)} missing): "
                            f"scripts/fleet.sh up --name {fleet.name} --hosts {len(fleet.hosts)}")
        for host in fleet.hosts:
            if fleet.address(host) not in netns.addresses(fleet, host):
                raise TeamError(f"fleet {fleet.name}: host {host} does not hold {fleet.address(host)} "
                                f"(was the fleet made with another --subnet?)")
    except netns.FleetError as err:
        raise TeamError(str(err)) from None
