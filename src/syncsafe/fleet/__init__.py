"""A fleet of test hosts on one machine: network namespaces joined by veth pairs on a bridge.

``scripts/fleet.sh up|down|status`` (``python -m syncsafe.fleet``) makes two
or three "hosts", each a network namespace with its own loopback and one
interface (``eth0``) on a private test subnet, joined through a bridge that
lives in a namespace of its own (the switch). Nothing is routed out: the
hosts have no default route and the machine's own namespace is not on the
bridge. It needs root (CI runs as root).

- :mod:`syncsafe.fleet.hosts`: the fleet's names and addresses (pure);
- :mod:`syncsafe.fleet.netns`: ``up`` / ``down`` / running a command on a host;
- :mod:`syncsafe.fleet.links`: network pressure and faults on a host's link
  (rate and delay with ``tc``, a cut with ``ip link set ... down``).
"""
