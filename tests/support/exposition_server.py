"""A stand-in for a vLLM server's `/health` and `/metrics`, answering with a recorded exposition text.

Used by the live-signal tests and by benchmarks/bench_live.py (which puts
tests/ on its path). HTTP/1.1 with keep-alive, like the real server's
uvicorn; `stop_answering()` makes it behave like a server that went away:
open connections are dropped without an answer and new ones are refused.
"""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server
    disable_nagle_algorithm = True  # TCP_NODELAY, as uvicorn: no delayed-ACK stall between header and body writes
    server: ExpositionServer

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self.server.answering:
            self.close_connection = True
            return
        self.server.connections.add(self.client_address)
        body = (self.server.text if self.path == "/metrics" else "").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class ExpositionServer(http.server.ThreadingHTTPServer):
    """`with ExpositionServer(text) as server:` -> answers at `server.url`; `server.text` may change meanwhile."""

    daemon_threads = True

    def __init__(self, text: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.text = text
        self.answering = True
        #: Client (host, port) pairs that got an answer: one per TCP connection.
        self.connections: set[tuple[str, int]] = set()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):  # a client that timed out or hung up: the client counts it
        pass

    def stop_answering(self) -> None:
        """From now on like a server that went away."""
        self.answering = False
        self.shutdown()
        self.server_close()

    def __enter__(self) -> ExpositionServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.answering:
            self.stop_answering()


def main(argv: list[str] | None = None) -> None:
    """`python tests/support/exposition_server.py [FILE]`: serve FILE (default: the busy fixture) until killed; prints the url."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    text = Path(args[0] if args else FIXTURES / "vllm_metrics_busy.txt").read_text()
    with ExpositionServer(text) as server:
        print(server.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
