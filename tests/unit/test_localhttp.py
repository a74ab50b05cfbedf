"""Clients of the project's own services never go through a configured proxy."""

from __future__ import annotations

import http.server
import os
import threading
import urllib.error
import urllib.request

import pytest

from syncsafe import localhttp


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        body = b"direct"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_a_loopback_service_is_reached_directly_with_a_proxy_configured_and_no_no_proxy(server, monkeypatch):
    dead_proxy = "http://127.0.0.1:9"  # the discard port on loopback: nothing answers there
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(urllib.error.URLError):  # what urllib's default opener does: asks the proxy
        urllib.request.build_opener().open(server, timeout=5)
    with localhttp.urlopen(server, timeout=5) as resp:
        assert resp.read() == b"direct"
    request = urllib.request.Request(server, headers={"Authorization": "Basic c2VjcmV0"})
    with localhttp.urlopen(request, timeout=5) as resp:  # a request with credentials: still direct
        assert resp.status == 200


def test_a_tracking_server_is_reached_directly_by_requests_the_mlflow_client_s_http(server, monkeypatch):
    import requests

    from syncsafe.tracking.settings import tracking_uri

    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    for name in ("no_proxy", "NO_PROXY"):  # set (empty) so that the test's end restores what was there
        monkeypatch.setenv(name, "")
    with pytest.raises(requests.exceptions.ProxyError):  # what requests does unless no_proxy names the host
        requests.get(server, timeout=5)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    assert tracking_uri() == server
    assert requests.get(server, timeout=5).text == "direct"
    monkeypatch.setenv("NO_PROXY", "example.org")
    localhttp.bypass_proxy("http://10.77.0.2:5000")  # a fleet host: added beside what was listed, once
    localhttp.bypass_proxy("http://10.77.0.2:5000")
    assert os.environ["NO_PROXY"].split(",") == ["example.org", "127.0.0.1", "localhost", "::1", "10.77.0.2"]
    before = dict(os.environ)
    localhttp.bypass_proxy("sqlite:////tmp/mlflow.db")  # no network host: nothing changes
    assert dict(os.environ) == before
