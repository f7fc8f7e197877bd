"""A webhook receiver for tests: records every POST; can be told to fail or be down."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)


class WebhookReceiver:
    """``status`` is what it answers (e.g. 503 to simulate an outage); ``received`` holds the
    requests it answered with 2xx, ``rejected`` the others. ``response_body`` replaces the
    default short JSON answer (e.g. a large one)."""

    def __init__(self) -> None:
        self.status = 200
        self.response_body: bytes | None = None
        self.received: list[Received] = []
        self.rejected: list[Received] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                item = Received(self.path, dict(self.headers.items()), body)
                with owner._lock:
                    status, payload = owner.status, owner.response_body
                    (owner.received if 200 <= status < 300 else owner.rejected).append(item)
                if payload is None:
                    payload = b'{"ok":true}' if status < 300 else b'{"error":"unavailable"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
