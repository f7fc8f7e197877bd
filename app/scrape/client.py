"""Fetching /metrics pages: explicit timeouts, a size cap, gzip, bounded concurrency.

Why aiohttp and not httpx on this path: the scrape loop is the one place that makes
hundreds of requests per second, and a shared ``httpx.AsyncClient`` costs 5-50 times
aiohttp's CPU per fetch once many connections are open (httpx issue #3215;
``bench/ingest.py`` rows d1-d2). httpx remains the client for probes, webhooks and tests,
where request rates are low.

Why ``Accept: text/plain;version=0.0.4``: prometheus_client 0.26 (used by vLLM)
renames ``vllm:`` families inconsistently when a client negotiates OpenMetrics, so we
ask for the classic text format that every engine serves the same way.

Redirects are not followed: a target URL was validated against the host allow-list,
a redirect could lead anywhere.

Error messages never quote what the target sent (reason phrase, header or body bytes):
they are stored in scrape records that every reader of the API and the status page
sees, and a misconfigured URL may point at something that is not a metrics page. HTTP
errors name the status with its standard phrase; malformed responses name the kind of
defect (aiohttp's own messages quote the offending bytes).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus

import aiohttp

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
USER_AGENT = "llm-latency-monitor/0.1"
#: Pages larger than this are refused (``too_large``) unless configured otherwise: a real
#: vLLM page is ~50 kB per model, so 4 MiB leaves room for ~80 models and stops a runaway page.
DEFAULT_MAX_PAGE_BYTES = 4 * 1024 * 1024


def http_status_message(status: int) -> str:
    """``HTTP 503 Service Unavailable``: the standard phrase, not the one the server sent."""
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


class ScrapeError(Exception):
    """A failed fetch. ``error_class`` is one of a small fixed set, used as a metric label."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


@dataclass(slots=True)
class Fetched:
    body: bytes
    content_type: str


class PageFetcher:
    """Owns one aiohttp session (connection pool) shared by every scrape job."""

    def __init__(self, max_concurrency: int = 64, max_bytes: int = DEFAULT_MAX_PAGE_BYTES,
                 connect_timeout: float = 3.0) -> None:
        self.max_bytes = max_bytes
        self.connect_timeout = connect_timeout
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PageFetcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_concurrency, ttl_dns_cache=60,
                                             enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=True,
                headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": USER_AGENT},
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str, timeout: float, headers: dict[str, str] | None = None) -> Fetched:
        """Fetch one page or raise :class:`ScrapeError` with a classified error.

        The overall deadline is ``asyncio.timeout`` (Python's own, which turns its
        cancellation into ``TimeoutError`` reliably); aiohttp only gets the connect
        timeout. Under heavy load aiohttp's own total timeout can leak a bare
        ``CancelledError`` out of the connect phase, which would look like the scrape job
        itself being cancelled.
        """
        assert self._session is not None, "PageFetcher.start() first"
        connect = min(self.connect_timeout, timeout)
        client_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=None)
        async with self._semaphore:
            try:
                async with asyncio.timeout(timeout):
                    return await self._get(url, client_timeout, headers)
            except ScrapeError:
                raise
            except TimeoutError:
                raise ScrapeError("timeout", f"no complete response within {timeout:g}s") from None
            except aiohttp.ClientConnectorError as exc:
                raise ScrapeError("connect", f"cannot connect: {exc.os_error or exc}") from None
            except aiohttp.ServerTimeoutError:
                raise ScrapeError("timeout", f"no connection within {connect:g}s") from None
            except aiohttp.ClientPayloadError as exc:
                # the cause is aiohttp's ContentLengthError, TransferEncodingError or ContentEncodingError
                defect = type(exc.__cause__).__name__ if exc.__cause__ is not None else "truncated"
                raise ScrapeError("payload", f"broken response body ({defect})") from None
            except aiohttp.ClientResponseError:
                raise ScrapeError("http_protocol", "malformed HTTP response (status line, headers or chunk framing)"
                                  ) from None
            except aiohttp.ClientError as exc:
                raise ScrapeError("http_protocol", f"{type(exc).__name__}: {exc}") from None

    async def _get(self, url: str, client_timeout: aiohttp.ClientTimeout, headers: dict[str, str] | None) -> Fetched:
        assert self._session is not None
        async with self._session.get(url, timeout=client_timeout, allow_redirects=False, headers=headers) as response:
            if response.status != 200:
                raise ScrapeError("http_status", http_status_message(response.status))
            declared = response.content_length
            if declared is not None and not response.headers.get("Content-Encoding"):
                if declared > self.max_bytes:
                    raise ScrapeError("too_large", f"page is {declared} bytes, limit {self.max_bytes}")
                # aiohttp stops at the declared length: one read, no chunk loop or copies
                return Fetched(await response.read(), response.headers.get("Content-Type", ""))
            body = bytearray()
            async for chunk in response.content.iter_chunked(65536):
                body += chunk
                if len(body) > self.max_bytes:
                    raise ScrapeError("too_large", f"page exceeds the {self.max_bytes}-byte limit")
            return Fetched(bytes(body), response.headers.get("Content-Type", ""))
