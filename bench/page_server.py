"""A minimal, cheap HTTP/1.1 server for the ingest benchmark (run as a separate process).

Serves a set of pre-rendered /metrics page variants on ``/t/<i>/metrics`` for any
``i``: the n-th request for target ``i`` gets variant ``n % len(variants)``, so every
scrape of a target sees a slightly different page (counters and histograms grow),
the way an engine under load changes between scrapes. ``/stats`` answers the number
of page requests served so far (``{"requests": N}``), to count scrapes exactly.

It is a plain ``asyncio.Protocol`` rather than an aiohttp/http.server app so that the
server's own CPU stays small next to the scrapers being measured (it runs on the
same 2 cores). Keep-alive, no pipelining needed (aiohttp, httpx and Prometheus'
Go client all send one request at a time per connection). With ``--gzip`` a client
sending ``Accept-Encoding: gzip`` gets the pre-compressed variant (vLLM's
prometheus_fastapi_instrumentator endpoint does not compress, so the default is off).

    python bench/page_server.py --gzip PAGE0.prom PAGE1.prom ...

prints ``PORT <n>`` on stdout once listening; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import signal
import sys
from collections import defaultdict

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class PageSet:
    def __init__(self, variants: list[bytes], use_gzip: bool) -> None:
        self.plain = [self._response(v, None) for v in variants]
        self.gzipped = [self._response(gzip.compress(v, 6), b"gzip") for v in variants] if use_gzip else None
        self.per_target: dict[bytes, int] = defaultdict(int)
        self.requests = 0

    @staticmethod
    def _response(body: bytes, encoding: bytes | None) -> bytes:
        head = [b"HTTP/1.1 200 OK", b"Content-Type: " + CONTENT_TYPE, b"Content-Length: " + str(len(body)).encode()]
        if encoding:
            head.append(b"Content-Encoding: " + encoding)
        return b"\r\n".join(head) + b"\r\n\r\n" + body

    def respond(self, path: bytes, wants_gzip: bool) -> bytes:
        if path.startswith(b"/t/") and path.endswith(b"/metrics"):
            key = path[3:-8]
            n = self.per_target[key]
            self.per_target[key] = n + 1
            self.requests += 1
            table = self.gzipped if (wants_gzip and self.gzipped is not None) else self.plain
            return table[n % len(table)]
        if path == b"/stats":
            body = json.dumps({"requests": self.requests, "targets": len(self.per_target)}).encode()
            return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body)
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot found\n"


class Http(asyncio.Protocol):
    def __init__(self, pages: PageSet) -> None:
        self.pages = pages
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > 65536:
                    assert self.transport is not None
                    self.transport.close()
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4:]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) < 2:
                assert self.transport is not None
                self.transport.close()
                return
            path = parts[1].split(b"?", 1)[0]
            wants_gzip = False
            close = parts[-1] == b"HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                lname = name.strip().lower()
                if lname == b"accept-encoding" and b"gzip" in value:
                    wants_gzip = True
                elif lname == b"connection" and value.strip().lower() == b"close":
                    close = True
            assert self.transport is not None
            self.transport.write(self.pages.respond(path, wants_gzip))
            if close:
                self.transport.close()
                return


async def serve(pages: PageSet, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Http(pages), host, port, backlog=1024, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="+", help="page variant files, served in rotation per target")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--gzip", action="store_true", help="compress for clients that accept gzip")
    args = ap.parse_args(argv)
    variants = []
    for path in args.pages:
        with open(path, "rb") as f:
            variants.append(f.read())
    asyncio.run(serve(PageSet(variants, args.gzip), args.host, args.port))


if __name__ == "__main__":
    sys.exit(main())
