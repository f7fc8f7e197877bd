"""PageFetcher's two ways of reading a body: one ``read()`` when the server declares the
length (and no encoding), the size-capped chunk loop otherwise. Both give the same bytes,
and a page over the limit is refused either way (a real loopback server)."""

from __future__ import annotations

import asyncio

import pytest

from app.scrape.client import ScrapeError
from tests.support.raw_http import fetch_raw

PAGE = b"".join(b'vllm:num_requests_running{model_name="m%d"} %d.0\n' % (i, i) for i in range(3000))


def _chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


DECLARED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(PAGE, 7000)


@pytest.mark.parametrize("response", [DECLARED, CHUNKED], ids=["content-length", "chunked"])
def test_a_page_reads_the_same_whether_its_length_is_declared_or_not(response: bytes) -> None:
    assert len(PAGE) > 65536  # more than one chunk of the capped loop
    assert asyncio.run(fetch_raw(response, 4 * 1024 * 1024)) == PAGE


@pytest.mark.parametrize(("response", "message"), [
    (DECLARED, f"page is {len(PAGE)} bytes, limit 100000"),
    (CHUNKED, "page exceeds the 100000-byte limit"),
], ids=["content-length", "chunked"])
def test_a_page_over_the_limit_is_refused_either_way(response: bytes, message: str) -> None:
    error = asyncio.run(fetch_raw(response, 100_000))
    assert isinstance(error, ScrapeError)
    assert (error.error_class, str(error)) == ("too_large", message)
