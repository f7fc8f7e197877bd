"""PageFetcher's two ways of reading a body: one ``read()`` when the server declares the
length (and no encoding), the size-capped chunk loop otherwise. Both give the same bytes,
and a page over the limit is refused either way (a real loopback server)."""

from __future__ import annotations

import asyncio

import pytest

from app.scrape.client import PageFetcher, ScrapeError

PAGE = b"".join(b'vllm:num_requests_running{model_name="m%d"} %d.0\n' % (i, i) for i in range(3000))


def _chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


async def _fetch(response: bytes, max_bytes: int) -> bytes | ScrapeError:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with PageFetcher(max_bytes=max_bytes) as fetcher:
            try:
                return (await fetcher.fetch(f"http://127.0.0.1:{port}/metrics", 5.0)).body
            except ScrapeError as exc:
                return exc
    finally:
        server.close()


DECLARED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(PAGE, 7000)


@pytest.mark.parametrize("response", [DECLARED, CHUNKED], ids=["content-length", "chunked"])
def test_a_page_reads_the_same_whether_its_length_is_declared_or_not(response: bytes) -> None:
    assert len(PAGE) > 65536  # more than one chunk of the capped loop
    assert asyncio.run(_fetch(response, 4 * 1024 * 1024)) == PAGE


@pytest.mark.parametrize(("response", "message"), [
    (DECLARED, f"page is {len(PAGE)} bytes, limit 100000"),
    (CHUNKED, "page exceeds the 100000-byte limit"),
], ids=["content-length", "chunked"])
def test_a_page_over_the_limit_is_refused_either_way(response: bytes, message: str) -> None:
    error = asyncio.run(_fetch(response, 100_000))
    assert isinstance(error, ScrapeError)
    assert (error.error_class, str(error)) == ("too_large", message)
