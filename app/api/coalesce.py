"""Concurrent identical reads share one computation (request coalescing).

Fifty dashboards and operators reading the status page, the targets list or ``/metrics`` at
once ask the same question many times a second; answering each from scratch would spend the
process' one interpreter thread on copies of the same work. Here a GET or HEAD that arrives
while an identical one is being computed waits for the *next* computation of it, and everyone
who arrived in the meantime gets that one answer. An answer is therefore never older than the
request: every computation starts after all of its requests arrived, so a read after a write
sees the write, exactly as without this layer. At most one computation per question runs at a
time, and however many clients ask, a question costs at most one computation at a time plus
one queued.

"Identical" is the method, path, query string and every request header but a few that cannot
change an answer (:data:`IGNORED_HEADERS`): a request with a token and one without never share
an answer. A computation is detached from the request that started it: it goes on for the
others when its first client leaves, and it sees a disconnect (:mod:`app.runtime.budget` stops the
work) only once every client waiting for it has gone.

A finished answer is also reused, for ``max_age`` seconds (the service's ``read_max_age``,
1 s by default), by a later identical read when nothing changed since its computation began:
no commit of this process and no round's result kept (:mod:`app.runtime.changes`), and no write request
through this layer. So a read after a write still sees the write, and what a reused answer can
miss is bounded by ``max_age``: the clock moving on (its window ends when it began, and says
so) and other replicas' writes. Only ``200`` answers are reused; they carry an ``Age`` header,
and a request with ``Cache-Control: no-cache`` asks for a new computation. By the same rule a
read may join a computation already under way, instead of queueing for the next one: when that
computation began at most ``max_age`` ago and nothing changed since, its answer is one the read
could have reused had it already finished (it gets it with ``Age``; if it fails or is not a
``200``, the read waits for a computation of its own). And a kept answer asked for near its expiry starts the
next computation while it is still served (:meth:`CoalesceReads._refresh_ahead`). Under fifty
clients a question is then computed about once per change or per ``max_age``, and while nothing
changes nobody waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.runtime.changes import Changes, changes

READ_METHODS = frozenset({"GET", "HEAD"})
#: headers that differ between clients asking the same question without changing the answer
IGNORED_HEADERS = frozenset({b"user-agent", b"connection", b"keep-alive", b"x-request-id", b"traceparent",
                             b"tracestate", b"cache-control", b"pragma"})

Key = tuple[str, str, bytes, tuple[tuple[bytes, bytes], ...]]
#: Finished answers kept for reuse at most, and their bytes at most (the oldest goes first;
#: a larger answer is not kept); each lives ``max_age``. /metrics at 1,000 targets is ~5 MB.
KEPT_ANSWERS, KEPT_BYTES = 256, 64 * 2**20


@dataclass(frozen=True, slots=True)
class _Answer:
    """A finished computation: when it began (monotonic), what had changed by then, its
    messages, and how long it took (seconds)."""

    began: float
    change: int
    messages: list[Message]
    took: float = 0.0

    @property
    def size(self) -> int:
        return sum(len(m.get("body", b"")) for m in self.messages)


@dataclass(eq=False)
class _Flight:
    """One computation and the requests waiting for it."""

    answer: asyncio.Future[list[Message]]
    clients: int = 0
    everyone_gone: asyncio.Event = field(default_factory=asyncio.Event)
    began: float = 0.0  # once running: when (monotonic), and what had changed by then
    change: int = -1

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

    def __init__(self, app: ASGIApp, max_age: float = 0.0, changed: Changes = changes,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.max_age = max_age
        self.changed = changed
        self.clock = clock
        self._answers: OrderedDict[Key, _Answer] = OrderedDict()  # finished, reusable for max_age
        self._kept_bytes = 0
        self._waiting: dict[Key, _Flight] = {}      # a computation not started yet: joinable
        self._computing: dict[Key, _Flight] = {}    # under way: joinable while its answer would be reusable
        self._turns: dict[Key, asyncio.Lock] = {}   # one computation per question at a time
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = request_key(scope)
        if key is None:
            try:
                await self.app(scope, receive, send)
            finally:
                if scope["type"] == "http":
                    self.changed.bump()  # a write: no answer computed before it is reused after it
            return
        kept = self._reusable(key, scope)
        if kept is not None:
            self._refresh_ahead(key, kept, scope)
            for message in self._aged(kept.messages, kept.began):
                await send(message)
            return
        running = self._joinable(key, scope)
        if running is not None:
            try:
                messages = await self._answer_of(running, receive)
            except Exception:  # that computation failed: this read waits for one of its own
                messages = []
            if messages and messages[0].get("status") == 200:
                for message in self._aged(messages, running.began):
                    await send(message)
                return
        for message in await self._answer_of(self._waiting.get(key) or self._start(key, scope), receive):
            await send(message)

    def _start(self, key: Key, scope: Scope) -> _Flight:
        """A new computation of ``key``, joinable until it starts (it waits for the one before)."""
        flight = self._waiting[key] = _Flight(asyncio.get_running_loop().create_future())
        task = asyncio.create_task(self._compute(key, flight, dict(scope)))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return flight

    def _refresh_ahead(self, key: Key, kept: _Answer, scope: Scope) -> None:
        """Start the next computation of a kept answer that is being asked for, so that it is
        ready as the kept one expires: once the kept answer is older than ``max_age`` less what
        it took to compute, and none is under way or queued. No client waits for it; the ones
        that come meanwhile get the kept answer (never older than ``max_age``) or join it. An
        expensive question asked continuously (the status page, ``/metrics``) is thus never
        waited for while nothing changes, at the cost of computing it once per ``max_age``."""
        if self.clock() - kept.began >= self.max_age - kept.took and key not in self._waiting \
                and key not in self._computing:
            self._start(key, scope)

    async def _answer_of(self, flight: _Flight, receive: Receive) -> list[Message]:
        """Wait, as one more of its clients, for ``flight``'s answer (counted out on a disconnect)."""
        flight.clients += 1
        watcher = asyncio.create_task(self._watch(receive, flight))
        try:
            return await asyncio.shield(flight.answer)
        finally:
            watcher.cancel()

    def _joinable(self, key: Key, scope: Scope) -> _Flight | None:
        """The computation of ``key`` under way, if its answer would be reusable by this request
        had it finished: it began at most ``max_age`` ago and nothing changed since."""
        flight = self._computing.get(key)
        return flight if flight is not None and self._may_answer(flight.began, flight.change, scope) else None

    def _may_answer(self, began: float, change: int, scope: Scope) -> bool:
        """Whether an answer whose computation began at ``began`` with the change count ``change``
        may answer this request: at most ``max_age`` old, nothing changed since, no ``no-cache``."""
        return self.max_age > 0 and self.clock() - began <= self.max_age and change == self.changed.current \
            and not _no_cache(scope)

    def _reusable(self, key: Key, scope: Scope) -> _Answer | None:
        """The kept answer to ``key``, if it may answer this request (module docstring);
        expired answers go."""
        now = self.clock()
        while self._answers and now - next(iter(self._answers.values())).began > self.max_age:
            self._drop_oldest()
        kept = self._answers.get(key)
        return kept if kept is not None and self._may_answer(kept.began, kept.change, scope) else None

    def _aged(self, messages: list[Message], began: float) -> list[Message]:
        """An answer computed from ``began`` on, with its ``Age`` header."""
        start, *rest = messages
        age = (b"age", b"%d" % int(self.clock() - began))
        return [{**start, "headers": [*start.get("headers", []), age]}, *rest]

    def _keep(self, key: Key, answer: _Answer) -> None:
        if self.max_age <= 0 or not answer.messages or answer.messages[0].get("status") != 200 \
                or answer.size > KEPT_BYTES:
            return
        old = self._answers.pop(key, None)
        if old is not None:
            self._kept_bytes -= old.size
        self._answers[key] = answer  # the newest last: expiry and eviction take the oldest
        self._kept_bytes += answer.size
        while len(self._answers) > KEPT_ANSWERS or self._kept_bytes > KEPT_BYTES:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, answer = self._answers.popitem(last=False)
        self._kept_bytes -= answer.size

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
                flight.began, flight.change = began, change = self.clock(), self.changed.current
                self._computing[key] = flight
                await self.app(scope, receive, send)
        except asyncio.CancelledError:
            flight.answer.cancel()  # the service is stopping: so are its waiting requests
            raise
        except Exception as exc:
            flight.answer.set_exception(exc)
            flight.answer.exception()  # retrieved: every waiter raises it, none is left unobserved
        else:
            flight.answer.set_result(messages)
            self._keep(key, _Answer(began, change, messages, self.clock() - began))
        finally:
            if self._computing.get(key) is flight:
                del self._computing[key]
            if not turn.locked() and key not in self._waiting:
                self._turns.pop(key, None)


def _no_cache(scope: Scope) -> bool:
    """``Cache-Control: no-cache`` (or ``no-store``, ``max-age=0``): the client wants an answer
    computed after it asked."""
    for name, value in scope["headers"]:
        if name.lower() == b"cache-control":
            directives = {d.strip().lower() for d in value.split(b",")}
            if directives & {b"no-cache", b"no-store", b"max-age=0"}:
                return True
    return False
