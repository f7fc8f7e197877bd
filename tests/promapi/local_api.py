"""A tiny local HTTP server whose answers a test scripts, and which records what it received.

For the faults a real Prometheus cannot be made to show on demand (a 503, a slow answer,
an HTML page, a credential check): ``LocalAPI(handler)`` serves ``handler(request)`` on a
free 127.0.0.1 port from a thread per connection, and keeps every :class:`Received`
request and the most requests it ever had in flight at once.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    params: dict[str, list[str]]  # query string and form body together


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    close_after: int | None = None  # send only this many body bytes, then drop the connection
    length: bool = True  # False: no Content-Length, the body ends when the connection closes


Handler = Callable[[Received], Answer]


class LocalAPI:
    def __init__(self, handler: Handler, tls: tuple[str, str] | None = None) -> None:
        """``tls``: (certificate file, key file) to serve HTTPS."""
        self.handler = handler
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                parts = urlsplit(self.path)
                params = parse_qs(parts.query)
                for k, v in parse_qs(body).items():
                    params.setdefault(k, []).extend(v)
                req = Received(self.command, parts.path, {k.lower(): v for k, v in self.headers.items()}, params)
                with outer._lock:
                    outer.received.append(req)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    answer = outer.handler(req)
                finally:
                    with outer._lock:
                        outer.in_flight -= 1
                self.send_response(answer.status)
                for name, value in answer.headers:
                    self.send_header(name, value)
                if answer.length:
                    self.send_header("Content-Length", str(len(answer.body)))
                if answer.close_after is not None or not answer.length:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(answer.body if answer.close_after is None else answer.body[: answer.close_after])
                if answer.close_after is not None or not answer.length:
                    self.close_connection = True

            do_GET = do_POST = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="local-api", daemon=True)

    def __enter__(self) -> LocalAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
