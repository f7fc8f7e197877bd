"""Concurrent identical reads share one computation (request coalescing).

Fifty dashboards and operators reading the status page, the targets list or ``/metrics`` at
once ask the same question many times a second; answering each from scratch made the process
spend its one interpreter thread on copies of the same work (bench/load.py: API p99 30 s at
1,000 targets). Here a GET or HEAD that arrives while an identical one is being computed waits
for the *next* computation of it, and everyone who arrived in the meantime gets that one
answer. An answer is therefore never older than the request: every computation starts after
all of its requests arrived, so a read after a write sees the write, exactly as without this
layer. At most one computation per question runs at a time, and however many clients ask, a
question costs at most one computation at a time plus one queued.

"Identical" is the method, path, query string and every request header but a few that cannot
change an answer (:data:`IGNORED_HEADERS`): a request with a token and one without never share
an answer. A computation is detached from the request that started it: it goes on for the
others when its first client leaves, and it sees a disconnect (:mod:`app.budget` stops the
work) only once every client waiting for it has gone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

READ_METHODS = frozenset({"GET", "HEAD"})
#: headers that differ between clients asking the same question without changing the answer
IGNORED_HEADERS = frozenset({b"user-agent", b"connection", b"keep-alive", b"x-request-id", b"traceparent",
                             b"tracestate", b"cache-control", b"pragma"})

Key = tuple[str, str, bytes, tuple[tuple[bytes, bytes], ...]]


@dataclass(eq=False)
class _Flight:
    """One computation and the requests waiting for it."""

    answer: asyncio.Future[list[Message]]
    clients: int = 0
    everyone_gone: asyncio.Event = field(default_factory=asyncio.Event)

    def leave(self) -> None:
        self.clients -= 1
        if self.clients == 0 and not self.answer.done():
            self.everyone_gone.set()


def request_key(scope: Scope) -> Key | None:
    """What makes two requests the same question; ``None`` for a request that is not a plain
    read (another method, or a body)."""
    if scope["type"] != "http" or scope["method"] not in READ_METHODS:
        return None
    headers = tuple(sorted((k.lower(), v) for k, v in scope["headers"] if k.lower() not in IGNORED_HEADERS))
    if any(k == b"transfer-encoding" or (k == b"content-length" and v.strip() != b"0") for k, v in headers):
        return None
    return scope["method"], scope["path"], scope.get("query_string", b""), headers


class CoalesceReads:
    """ASGI middleware: identical concurrent reads share one computation (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._waiting: dict[Key, _Flight] = {}      # a computation not started yet: joinable
        self._turns: dict[Key, asyncio.Lock] = {}   # one computation per question at a time
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = request_key(scope)
        if key is None:
            await self.app(scope, receive, send)
            return
        flight = self._waiting.get(key)
        if flight is None:
            flight = self._waiting[key] = _Flight(asyncio.get_running_loop().create_future())
            task = asyncio.create_task(self._compute(key, flight, dict(scope)))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        flight.clients += 1
        watcher = asyncio.create_task(self._watch(receive, flight))
        try:
            messages = await asyncio.shield(flight.answer)
        finally:
            watcher.cancel()
        for message in messages:
            await send(message)

    @staticmethod
    async def _watch(receive: Receive, flight: _Flight) -> None:
        """Counts this client out of the flight when it disconnects."""
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        finally:
            flight.leave()

    async def _compute(self, key: Key, flight: _Flight, scope: Scope) -> None:
        turn = self._turns.setdefault(key, asyncio.Lock())
        messages: list[Message] = []
        requested = False

        async def receive() -> Message:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await flight.everyone_gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            messages.append(message)

        try:
            async with turn:
                if self._waiting.get(key) is flight:
                    del self._waiting[key]  # from here on, new arrivals wait for the next computation
                await self.app(scope, receive, send)
        except asyncio.CancelledError:
            flight.answer.cancel()  # the service is stopping: so are its waiting requests
            raise
        except Exception as exc:
            flight.answer.set_exception(exc)
            flight.answer.exception()  # retrieved: every waiter raises it, none is left unobserved
        else:
            flight.answer.set_result(messages)
        finally:
            if not turn.locked() and key not in self._waiting:
                self._turns.pop(key, None)
