"""The fleet of test hosts for real: namespaces, veth pairs, a bridge; nothing left behind, nothing routed out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fleet_support import fleet_up, require_namespaces

from syncsafe.fleet import links, netns
from syncsafe.fleet.hosts import Fleet

pytestmark = pytest.mark.slow
FLEET = Fleet.of(3, name="sstf")


def _veths() -> set[str]:
    """veth interfaces in the machine's own namespace."""
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def _connect(fleet: Fleet, host: str, address: str, port: int) -> str:
    """What a TCP connection from `host` to `address:port` meets: connected, refused, or the error."""
    code = (f"import socket\ntry:\n socket.create_connection(({address!r}, {port}), timeout=2); print('connected')\n"
            f"except OSError as e:\n print(type(e).__name__, e.errno)")
    return netns.run_on(fleet, host, [sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()


def test_hosts_reach_each_other_and_nothing_else():
    before = _veths()
    with fleet_up(FLEET) as fleet:
        assert netns.is_up(fleet)
        assert _veths() == before  # every link lives inside the fleet's namespaces
        assert netns.addresses(fleet, "b") == ["127.0.0.1", "10.77.0.2"]
        # a's own loopback is its own: nothing listens there, refused (not b's or the machine's)
        assert _connect(fleet, "a", "10.77.0.3", 9) == "ConnectionRefusedError 111"  # c answers, nothing listens
        assert _connect(fleet, "a", "127.0.0.1", 22).startswith("ConnectionRefusedError")
        # the machine's own address and anything outside are unreachable: no route out
        machine = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
        for address in [*machine[:1], "192.0.2.1", "8.8.8.8"]:
            assert _connect(fleet, "b", address, 80) == "OSError 101", address  # ENETUNREACH
        routes = subprocess.run(["ip", "-n", fleet.namespace("a"), "route"], capture_output=True, text=True).stdout
        assert routes.strip() == "10.77.0.0/24 dev eth0 proto kernel scope link src 10.77.0.1"
    assert netns.existing(FLEET) == []
    assert _veths() == before


def test_a_cut_link_is_unreachable_until_restored():
    with fleet_up(Fleet(name="sstf")) as fleet:
        links.cut(fleet, "b")
        assert _connect(fleet, "a", "10.77.0.2", 9).startswith(("TimeoutError", "OSError 113"))
        links.restore(fleet, "b")
        assert _connect(fleet, "a", "10.77.0.2", 9) == "ConnectionRefusedError 111"


def test_a_failed_up_removes_what_it_made_and_nothing_else():
    require_namespaces()
    fleet = Fleet.of(3, name="sstg")
    netns.down(fleet)
    subprocess.run(["ip", "netns", "add", fleet.namespace("c")], check=True)  # in the way of the third host
    try:
        with pytest.raises(netns.FleetError, match=r"ip netns add sstg-c.*failed"):
            netns.up(fleet)
        assert netns.existing(fleet) == ["sstg-c"]  # sw, a and b are gone again; the one in the way stays
    finally:
        subprocess.run(["ip", "netns", "del", fleet.namespace("c")])
    assert netns.existing(fleet) == []


def test_down_stops_what_runs_on_the_hosts(tmp_path):
    fleet = Fleet(name="ssth")
    with fleet_up(fleet):
        sleeper = subprocess.Popen(fleet.exec_argv("b", ["sleep", "300"]))
        # `ip netns exec` enters the namespace after it starts: wait for it there (a loaded machine is slow)
        deadline = time.monotonic() + 30
        while not netns.pids(fleet.namespace("b")) and time.monotonic() < deadline and sleeper.poll() is None:
            time.sleep(0.1)
        assert netns.pids(fleet.namespace("b")), "the sleeper never ran in host b's namespace"
        netns.down(fleet)
        assert sleeper.wait(timeout=15) != 0
        assert netns.existing(fleet) == []


def test_the_script_brings_a_fleet_up_and_down():
    script = [str(__import__("pathlib").Path(__file__).resolve().parents[2] / "scripts" / "fleet.sh")]
    require_namespaces()
    up = subprocess.run([*script[:1], "up", "--name", "ssti"], capture_output=True, text=True)
    try:
        assert up.returncode == 0, up.stderr
        assert "b\tssti-b\teth0 10.77.0.2/24\tup" in up.stdout
        again = subprocess.run([*script[:1], "up", "--name", "ssti"], capture_output=True, text=True)
        assert again.returncode == 1 and "already up" in again.stderr
        bad = subprocess.run([*script[:1], "up", "--name", "SS"], capture_output=True, text=True)
        assert bad.returncode == 2 and "fleet name 'SS'" in bad.stderr
    finally:
        down = subprocess.run([*script[:1], "down", "--name", "ssti"], capture_output=True, text=True)
    assert down.returncode == 0 and netns.existing(Fleet(name="ssti")) == []


def test_merges_between_hosts_take_the_time_the_link_rate_gives_them():
    """Real merges (outer step over gloo) across a shaped link: never faster than the cost model's time on
    the wire (less the token bucket's one burst), far slower than on the free link."""
    from syncsafe.control.merge_link import model_comm_s
    from syncsafe.fleet.merge_probe import measure

    with fleet_up(Fleet(name="sstp")) as fleet:
        free, payload = measure(fleet, links.Shape(), floats=590_464, merges=3, port=29611)
        slow, _ = measure(fleet, links.Shape(rate_mbit=20), floats=590_464, merges=3, port=29612)
        wire = model_comm_s(payload, 2, 20)
        assert payload == 4 * (590_464 + 1)  # the payload and its weight
        assert min(slow.merge_s) >= wire - 8 * links.MIN_BURST_BYTES / 20e6, (slow.merge_s, wire)
        assert slow.median_s > 5 * free.median_s
        if links.has_netem():
            delayed, _ = measure(fleet, links.Shape(delay_ms=20), floats=590_464, merges=3, port=29613)
            assert min(delayed.merge_s) >= 2 * 0.020  # one delay per ring step, two steps
        else:
            with pytest.raises(netns.FleetError, match="needs the netem qdisc"):
                links.shape(fleet, "b", links.Shape(delay_ms=20))


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def test_the_netem_probe_uses_its_own_namespace_and_removes_it_on_every_exit_path(monkeypatch):
    require_namespaces()
    probe = links.has_netem.__wrapped__  # uncached: each call probes
    bystander = f"{links.PROBE_PREFIX}1-bystander"  # a probe-looking namespace of a live process (pid 1)
    subprocess.run(["ip", "netns", "add", bystander], check=True)
    try:
        before = _namespaces()
        seen: list[str] = []
        real_run = subprocess.run

        def watch(args, *a, **kw):  # the names the probe adds, and whatever it ran
            if list(args[:3]) == ["ip", "netns", "add"]:
                seen.append(args[3])
            return real_run(args, *a, **kw)

        monkeypatch.setattr(links.subprocess, "run", watch)
        assert isinstance(probe(), bool) and isinstance(probe(), bool)  # returned normally, twice
        assert len(seen) == 2 and seen[0] != seen[1]  # unique per probe, even in one process
        assert all(n.startswith(f"{links.PROBE_PREFIX}{os.getpid()}-") for n in seen)
        assert _namespaces() == before

        def interrupted(args, *a, **kw):  # stopped in the middle: after its namespace was made
            if "tc" in args:
                raise KeyboardInterrupt
            return watch(args, *a, **kw)

        monkeypatch.setattr(links.subprocess, "run", interrupted)
        with pytest.raises(KeyboardInterrupt):
            probe()
        assert len(seen) == 3 and _namespaces() == before
        monkeypatch.setattr(links.subprocess, "run", real_run)

        # killed outright (SIGKILL: no finally): its namespace names a pid that is gone; the next probe reaps it
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        left = f"{links.PROBE_PREFIX}{dead.pid}-abcdef"
        subprocess.run(["ip", "netns", "add", left], check=True)
        probe()
        assert left not in _namespaces() and _namespaces() == before  # the bystander is kept
    finally:
        subprocess.run(["ip", "netns", "del", bystander], capture_output=True)
