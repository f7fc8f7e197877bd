"""aiohttp servers on 127.0.0.1 in a background thread, for tests that run the service in
another loop: an HTTP service-discovery endpoint whose answer a test changes, and a
round-robin proxy in front of several engines (what a Kubernetes Service does to a scraper).

    with RoundRobinProxy([url_a, url_b]) as proxy:   # proxy.url -> http://127.0.0.1:PORT/metrics
        ...
        proxy.backends = [url_b]                      # from now on only b answers (a failover)
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
from aiohttp import web


class ThreadedApp:
    """Runs an aiohttp application in its own thread and loop; ``base_url`` once started."""

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.requests = 0

    def build(self) -> web.Application:
        raise NotImplementedError

    async def on_start(self) -> None:
        """Resources that belong to the server's loop (client sessions)."""

    async def on_stop(self) -> None:
        pass

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name=type(self).__name__)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await self.on_start()
        runner = web.AppRunner(self.build(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self.on_stop()

    def close(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._thread = None

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SDServer(ThreadedApp):
    """Prometheus' HTTP SD endpoint at ``/sd``: answers ``groups`` as JSON, or ``status`` /
    ``content_type`` / ``body`` when a test sets them to simulate a broken server."""

    def __init__(self, groups: list[dict] | None = None) -> None:
        super().__init__()
        self.groups: list[dict] = groups or []
        self.status = 200
        self.content_type = "application/json"
        self.body: bytes | None = None  # raw answer instead of ``groups``
        self.refresh_headers: list[str] = []

    @property
    def url(self) -> str:
        return f"{self.base_url}/sd"

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/sd", self._answer)
        return app

    async def _answer(self, request: web.Request) -> web.Response:
        import json

        self.requests += 1
        self.refresh_headers.append(request.headers.get("X-Prometheus-Refresh-Interval-Seconds", ""))
        body = self.body if self.body is not None else json.dumps(self.groups).encode()
        return web.Response(body=body, status=self.status, content_type=self.content_type)


class RoundRobinProxy(ThreadedApp):
    """Forwards every ``GET /metrics`` to the next of ``backends`` (their ``/metrics`` URLs),
    one request each in turn, as an L7 load balancer or a Service without session affinity does."""

    def __init__(self, backends: list[str]) -> None:
        super().__init__()
        self.backends = list(backends)
        self.served: list[str] = []  # the backend of each request, in order
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{self.base_url}/metrics"

    def build(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._forward)
        return app

    async def on_start(self) -> None:
        self._session = aiohttp.ClientSession()

    async def on_stop(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        backends = self.backends
        backend = backends[self.requests % len(backends)]
        self.requests += 1
        self.served.append(backend)
        async with self._session.get(backend) as response:
            body = await response.read()
            return web.Response(body=body, status=response.status,
                                headers={"Content-Type": response.headers.get("Content-Type", "text/plain")})
