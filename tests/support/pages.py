"""A tiny HTTP server whose page a test can change at any time.

Typical use: stand in for an inference engine's ``/metrics`` page that Prometheus
(or our own scraper) scrapes, and change the exposition between scrapes::

    with StaticPageServer("x_total 1\\n") as srv:
        ...                       # srv.url -> "http://127.0.0.1:PORT/metrics"
        srv.page = "x_total 2\\n"  # the next request sees the new page

``page`` may also be a callable; it is called once per request (under a lock, so
calls are serialised) and its return value is served. A generator-like callable
makes every scrape see the next state, deterministically.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PageContent = str | bytes
Page = PageContent | Callable[[], PageContent]

#: Content type of the Prometheus text exposition format 0.0.4.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up early (size cap, timeout) is expected here, not an error."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class StaticPageServer:
    """Threaded ``http.server`` on 127.0.0.1 (ephemeral port) serving ``.page``.

    Attributes (all may be changed while running):

    * ``page`` -- str/bytes, or a zero-argument callable returning one.
    * ``status`` -- HTTP status to answer with (default 200), to simulate failures.
    * ``reason`` -- the status line's reason phrase; None: the standard one.
    * ``content_type`` -- defaults to the Prometheus text format.
    * ``paths`` -- if not None, only these paths are served, others get 404.

    Read-only: ``url`` (``http://127.0.0.1:PORT/metrics``), ``base_url``,
    ``host_port`` (``127.0.0.1:PORT``, for Prometheus static_configs),
    ``requests`` (number of requests answered), ``request_paths``.

    Use as a context manager, or call :meth:`start` / :meth:`close`.
    """

    def __init__(
        self,
        page: Page = "",
        *,
        content_type: str = PROMETHEUS_TEXT,
        path: str = "/metrics",
        paths: set[str] | None = None,
    ) -> None:
        self.page: Page = page
        self.status = 200
        self.reason: str | None = None
        self.content_type = content_type
        self.path = path
        self.paths = paths
        self.requests = 0
        self.request_paths: list[str] = []
        self.request_headers: list[dict[str, str]] = []
        self.gzip = False  # compress when the client accepts gzip, as real exporters do
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> StaticPageServer:
        if self._httpd is not None:
            return self
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with server._lock:
                    server.requests += 1
                    server.request_paths.append(path)
                    server.request_headers.append(dict(self.headers.items()))
                    if server.paths is not None and path not in server.paths:
                        status, body = 404, b"not found\n"
                    else:
                        page = server.page
                        content = page() if callable(page) else page
                        body = content.encode("utf-8") if isinstance(content, str) else bytes(content)
                        status = server.status
                encoding = None
                if server.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                    import gzip

                    body, encoding = gzip.compress(body), "gzip"
                self.send_response(status, server.reason)
                self.send_header("Content-Type", server.content_type)
                if encoding:
                    self.send_header("Content-Encoding", encoding)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="StaticPageServer", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> StaticPageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- addresses
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("StaticPageServer is not running")
        return int(self._httpd.server_address[1])

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host_port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}{self.path}"
