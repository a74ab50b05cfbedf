"""Network pressure and faults on a fleet host's link.

A shaped link carries `rate_mbit` and `delay_ms` each way: the same ``tc``
qdisc on the host's ``eth0`` (what it sends) and on its switch port (what it
receives). ``tc netem`` does both rate and delay where the kernel has it;
where it does not (``Specified qdisc kind is unknown``), a rate alone is a
token bucket (``tbf``) and a delay is refused, naming the missing qdisc, so
a measurement never silently runs without the delay it asked for. A cut is
``ip link set <port> down`` on the switch side (the host keeps its address and
sees no carrier); ``restore`` sets it up again.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import subprocess
from dataclasses import dataclass

from syncsafe.errors import BadInput
from syncsafe.fleet.hosts import HOST_IFNAME, Fleet
from syncsafe.fleet.netns import FleetError, _ip

#: Bytes a token bucket may send at once: at least one jumbo burst, at least 1 ms at the rate.
MIN_BURST_BYTES = 64 * 1024


@dataclass(frozen=True)
class Shape:
    """A link's rate (Mbit/s; None: line rate) and one-way delay (ms) added each way."""

    rate_mbit: float | None = None
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not (math.isfinite(self.rate_mbit) and self.rate_mbit > 0):
            raise BadInput(f"link rate_mbit {self.rate_mbit}: expected a finite positive rate or none")
        if not (math.isfinite(self.delay_ms) and self.delay_ms >= 0):
            raise BadInput(f"link delay_ms {self.delay_ms}: expected a finite number >= 0")

    @property
    def is_plain(self) -> bool:
        return self.rate_mbit is None and self.delay_ms == 0

    def describe(self) -> str:
        rate = "line rate" if self.rate_mbit is None else f"{self.rate_mbit:g} Mbit/s"
        return f"{rate}, +{self.delay_ms:g} ms each way"


def qdisc_args(shape: Shape, netem: bool) -> list[str]:
    """The `tc qdisc replace ... root` arguments after `root` for `shape` (netem if the kernel has it)."""
    if netem:
        args = ["netem", "delay", f"{shape.delay_ms:g}ms"]
        if shape.rate_mbit is not None:
            args += ["rate", f"{shape.rate_mbit:g}mbit"]
        return args + ["limit", "100000"]
    if shape.delay_ms > 0:
        raise FleetError(f"a link delay of {shape.delay_ms:g} ms needs the netem qdisc, which this kernel "
                         f"does not have (tc: Specified qdisc kind is unknown); only a rate can be shaped here")
    if shape.rate_mbit is None:
        raise FleetError("a plain link has no qdisc to put on it (clear it instead)")
    burst = max(MIN_BURST_BYTES, int(shape.rate_mbit * 1e6 / 8 / 1000))
    return ["tbf", "rate", f"{shape.rate_mbit:g}mbit", "burst", str(burst), "latency", "1s"]


#: Scratch namespaces of the netem probe: `<this><pid>-<random>`, unique per probe; one whose pid is gone was
#: left by a killed probe and is reaped by the next.
PROBE_PREFIX = "ssf-netem-"


def reap_probe_namespaces() -> list[str]:
    """Delete the probe namespaces whose process is gone (a probe killed by SIGKILL); the ones deleted."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    gone = []
    for name in (line.split()[0] for line in listed.splitlines() if line.startswith(PROBE_PREFIX)):
        pid = name[len(PROBE_PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            gone.append(name)
    return gone


@functools.cache
def has_netem() -> bool:
    """Whether this kernel has the netem qdisc (tried on a scratch namespace's loopback-less dummy link; the
    namespace's name is unique to this probe, so no other namespace is ever touched)."""
    reap_probe_namespaces()
    ns = f"{PROBE_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], capture_output=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "probe0", "type", "dummy"], capture_output=True)
        done = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "probe0", "root", "netem",
                               "delay", "1ms"], capture_output=True, text=True)
        return done.returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _ends(fleet: Fleet, host: str) -> list[tuple[str, str]]:
    """(namespace, device) of both ends of `host`'s link."""
    return [(fleet.namespace(host), HOST_IFNAME), (fleet.switch, fleet.port(host))]


def shape(fleet: Fleet, host: str, link: Shape) -> None:
    """Put `link` on `host`'s link both ways (replacing any shape before it); a plain shape clears it."""
    if link.is_plain:
        clear(fleet, host)
        return
    args = qdisc_args(link, has_netem())
    for ns, dev in _ends(fleet, host):
        _ip(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", *args])


def clear(fleet: Fleet, host: str) -> None:
    for ns, dev in _ends(fleet, host):
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)


def cut(fleet: Fleet, host: str) -> None:
    """Take `host`'s link down at the switch: nothing reaches it or leaves it until `restore`."""
    _ip(["ip", "-n", fleet.switch, "link", "set", fleet.port(host), "down"])


def restore(fleet: Fleet, host: str) -> None:
    """Bring `host`'s link back; the hosts forget the failed address lookups of the cut (else the first
    connection after it meets "no route to host")."""
    _ip(["ip", "-n", fleet.switch, "link", "set", fleet.port(host), "up"])
    for other in fleet.hosts:
        target = [] if other == host else ["to", fleet.address(host)]
        _ip(["ip", "-n", fleet.namespace(other), "neigh", "flush", "dev", HOST_IFNAME, *target])
