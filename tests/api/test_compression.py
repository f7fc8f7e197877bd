"""Answers are gzip-compressed for clients that accept it (app/main.py), inside the request
coalescing, so the clients sharing one computation share its one compression."""

from __future__ import annotations

import asyncio
import gzip

from starlette.middleware.gzip import GZipMiddleware

from app.api.coalesce import CoalesceReads
from app.main import GZIP_LEVEL, GZIP_MINIMUM_BYTES
from tests.api.test_coalesce import Client, Gated, settle


def test_large_answers_are_compressed_only_for_clients_that_accept_gzip(quiet_service) -> None:
    client = quiet_service.client
    for i in range(40):  # enough targets that /metrics and the list are well above the minimum size
        assert client.post("/api/v1/targets", json={"name": f"t{i:02d}", "url": f"http://127.0.0.1:9/{i}/metrics"}
                           ).status_code == 201
    for path in ("/metrics", "/api/v1/targets", "/"):
        plain = client.get(path, headers={"Accept-Encoding": "identity"})
        packed = client.get(path, headers={"Accept-Encoding": "gzip"})
        assert plain.status_code == packed.status_code == 200
        assert "content-encoding" not in plain.headers and packed.headers["content-encoding"] == "gzip"
        assert len(plain.content) > GZIP_MINIMUM_BYTES
        # httpx decoded it: the same answer, sent in a fraction of the bytes
        assert int(packed.headers["content-length"]) < len(plain.content) / 3
        if path == "/api/v1/targets":  # /metrics' counters and the status page's clock move in between
            assert packed.content == plain.content
    small = client.get("/healthz", headers={"Accept-Encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers  # below the minimum: as is


def test_coalesced_clients_share_one_compressed_answer() -> None:
    class Large(Gated):
        async def __call__(self, scope, receive, send) -> None:
            self.started += 1
            gate = asyncio.Event()
            self.gates.append(gate)
            await receive()
            await gate.wait()
            body = b"latency_bucket{le=\"0.1\"} 1\n" * 2000
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})

    async def run() -> None:
        inner = Large()
        compressions = 0
        real_compress = GZipMiddleware(inner, minimum_size=GZIP_MINIMUM_BYTES, compresslevel=GZIP_LEVEL)

        async def counting(scope, receive, send):
            nonlocal compressions
            compressions += 1
            await real_compress(scope, receive, send)

        app = CoalesceReads(counting)
        accept = [(b"host", b"monitor"), (b"accept-encoding", b"gzip")]
        first = Client(app, headers=accept)
        await settle()
        waiting = [Client(app, headers=accept) for _ in range(10)]
        await settle()
        inner.gates[0].set()
        await first.task
        await settle()
        inner.gates[1].set()
        await asyncio.gather(*(c.task for c in waiting))
        assert inner.started == compressions == 2  # 11 clients, two computations, two compressions
        bodies = {c.body for c in waiting}
        assert len(bodies) == 1
        (body,) = bodies
        assert gzip.decompress(body) == b"latency_bucket{le=\"0.1\"} 1\n" * 2000 and len(body) < 500

    asyncio.run(run())
