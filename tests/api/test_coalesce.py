"""Request coalescing (app/api/coalesce.py): identical concurrent reads share one computation,
never one that started before they arrived; different questions never share an answer."""

from __future__ import annotations

import asyncio

import pytest

from app.api.coalesce import CoalesceReads, request_key


class Gated:
    """An ASGI app whose computations wait for the test to open a gate; each answers its own
    number, so a test sees which computation answered which request."""

    def __init__(self) -> None:
        self.started = 0
        self.gates: list[asyncio.Event] = []
        self.disconnects: list[bool] = []
        self.fail = False

    async def __call__(self, scope, receive, send) -> None:
        self.started += 1
        number = self.started
        gate = asyncio.Event()
        self.gates.append(gate)
        assert (await receive())["type"] == "http.request"
        await gate.wait()
        if self.fail:
            raise RuntimeError("boom")
        body = f"{number} {scope['path']}".encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


class Client:
    """One request through the middleware, with its own connection (receive) and answer."""

    def __init__(self, app, path: str = "/status", method: str = "GET", headers: list | None = None) -> None:
        self.scope = {"type": "http", "method": method, "path": path, "query_string": b"",
                      "headers": headers or [(b"host", b"monitor"), (b"user-agent", b"x")]}
        self.left = asyncio.Event()
        self.messages: list[dict] = []
        self._requested = False
        self.task = asyncio.create_task(app(self.scope, self._receive, self._send))

    async def _receive(self):
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message) -> None:
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_requests_during_a_computation_share_the_next_one_not_the_running_one() -> None:
    async def run() -> None:
        inner = Gated()
        app = CoalesceReads(inner)
        first = Client(app)
        await settle()
        assert inner.started == 1
        # 20 identical requests arrive while the first computation runs: they must not get its
        # answer (it began before they asked), and they must not start 20 more
        later = [Client(app, headers=[(b"host", b"monitor"), (b"user-agent", f"ua{i}".encode())]) for i in range(20)]
        await settle()
        assert inner.started == 1
        inner.gates[0].set()
        await first.task
        await settle()
        assert inner.started == 2  # one computation for all twenty
        assert first.body == b"1 /status"
        assert not any(c.task.done() for c in later)
        inner.gates[1].set()
        await asyncio.gather(*(c.task for c in later))
        assert {c.body for c in later} == {b"2 /status"}
        assert all(c.messages[0]["status"] == 200 for c in later)
        # nothing is kept once nobody waits: the next request computes afresh
        assert app._waiting == {} and app._turns == {}
        again = Client(app)
        await settle()
        inner.gates[2].set()
        await again.task
        assert again.body == b"3 /status" and inner.started == 3

    asyncio.run(run())


def test_different_questions_never_share_an_answer() -> None:
    async def run() -> None:
        inner = Gated()
        app = CoalesceReads(inner)
        clients = [Client(app, "/a"), Client(app, "/b"),
                   Client(app, "/a", headers=[(b"authorization", b"Bearer s3cret")]),
                   Client(app, "/a", method="HEAD"),
                   Client(app, "/a", method="POST")]
        await settle()
        assert inner.started == 5
        for gate in inner.gates:
            gate.set()
        await asyncio.gather(*(c.task for c in clients))
        assert sorted(c.body.split()[0] for c in clients) == [b"1", b"2", b"3", b"4", b"5"]

    asyncio.run(run())


def test_the_computation_sees_a_disconnect_only_when_every_client_has_gone() -> None:
    async def run() -> None:
        seen: list[str] = []

        async def watcher(scope, receive, send) -> None:  # like app.budget: stops when the client leaves
            assert (await receive())["type"] == "http.request"
            seen.append((await receive())["type"])

        app = CoalesceReads(watcher)
        blocker_gate = asyncio.Event()

        async def blocker(scope, receive, send) -> None:
            await blocker_gate.wait()
            await watcher(scope, receive, send)

        app.app = blocker
        first = Client(app)
        await settle()
        a, b = Client(app), Client(app)  # the next computation, shared by a and b
        await settle()
        blocker_gate.set()
        first.left.set()
        await first.task
        await settle()
        a.left.set()
        await settle()
        assert seen == ["http.disconnect"]  # the first computation's only client left; the second's b is still there
        b.left.set()
        await asyncio.gather(a.task, b.task)
        assert seen == ["http.disconnect", "http.disconnect"]

    asyncio.run(run())


def test_a_failing_computation_fails_every_request_that_waited_for_it() -> None:
    async def run() -> None:
        inner = Gated()
        app = CoalesceReads(inner)
        first = Client(app)
        await settle()
        waiting = [Client(app) for _ in range(3)]
        await settle()
        inner.fail = True
        inner.gates[0].set()
        await settle()
        inner.gates[1].set()
        results = await asyncio.gather(first.task, *(c.task for c in waiting), return_exceptions=True)
        assert [str(r) for r in results] == ["boom"] * 4
        assert inner.started == 2

    asyncio.run(run())


@pytest.mark.parametrize(("headers", "method", "coalesced"), [
    ([(b"user-agent", b"a")], "GET", True),
    ([(b"content-length", b"0")], "GET", True),
    ([(b"content-length", b"5")], "GET", False),
    ([(b"transfer-encoding", b"chunked")], "GET", False),
    ([], "DELETE", False),
])
def test_only_reads_without_a_body_are_coalesced(headers, method, coalesced) -> None:
    scope = {"type": "http", "method": method, "path": "/", "query_string": b"", "headers": headers}
    assert (request_key(scope) is not None) is coalesced
    with_agent = request_key({**scope, "headers": [*headers, (b"User-Agent", b"other")]})
    assert with_agent == request_key(scope)  # the user agent never splits a question
