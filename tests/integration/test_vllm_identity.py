"""The replay measures only its own healthy server, and the server never outlives the stage.

- identity: a server on the port that lists another served model is refused
  (a small OpenAI-style server on loopback stands in for a foreign one);
- lifetime (slow, real vLLM CPU server): the replay stage killed with SIGTERM
  or SIGKILL leaves no server process and no listening port behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml
from aiohttp import web

from vllm_env import VLLM_PYTHON, eager, require_vllm_python
from syncsafe.serving import vllm_server
from syncsafe.serving.vllm_server import ServerError, VllmServer, served_models

#: vLLM's compile cache, shared by the tests of a session (the first start compiles for minutes).
VLLM_CACHE = Path(os.environ.get("SYNCSAFE_TEST_VLLM_CACHE", "/tmp/syncsafe-test-vllm-cache"))


def _serve_models(ids: list[str]) -> tuple[str, Callable[[], None]]:
    """An OpenAI-style `/v1/models` on a free loopback port in a thread; returns (base URL, stop)."""
    loop = asyncio.new_event_loop()
    state: dict = {}

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health)
        state["runner"] = runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        state["port"] = runner.addresses[0][1]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)

    return f"http://127.0.0.1:{state['port']}", stop


def test_a_foreign_server_on_the_port_is_never_measured(tmp_path):
    url, stop = _serve_models(["someone-elses-model"])
    try:
        assert served_models(url) == ["someone-elses-model"]
        server = VllmServer("python", "m", tmp_path / "server.log")
        server.port, server.served_name = int(url.rsplit(":", 1)[1]), "syncsafe-0123456789ab"
        with pytest.raises(ServerError, match="answers as another server.*refusing to measure"):
            server.healthy()  # /health would say 200: identity is what counts
        server.served_name = "someone-elses-model"
        assert server.healthy()
    finally:
        stop()
    assert served_models(url) is None  # nothing answers there any more


#: A stand-in for the server's port handling: it binds --port itself (as vLLM does), says what vLLM says when
#: the port is taken, else answers /v1/models with its --served-model-name.
STAND_IN = """
import json, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
try:
    server = HTTPServer(("127.0.0.1", port), None)
except OSError as err:
    print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): {err}", flush=True)
    sys.exit(1)
class Models(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
server.RequestHandlerClass = Models
server.serve_forever()
"""


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    ports = iter([taken.getsockname()[1]])
    real_free_port = vllm_server.free_port
    monkeypatch.setattr(vllm_server, "free_port", lambda: next(ports, None) or real_free_port())
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv = sys.argv[:1] + sys.argv[3:]\n"
                      f"exec({STAND_IN!r})\n")
    python.chmod(0o755)
    server = VllmServer(python, "m", tmp_path / "server.log", startup_timeout_s=30, scratch_root=tmp_path)
    try:
        with server:
            assert server.port != taken.getsockname()[1] and served_models(server.base_url) == [server.served_name]
    finally:
        taken.close()
    assert "Address already in use" not in (tmp_path / "server.log").read_text()  # the log is the last attempt's


def _project(root: Path, raw: dict) -> Path:
    """The tiny profile's params (`raw`, from the `tiny_raw` fixture): harness schedules, one draw."""
    raw["schedules"].update({"random_draws": 1, "source": "harness"})
    raw["replay"]["simulator"]["calibration"] = None
    eager(raw)["replay"]["vllm"].update({"python": str(VLLM_PYTHON), "draws": 1, "warmup_s": 0,
                                         "startup_timeout_s": 900})
    root.mkdir(parents=True, exist_ok=True)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    VLLM_CACHE.mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    (root / "models" / "vllm-cache").symlink_to(VLLM_CACHE)
    return path


def _cli(*args: str, params: Path, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "syncsafe.cli", *args, "--params", str(params), "--root", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _server_listening(stage: psutil.Process) -> tuple[list[psutil.Process], int] | None:
    for child in stage.children(recursive=True):
        try:
            if "vllm.entrypoints.openai.api_server" not in " ".join(child.cmdline()):
                continue
            ports = [c.laddr.port for c in child.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if ports:
            return [child, *child.children(recursive=True)], ports[0]
    return None


def _port_listening(port: int) -> bool:
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in psutil.net_connections(kind="inet"))


@pytest.mark.slow  # a real server that measures nothing: it runs beside the other tests (not `real_server`)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killing_the_stage_leaves_no_server_behind(tmp_path, sig, tiny_raw):
    require_vllm_python()
    params = _project(tmp_path, tiny_raw())
    for cmd in (["traces"], ["schedules", "build"], ["schedules", "index"]):
        assert _cli(*cmd, params=params, root=tmp_path).wait(timeout=300) == 0
    stage = _cli("replay", "profile", params=params, root=tmp_path)  # the first stage that starts a server
    server_procs: list[psutil.Process] = []
    try:
        found, deadline = None, time.monotonic() + 900
        while found is None and time.monotonic() < deadline and stage.poll() is None:
            found = _server_listening(psutil.Process(stage.pid))
            time.sleep(1.0)
        assert found is not None, f"the server never listened: {stage.stderr.read().decode()[-2000:]}"
        server_procs, port = found
        assert server_procs[0].pid != stage.pid
        stage.send_signal(sig)
        stage.wait(timeout=120)
        gone, alive = psutil.wait_procs(server_procs, timeout=60)
        assert not alive, f"server processes outlived the stage: {[p.pid for p in alive]}"
        deadline = time.monotonic() + 30
        while _port_listening(port) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _port_listening(port), f"port {port} still listening after the stage died"
        assert not (tmp_path / "runs" / "server-profile" / "server.json").exists()
        assert not list((tmp_path / "runs").rglob("server.log")) and not list((tmp_path / "runs").rglob(".scratch"))
        assert (tmp_path / "logs" / "profile-vllm" / "server.log").is_file()
    finally:
        if stage.poll() is None:
            stage.kill()
        for proc in server_procs:  # never leave a server behind, even when the test fails
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
