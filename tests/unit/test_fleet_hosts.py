"""The fleet's names, addresses and command lines (no namespaces made here: see tests/integration/test_fleet.py)."""

from __future__ import annotations

import pytest

from syncsafe.errors import BadInput
from syncsafe.fleet.hosts import Fleet, up_commands
from syncsafe.fleet.links import Shape, qdisc_args
from syncsafe.fleet.netns import FleetError


def test_hosts_get_consecutive_addresses_and_prefixed_namespaces():
    fleet = Fleet.of(3, name="ssx", subnet="10.9.8.0/24")
    assert fleet.hosts == ("a", "b", "c")
    assert [fleet.address(h) for h in fleet.hosts] == ["10.9.8.1", "10.9.8.2", "10.9.8.3"]
    assert fleet.namespaces() == ["ssx-sw", "ssx-a", "ssx-b", "ssx-c"]
    assert fleet.host_of("10.9.8.2") == "b" and fleet.host_of("10.9.8.9") is None
    assert fleet.exec_argv("b", ["python", "-V"]) == ["ip", "netns", "exec", "ssx-b", "env", "SYNCSAFE_HOST=b",
                                                      "python", "-V"]


@pytest.mark.parametrize("kwargs, names", [
    ({"name": "Bad"}, "fleet name"), ({"name": "toolongname"}, "fleet name"), ({"hosts": ("a", "a")}, "distinct"),
    ({"hosts": ("sw",)}, "host name"), ({"subnet": "8.8.8.0/24"}, "private"), ({"subnet": "10.0.0.0/31"}, "room"),
    ({"subnet": "nope"}, "subnet"),
])
def test_bad_fleets_are_refused_naming_the_field(kwargs, names):
    with pytest.raises(BadInput, match=names):
        Fleet(**kwargs)


def test_an_unknown_host_is_named():
    with pytest.raises(BadInput, match=r"host 'z' is not in fleet ssf \(hosts: a, b\)"):
        Fleet().address("z")


def test_up_builds_the_switch_first_then_each_host_on_its_own_veth_pair():
    cmds = [" ".join(c) for c in up_commands(Fleet(name="ssx"))]
    assert cmds[:4] == ["ip netns add ssx-sw", "ip -n ssx-sw link set lo up", "ip -n ssx-sw link add br0 type bridge",
                        "ip -n ssx-sw link set br0 up"]
    assert "ip link add name eth0 netns ssx-b type veth peer name port-b netns ssx-sw" in cmds
    assert "ip -n ssx-b addr add 10.77.0.2/24 dev eth0" in cmds
    # nothing is made in the machine's own namespace, and no host gets a route out
    assert all(" netns " in c or c.startswith(("ip -n ", "ip netns add")) for c in cmds)
    assert not any("route" in c for c in cmds)


def test_a_shape_is_one_netem_qdisc_or_a_token_bucket_for_a_rate_alone():
    assert qdisc_args(Shape(100, 5), netem=True) == ["netem", "delay", "5ms", "rate", "100mbit", "limit", "100000"]
    assert qdisc_args(Shape(None, 2.5), netem=True) == ["netem", "delay", "2.5ms", "limit", "100000"]
    assert qdisc_args(Shape(8, 0), netem=False) == ["tbf", "rate", "8mbit", "burst", str(64 * 1024), "latency", "1s"]
    # 1 ms at 1 Gbit/s is more than the minimum burst
    assert qdisc_args(Shape(1000, 0), netem=False)[4] == str(125_000)


def test_a_delay_without_netem_is_refused_not_dropped():
    with pytest.raises(FleetError, match="needs the netem qdisc"):
        qdisc_args(Shape(100, 5), netem=False)


@pytest.mark.parametrize("rate, delay", [(0, 0), (-1, 0), (10, -1), (float("nan"), 0), (10, float("nan")),
                                         (float("inf"), 0), (10, float("inf"))])
def test_bad_shapes_are_refused(rate, delay):
    with pytest.raises(BadInput, match="link"):
        Shape(rate, delay)


@pytest.mark.parametrize("argv", [["shape", "a", "--delay-ms", "nan"], ["shape", "a", "--rate-mbit", "inf"],
                                  ["up", "--hosts", "0"], ["status", "--hosts", "9"]])
def test_every_bad_number_is_one_line_and_exit_2(argv):
    from typer.testing import CliRunner

    from syncsafe.fleet.__main__ import app

    done = CliRunner().invoke(app, argv)
    assert done.exit_code == 2, done.output
    assert done.output.count("\n") == 1 and done.output.startswith("error: ") and "Traceback" not in done.output


def test_a_machine_without_ip_gets_one_line_not_a_traceback(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from syncsafe.fleet.__main__ import app

    monkeypatch.setenv("PATH", str(tmp_path))  # no ip, no tc
    done = CliRunner().invoke(app, ["status"])
    assert done.exit_code == 1 and done.output.strip() == \
        "error: ip not found on PATH (the fleet needs iproute2's ip and tc)"
