"""Request coalescing (app/api/coalesce.py): identical concurrent reads share one computation,
never one that started before they arrived; different questions never share an answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.api.coalesce import KEPT_ANSWERS, KEPT_BYTES, CoalesceReads, request_key
from app.runtime.changes import Changes
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.api.conftest import Service, make_quiet_service
from tests.store.test_storage import record


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

        async def watcher(scope, receive, send) -> None:  # like app.runtime.budget: stops when the client leaves
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reusing(inner, max_age: float = 1.0):
    """The middleware with answers reused for ``max_age`` s, its own change counter and clock."""
    changed, clock = Changes(), Clock()
    return CoalesceReads(inner, max_age=max_age, changed=changed, clock=clock), changed, clock


async def answered(app, inner, path: str = "/status", method: str = "GET", headers: list | None = None) -> Client:
    """One request, its computation (if it starts one) let through at once."""
    client = Client(app, path, method, headers)
    await settle()
    for gate in inner.gates:
        gate.set()
    await client.task
    return client


def age(client: Client) -> bytes | None:
    return dict(client.messages[0]["headers"]).get(b"age")


def test_an_unchanged_answer_is_reused_within_max_age_and_says_its_age() -> None:
    async def run() -> None:
        inner = Gated()
        app, _, clock = reusing(inner, max_age=1.0)
        first = await answered(app, inner)
        clock.now += 0.9
        second = await answered(app, inner)
        assert inner.started == 1 and second.body == first.body == b"1 /status"
        assert age(first) is None and age(second) == b"0"
        clock.now += 0.2  # 1.1 s after the computation began: too old
        third = await answered(app, inner)
        assert inner.started == 2 and third.body == b"2 /status" and age(third) is None

    asyncio.run(run())


def test_a_change_a_write_or_no_cache_means_a_new_computation() -> None:
    async def run() -> None:
        inner = Gated()
        app, changed, clock = reusing(inner)
        await answered(app, inner)
        changed.bump()  # a commit of this process, or a round's result kept
        assert (await answered(app, inner)).body == b"2 /status"
        assert (await answered(app, inner)).body == b"2 /status"  # reused: nothing changed since
        await answered(app, inner, "/api/v1/silences", method="POST")  # a write through the API (computation 3)
        assert (await answered(app, inner)).body == b"4 /status"
        no_cache = await answered(app, inner, headers=[(b"host", b"monitor"), (b"cache-control", b"no-cache")])
        assert no_cache.body == b"5 /status"
        assert (await answered(app, inner)).body == b"5 /status"  # the same question: the newer answer is reused
        assert inner.started == 5

    asyncio.run(run())


def test_a_change_during_a_computation_keeps_its_answer_from_being_reused() -> None:
    async def run() -> None:
        inner = Gated()
        app, changed, _ = reusing(inner)
        first = Client(app)
        await settle()
        changed.bump()  # committed while the first computation was reading: it may not have seen it
        inner.gates[0].set()
        await first.task
        assert (await answered(app, inner)).body == b"2 /status"

    asyncio.run(run())


def test_a_read_joins_a_computation_under_way_when_its_answer_would_be_reusable() -> None:
    """Arriving while the question is computed, a read takes that computation's answer (with
    ``Age``) if it began at most max_age ago and nothing changed since; otherwise it waits for
    the next computation, as without reuse."""
    async def run() -> None:
        inner = Gated()
        app, changed, clock = reusing(inner, max_age=1.0)
        first = Client(app)
        await settle()
        clock.now += 0.6
        joined = [Client(app, headers=[(b"host", b"monitor"), (b"user-agent", f"ua{i}".encode())]) for i in range(5)]
        fresh = Client(app, headers=[(b"host", b"monitor"), (b"cache-control", b"no-cache")])
        await settle()
        clock.now += 0.5  # 1.1 s after the computation began: a later arrival may not join it
        late = Client(app)
        await settle()
        changed.bump()
        after_change = Client(app, headers=[(b"host", b"monitor"), (b"user-agent", b"other")])
        await settle()
        assert inner.started == 1
        inner.gates[0].set()
        await asyncio.wait_for(asyncio.gather(first.task, *(c.task for c in joined)), 5)  # no second computation
        assert {c.body for c in [first, *joined]} == {b"1 /status"}
        assert age(first) is None and {age(c) for c in joined} == {b"1"}  # 1.1 s since it began
        await settle()
        assert inner.started == 2  # the late, the changed-since and the no-cache reads share the next one
        inner.gates[1].set()
        await asyncio.gather(late.task, after_change.task, fresh.task)
        assert {late.body, after_change.body, fresh.body} == {b"2 /status"}
        assert app._computing == {} and app._waiting == {}

    asyncio.run(run())


def test_a_kept_answer_asked_for_near_its_expiry_is_computed_again_ahead_while_it_is_served() -> None:
    """Once a kept answer is older than max_age less what it took to compute, a read still gets
    it at once and starts the next computation, so the question is never waited for while
    nothing changes; no answer older than max_age is ever served."""
    async def run() -> None:
        inner = Gated()
        app, changed, clock = reusing(inner, max_age=1.0)
        first = Client(app)
        await settle()
        clock.now += 0.3  # the computation takes 0.3 s
        inner.gates[0].set()
        await first.task
        clock.now += 0.35  # 0.65 s old: not yet within 0.3 s of its expiry
        assert (await answered(app, inner)).body == b"1 /status" and inner.started == 1
        clock.now += 0.1  # 0.75 s old: served, and the next computation starts
        ahead = Client(app)
        await asyncio.wait_for(ahead.task, 5)  # answered without waiting for it
        assert ahead.body == b"1 /status" and age(ahead) == b"0"
        await settle()
        assert inner.started == 2
        also = Client(app)  # while it runs: the kept answer again, and no third computation
        await asyncio.wait_for(also.task, 5)
        assert also.body == b"1 /status" and inner.started == 2
        clock.now += 0.2
        inner.gates[1].set()
        await settle()
        assert (await answered(app, inner)).body == b"2 /status" and inner.started == 2
        clock.now += 0.5  # the first answer would have expired by now; the second is 0.7 s old
        changed.bump()  # and after a change nothing is served from before it
        assert (await answered(app, inner)).body == b"3 /status"

    asyncio.run(run())


def test_a_read_that_joined_a_failed_or_non_200_computation_gets_one_of_its_own() -> None:
    async def run() -> None:
        statuses = iter([503, 200])
        gate = asyncio.Event()

        async def slow(scope, receive, send) -> None:
            await receive()
            status = next(statuses)
            if status == 503:
                await gate.wait()
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"%d" % status})

        app, _, _ = reusing(slow)
        first = Client(app)
        await settle()
        joiner = Client(app, headers=[(b"host", b"monitor"), (b"user-agent", b"joiner")])
        await settle()
        gate.set()
        await asyncio.gather(first.task, joiner.task)
        assert (first.body, joiner.body) == (b"503", b"200")

        inner = Gated()
        app, _, _ = reusing(inner)
        first = Client(app)
        await settle()
        joiner = Client(app, headers=[(b"host", b"monitor"), (b"user-agent", b"joiner")])
        await settle()
        inner.fail = True
        inner.gates[0].set()
        with pytest.raises(RuntimeError):
            await first.task
        await settle()
        inner.fail = False
        inner.gates[1].set()
        await joiner.task
        assert joiner.body == b"2 /status" and inner.started == 2

    asyncio.run(run())


def test_only_200_answers_are_reused_and_only_max_age_zero_disables_reuse() -> None:
    async def run() -> None:
        statuses = iter([503, 200, 200])

        async def flaky(scope, receive, send) -> None:
            await receive()
            status = next(statuses)
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"%d" % status})

        app, _, _ = reusing(flaky)
        bodies = []
        for _ in range(3):
            client = Client(app)
            await client.task
            bodies.append(client.body)
        assert bodies == [b"503", b"200", b"200"]  # the 503 was computed again, the 200 reused
        assert next(statuses) == 200  # the third 200 was never computed

        inner = Gated()
        never, _, _ = reusing(inner, max_age=0.0)
        assert [(await answered(never, inner)).body for _ in range(2)] == [b"1 /status", b"2 /status"]

    asyncio.run(run())


def test_kept_answers_are_bounded_and_expire() -> None:
    async def run() -> None:
        inner = Gated()
        app, _, clock = reusing(inner)
        for i in range(KEPT_ANSWERS + 20):
            await answered(app, inner, f"/t/{i}")
        assert len(app._answers) == KEPT_ANSWERS
        assert (await answered(app, inner, "/t/0")).body == f"{KEPT_ANSWERS + 21} /t/0".encode()  # evicted: computed
        clock.now += 5.0
        await answered(app, inner, "/t/x")
        assert list(app._answers) == [("GET", "/t/x", b"", ((b"host", b"monitor"),))]  # the expired ones are gone

    asyncio.run(run())


def test_kept_answers_are_bounded_in_bytes() -> None:
    async def run() -> None:
        size = KEPT_BYTES // 4 + 1  # four of them do not fit

        async def large(scope, receive, send) -> None:
            await receive()
            body = b"x" * (KEPT_BYTES + 1 if scope["path"] == "/huge" else size)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})

        app, _, _ = reusing(large)
        for i in range(4):
            await Client(app, f"/{i}").task
        assert [k[1] for k in app._answers] == ["/1", "/2", "/3"] and app._kept_bytes == 3 * size
        await Client(app, "/huge").task  # larger than the bound: answered, not kept
        assert [k[1] for k in app._answers] == ["/1", "/2", "/3"]

    asyncio.run(run())


REUSE_SECONDS = 60.0


@pytest.fixture
def reusing_service(migrated_url: str, tmp_path: Path) -> Iterator[Service]:
    """A quiet service that reuses answers (the suite runs with 0; the default is 1 s). Long
    enough that a busy machine's slow request cannot outlive it: this test is about changes."""
    yield from make_quiet_service(migrated_url, tmp_path, read_max_age=REUSE_SECONDS)


def test_the_service_reuses_a_read_until_it_commits_anything(reusing_service) -> None:
    """End to end on both databases: a repeated read is the kept answer while nothing is
    committed but scrapes; a commit by any of the process' sessions (here a target added behind
    the API's back, as discovery would) and a write request each make the next read a new
    computation."""
    client, monitor = reusing_service.client, reusing_service.monitor
    assert client.post("/api/v1/targets", json={"name": "a", "url": "http://127.0.0.1:9/metrics"}).status_code == 201
    first = client.get("/api/v1/targets")
    again = client.get("/api/v1/targets")
    assert "age" not in first.headers and 0 <= int(again.headers["age"]) < REUSE_SECONDS
    assert again.json() == first.json() and [t["name"] for t in first.json()] == ["a"]
    with monitor.sessions() as session:
        target_id = target_repository.get_target(session, "a").id
    stored = record(target_id, time.time(), (1.0, 2.0, 2.0, 3.0, 3.0), 1.5, 10.0)
    assert SampleWriter(monitor.engine).write([stored]) == 1
    scraped = client.get("/api/v1/targets")  # a stored scrape reaches a kept answer only by its age
    assert 0 <= int(scraped.headers["age"]) < REUSE_SECONDS and scraped.json() == first.json()
    with monitor.sessions() as session:
        target_repository.create_target(session, name="b", url="http://127.0.0.1:9/b/metrics")
        session.commit()
    after_commit = client.get("/api/v1/targets")
    assert "age" not in after_commit.headers and [t["name"] for t in after_commit.json()] == ["a", "b"]
    assert client.delete("/api/v1/targets/b").status_code == 204
    after_write = client.get("/api/v1/targets")
    assert "age" not in after_write.headers and [t["name"] for t in after_write.json()] == ["a"]
