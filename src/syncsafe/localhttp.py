"""HTTP to the project's own services, never through a proxy.

Every server a syncsafe client talks to with urllib (the vLLM server, its
/metrics, the team setup's Airflow API and readiness checks) is on loopback
or a fleet namespace address. urllib's default opener honours `http_proxy`
for any host when `no_proxy` does not name it, so on a machine with a proxy
configured a health check went to the proxy (and failed) and the Airflow
admin password with it. `urlopen` here uses an opener with no proxy handler
at all: what it opens is reached directly or not at all.

Clients built on `requests` (MLflow's) have no such opener: `bypass_proxy`
adds a service's host, with loopback, to `no_proxy`/`NO_PROXY` of this
process (and so of the processes it starts), which `requests` honours.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from http.client import HTTPResponse

from syncsafe.procs import LOOPBACK

#: An opener whose ProxyHandler knows no proxy: environment proxies are never consulted.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def urlopen(url: str | urllib.request.Request, timeout: float, data: bytes | None = None) -> HTTPResponse:
    """`urllib.request.urlopen` without any proxy (see the module docstring)."""
    return _DIRECT.open(url, data=data, timeout=timeout)


#: Always reached directly, whatever the service: loopback by address (the project's) and by name.
LOOPBACK_HOSTS = (LOOPBACK, "localhost", "::1")


def bypass_proxy(url: str) -> None:
    """Make `requests` (and urllib's default opener) reach `url`'s host and loopback directly: each is added to
    `no_proxy` and `NO_PROXY` of this process unless listed there already. A URL without a network host (a
    SQLite or file store) changes nothing."""
    host = urllib.parse.urlsplit(url).hostname if "://" in url else None
    if not host:
        return
    for name in ("no_proxy", "NO_PROXY"):
        listed = [h.strip() for h in os.environ.get(name, "").split(",") if h.strip()]
        wanted = [h for h in (*LOOPBACK_HOSTS, host) if h not in listed]
        if wanted:
            os.environ[name] = ",".join(listed + wanted)
