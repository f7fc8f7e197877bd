"""Misbehaving OpenAI-compatible servers and a delaying proxy, for the probe tests.

:class:`FakeOpenAI` serves ``POST /<mode>/v1/completions`` (and chat) in one background
thread with its own event loop; the path prefix picks the behaviour, so a probe pointed at
``server.url("stall")`` meets a server that stalls. It counts requests and the largest
number handled at the same time (the probe's concurrency bound, measured from outside).

:class:`DelayProxy` forwards to an upstream server after holding every request for
``delay`` seconds: time lost outside the engine, as a slow gateway or API server adds it.
"""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
from aiohttp import web

MODES = ("ok", "http500", "stall", "malformed", "incomplete", "reset", "error_event", "slow_first", "strict")


def chunk(text: str, reason: str | None = None) -> bytes:
    data = {"id": "cmpl-x", "object": "text_completion", "model": "fake",
            "choices": [{"index": 0, "text": text, "finish_reason": reason}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


class _Threaded:
    """An aiohttp app on 127.0.0.1:0 in a thread of its own; ``with`` starts and stops it."""

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.closing: asyncio.Event | None = None

    def app(self) -> web.Application:  # pragma: no cover - overridden
        raise NotImplementedError

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.closing = asyncio.Event()
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._ready.set()
        await self._stop.wait()
        self.closing.set()
        await asyncio.sleep(0.05)
        await self.on_stop()
        await runner.cleanup()

    async def on_stop(self) -> None:
        pass

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "test server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        assert not self._thread.is_alive()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class FakeOpenAI(_Threaded):
    """``gap``: seconds between tokens in the well-behaved parts; ``first_delay``: before the
    first token in ``slow_first`` mode. ``authorization`` records the ``Authorization`` header
    of every API request (``("models" | "completions", value or None)``); with ``api_key`` set,
    a request without ``Bearer <api_key>`` is answered 401, as OpenAI-compatible servers do.
    ``error_message`` is the message of the ``http500`` mode's error body."""

    def __init__(self, gap: float = 0.005, first_delay: float = 5.0, api_key: str | None = None) -> None:
        super().__init__()
        self.gap = gap
        self.first_delay = first_delay
        self.api_key = api_key
        self.authorization: list[tuple[str, str | None]] = []
        self.requests: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.finished = 0
        self.bodies: list[dict] = []
        self.error_message = "engine crashed"

    def url(self, mode: str) -> str:
        return f"{self.base}/{mode}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{mode}/v1/models", self.models)
        app.router.add_post("/{mode}/v1/completions", self.completions)
        app.router.add_post("/{mode}/v1/chat/completions", self.completions)
        return app

    def _refused(self, kind: str, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization")
        self.authorization.append((kind, header))
        if self.api_key is not None and header != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "Incorrect API key provided", "code": 401}}, status=401)
        return None

    async def models(self, request: web.Request) -> web.Response:
        refused = self._refused("models", request)
        if refused is not None:
            return refused
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _sleep_or_close(self, seconds: float) -> bool:
        """Sleep; False when the server is closing."""
        assert self.closing is not None
        try:
            await asyncio.wait_for(self.closing.wait(), seconds)
            return False
        except TimeoutError:
            return True

    async def completions(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        refused = self._refused("completions", request)
        if refused is not None:
            return refused
        body = await request.json()
        self.bodies.append(body)
        self.requests[mode] = self.requests.get(mode, 0) + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._serve(mode, request, body)
        finally:
            self.in_flight -= 1
            self.finished += 1

    async def _serve(self, mode: str, request: web.Request, body: dict) -> web.StreamResponse:
        n = int(body.get("max_tokens") or 16)
        if mode == "http500":
            return web.json_response({"error": {"message": self.error_message, "code": 500}}, status=500)
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 0
        if mode == "strict":  # like OpenAI's own API: no vLLM extensions, text prompts only
            if "ignore_eos" in body:
                return web.json_response({"error": {"message": "Unrecognized request argument supplied: ignore_eos"}},
                                         status=400)
            if not isinstance(prompt, str):
                return web.json_response({"error": {"message": "'prompt' must be a string"}}, status=400)
            prompt_tokens = len(prompt.split()) + 5  # one token per word + a 5-token preamble
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "slow_first" and not await self._sleep_or_close(self.first_delay):
            return resp
        if mode == "malformed":
            await resp.write(b"data: {not json\n\n")
            await resp.write(b"this line is not SSE\n\n")
            await resp.write(b"data: [1, 2, 3]\n\n")
        for i in range(n):
            if mode in ("stall", "incomplete", "reset") and i == 3:
                if mode == "stall":
                    await self._sleep_or_close(3600)
                elif mode == "reset":
                    assert request.transport is not None
                    request.transport.close()
                else:
                    await resp.write_eof()
                return resp
            if mode == "error_event" and i == 2:
                await resp.write(b'data: {"error": {"message": "out of memory", "code": 500}}\n\n')
                break
            if i and not await self._sleep_or_close(self.gap):
                return resp
            try:
                await resp.write(chunk(" tok", "length" if i == n - 1 else None))
            except ConnectionError:
                return resp
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class DelayProxy(_Threaded):
    """Forwards ``/v1/*`` to ``upstream`` after ``delay`` seconds, streaming the answer back."""

    def __init__(self, upstream: str, delay: float) -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.delay = delay
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.forward)
        return app

    async def on_stop(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        data = await request.read()
        if request.method == "POST":
            await asyncio.sleep(self.delay)
        async with self._session.request(request.method, self.upstream + "/" + request.match_info["path"],
                                         data=data, headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type",
                                                                                                "text/plain")})
            await resp.prepare(request)
            async for piece in up.content.iter_any():
                await resp.write(piece)
            await resp.write_eof()
            return resp
