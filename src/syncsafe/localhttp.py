"""HTTP to the project's own services, never through a proxy.

Every server a syncsafe client talks to with urllib (the vLLM server, its
/metrics, the team setup's Airflow API and readiness checks) is on loopback
or a fleet namespace address. urllib's default opener honours `http_proxy`
for any host when `no_proxy` does not name it, so on a machine with a proxy
configured a health check went to the proxy (and failed) and the Airflow
admin password with it. `urlopen` here uses an opener with no proxy handler
at all: what it opens is reached directly or not at all.
"""

from __future__ import annotations

import urllib.request
from http.client import HTTPResponse

#: An opener whose ProxyHandler knows no proxy: environment proxies are never consulted.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def urlopen(url: str | urllib.request.Request, timeout: float, data: bytes | None = None) -> HTTPResponse:
    """`urllib.request.urlopen` without any proxy (see the module docstring)."""
    return _DIRECT.open(url, data=data, timeout=timeout)
