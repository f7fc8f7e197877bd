"""One scrape of a loopback server that answers with exactly the bytes a test gives (any
status line, headers and framing, well-formed or not), through the real PageFetcher."""

from __future__ import annotations

import asyncio

from app.scrape.client import DEFAULT_MAX_PAGE_BYTES, PageFetcher, ScrapeError


async def fetch_raw(response: bytes, max_bytes: int = DEFAULT_MAX_PAGE_BYTES) -> bytes | ScrapeError:
    """The body the fetcher returns, or the ScrapeError it raises."""

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
