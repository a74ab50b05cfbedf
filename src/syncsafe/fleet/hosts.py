"""The names and addresses of a fleet of test hosts (no side effects: the command builders test them).

A fleet called ``ssf`` with hosts ``a`` and ``b`` on ``10.77.0.0/24`` is the
namespaces ``ssf-a`` and ``ssf-b`` (each with ``lo`` and ``eth0``, addresses
``10.77.0.1`` and ``10.77.0.2``) and ``ssf-sw``, the switch: a bridge ``br0``
with one port per host (``port-a``, ``port-b``), the other ends of the hosts'
veth pairs.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from syncsafe.errors import BadInput
from syncsafe.procs import HOST_ENV

#: The interface every host has on the fleet's subnet.
HOST_IFNAME = "eth0"
BRIDGE = "br0"
SWITCH = "sw"
DEFAULT_NAME = "ssf"
DEFAULT_SUBNET = "10.77.0.0/24"
_NAME = re.compile(r"^[a-z][a-z0-9]{0,5}$")


@dataclass(frozen=True)
class Fleet:
    """`hosts` named like ``a``, ``b``, ``c``; `name` prefixes every namespace of the fleet."""

    name: str = DEFAULT_NAME
    hosts: tuple[str, ...] = ("a", "b")
    subnet: str = DEFAULT_SUBNET

    def __post_init__(self) -> None:
        for label, value in [("fleet name", self.name), *(("host name", h) for h in self.hosts)]:
            if not _NAME.match(value) or value == SWITCH:
                raise BadInput(f"{label} {value!r}: expected 1-6 lower-case letters or digits, starting with a "
                               f"letter, not {SWITCH!r}")
        if len(set(self.hosts)) != len(self.hosts) or not 1 <= len(self.hosts) <= 8:
            raise BadInput(f"fleet hosts {list(self.hosts)}: expected 1 to 8 distinct names")
        try:
            net = ipaddress.IPv4Network(self.subnet)
        except ValueError as err:
            raise BadInput(f"fleet subnet {self.subnet!r}: {err}") from None
        if not net.is_private or net.num_addresses < len(self.hosts) + 2:
            raise BadInput(f"fleet subnet {self.subnet}: expected a private IPv4 range with room for "
                           f"{len(self.hosts)} hosts")

    @classmethod
    def of(cls, hosts: int = 2, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET) -> Fleet:
        """A fleet of `hosts` hosts named a, b, c, ..."""
        if not 1 <= hosts <= 8:
            raise BadInput(f"--hosts {hosts}: expected 1 to 8")
        return cls(name=name, hosts=tuple("abcdefgh"[:hosts]), subnet=subnet)

    @property
    def switch(self) -> str:
        return f"{self.name}-{SWITCH}"

    def namespace(self, host: str) -> str:
        self._check(host)
        return f"{self.name}-{host}"

    def namespaces(self) -> list[str]:
        """Every namespace of the fleet, switch first (the order `up` creates them in)."""
        return [self.switch, *(self.namespace(h) for h in self.hosts)]

    def address(self, host: str) -> str:
        self._check(host)
        net = ipaddress.IPv4Network(self.subnet)
        return str(net.network_address + 1 + self.hosts.index(host))

    @property
    def prefixlen(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen

    def port(self, host: str) -> str:
        """The switch's end of `host`'s veth pair."""
        self._check(host)
        return f"port-{host}"

    def host_of(self, address: str) -> str | None:
        """The host that holds `address`, if any."""
        return next((h for h in self.hosts if self.address(h) == address), None)

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run on `host`: in its namespace, with `SYNCSAFE_HOST` naming it (the rest of the
        environment passes through)."""
        return ["ip", "netns", "exec", self.namespace(host), "env", f"{HOST_ENV}={host}", *argv]

    def _check(self, host: str) -> None:
        if host not in self.hosts:
            raise BadInput(f"host {host!r} is not in fleet {self.name} (hosts: {', '.join(self.hosts)})")


def up_commands(fleet: Fleet) -> list[list[str]]:
    """The `ip` commands that build `fleet`, in order (each one undone by deleting the namespaces made)."""
    sw = fleet.switch
    cmds = [["ip", "netns", "add", sw],
            ["ip", "-n", sw, "link", "set", "lo", "up"],
            ["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "-n", sw, "link", "set", BRIDGE, "up"]]
    for host in fleet.hosts:
        ns, port = fleet.namespace(host), fleet.port(host)
        cmds += [["ip", "netns", "add", ns],
                 ["ip", "-n", ns, "link", "set", "lo", "up"],
                 ["ip", "link", "add", "name", HOST_IFNAME, "netns", ns, "type", "veth",
                  "peer", "name", port, "netns", sw],
                 ["ip", "-n", sw, "link", "set", port, "master", BRIDGE],
                 ["ip", "-n", sw, "link", "set", port, "up"],
                 ["ip", "-n", ns, "addr", "add", f"{fleet.address(host)}/{fleet.prefixlen}", "dev", HOST_IFNAME],
                 ["ip", "-n", ns, "link", "set", HOST_IFNAME, "up"]]
    return cmds
