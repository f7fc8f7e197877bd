"""A client for the Prometheus HTTP API (Prometheus, Thanos Query, Mimir, VictoriaMetrics).

Synchronous over one ``httpx.Client`` and safe to share between threads: a Prometheus
source issues one query per signal and runs them side by side with :meth:`PrometheusClient.map`,
which keeps at most ``max_concurrency`` requests in flight so a diagnosis round can never
flood the server. A request's read (a call made under an :mod:`app.runtime.budget` budget: an API
route) takes a read slot first, at most ``max_concurrency // 2`` (at least 1) of them, so
however many readers there are the rounds keep the other slots; it waits for a slot and for its
answer only as long as its budget lasts, then stops with :class:`~app.runtime.budget.BudgetExceeded`.

Queries are sent as POST forms, as Grafana does (long PromQL does not fit in a URL); a
server or proxy that answers 405 gets GET from then on. ``time``/``start``/``end`` are sent
exact to the millisecond (Prometheus evaluates in milliseconds, so a float formatted with
more digits could move the evaluation time). The query timeout is also sent to the server
(``timeout=20s``), so a slow query is abandoned there too instead of running on unobserved.

Every failure is a :class:`PromAPIError` whose ``kind`` comes from a small fixed set and
whose message is safe to show on an unauthenticated page: it names the kind of fault and
never quotes what the server sent (body, reason phrase, header values, its ``error`` text,
certificate names) nor a secret we sent. A ``bad_query`` may carry Prometheus'
``errorType`` (a fixed vocabulary) and the parse position (digits only). The kinds:

* ``unreachable``: no connection (refused, DNS, TLS verification, no connection in time);
* ``timeout``: connected but no complete answer in time, or the server gave up (``timeout``);
* ``http_error``: any other non-2xx status (its standard phrase), a broken connection;
* ``bad_query``: 400/422 from the API, the query or selector was rejected;
* ``not_prometheus``: a 2xx that is not the API's JSON envelope (an HTML page, other JSON);
* ``auth``: 401/403;
* ``too_large``: the answer exceeds ``max_response_bytes`` (read streaming, decompressed), or
  holds more than ``max_series`` series or ``max_samples`` points.

Memory stays proportional to what an answer keeps: an answer past :data:`STREAM_FROM_BYTES` is
decoded one series at a time (ijson, yajl's C parser) instead of as one document, and decoding
stops at the first series past a limit.

Warnings of a partial answer are not an error: they come back in
:attr:`QueryResult.warnings`, verbatim. They are the server's text; show them to
authenticated readers only.
"""

from __future__ import annotations

import contextvars
import io
import math
import re
import socket
import ssl
import threading
import time as _time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import httpx
import ijson  # type: ignore[import-untyped]
import orjson

from app.core.durations import parse_duration
from app.runtime import budget as request_budget
from app.runtime.budget import BudgetExceeded, RequestBudget
from app.scrape.client import USER_AGENT, http_status_message

#: A read does not send a query with less of its budget left than this: the server could not
#: answer in time, and would work on it for nothing.
MIN_READ_SECONDS = 0.1
#: Answers larger than this are refused (``too_large``): a round's largest answer is one
#: query over every replica's buckets (~1,000 targets x ~30 buckets), a few MiB.
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024

#: Series and points one answer may hold: a round's largest answer is one histogram query over
#: every replica's buckets (10,000 pods x 20 buckets), and a range query's points in all.
DEFAULT_MAX_SERIES = 200_000
DEFAULT_MAX_SAMPLES = 2_000_000
#: Answers larger than this are decoded series by series (a whole document in Python objects
#: takes about ten times its bytes).
STREAM_FROM_BYTES = 4 << 20

#: The ``kind`` of every :class:`PromAPIError`.
ERROR_KINDS = frozenset(
    {"unreachable", "timeout", "http_error", "bad_query", "not_prometheus", "auth", "too_large"}
)
#: Prometheus' own ``errorType`` values (``web/api/v1``); any other value is not repeated.
_ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found"}
)
_PARSE_POSITION = re.compile(r"\b(\d{1,6}):(\d{1,6}): parse error")

T = TypeVar("T")
R = TypeVar("R")


def format_time(t: float) -> str:
    """Unix seconds as the API's ``time``/``start``/``end``/``step``, exact to the millisecond.

    Formats from integer milliseconds, so no float formatting can move the evaluation
    time by a millisecond.
    """
    ms = int(round(float(t) * 1000.0))
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    return f"{sign}{ms // 1000}.{ms % 1000:03d}"


def format_duration(seconds: float) -> str:
    """``20s`` or ``2500ms``: a duration both Prometheus and VictoriaMetrics parse."""
    ms = max(1, int(round(seconds * 1000.0)))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(slots=True)
class VectorSample:
    """One element of an instant vector (a scalar answer is one VectorSample with no labels)."""

    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class RangeSeries:
    """One series of a range query: ``(unix seconds, value)`` points in time order."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class ActiveTarget:
    """A target the server scrapes now (``/api/v1/targets``): its labels after relabelling, and
    how often it is scraped (None where the server does not say)."""

    labels: dict[str, str]
    scrape_interval: float | None


@dataclass(frozen=True)
class QueryResult(Generic[T]):
    """An answer and the server's warnings (a partial answer from Thanos/Mimir says so there)."""

    data: list[T]
    warnings: list[str]


class PromAPIError(Exception):
    """A failed API call. ``kind`` is one of :data:`ERROR_KINDS`; ``message`` is safe to show anyone."""

    def __init__(self, kind: str, message: str, limit: str = "") -> None:
        """``limit``: for ``too_large``, the limit passed (``max_series``, ``max_samples``)."""
        assert kind in ERROR_KINDS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.limit = limit

    def __repr__(self) -> str:
        return f"PromAPIError({self.kind!r}, {self.message!r})"


def _not_prometheus(what: str) -> PromAPIError:
    return PromAPIError("not_prometheus", f"not a Prometheus API answer: {what}")


def _connect_failure(exc: BaseException) -> str:
    """Why a connection failed, classified from the cause chain (never the text of a TLS
    error: it can carry names from the server's certificate)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return "TLS certificate verification failed (set a CA file, or skip verification)"
        if isinstance(seen, ssl.SSLError):
            return "TLS handshake failed"
        if isinstance(seen, socket.gaierror):
            return "host name not resolved"
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, OSError) and seen.errno is not None:
            return f"cannot connect (errno {seen.errno})"
        seen = seen.__cause__ or seen.__context__
    return "cannot connect"


def _labels(value: Any) -> dict[str, str]:
    if type(value) is not dict:
        raise _not_prometheus("malformed label set")
    for k, v in value.items():
        if type(k) is not str or type(v) is not str:
            raise _not_prometheus("malformed label set")
    return value


def _point(value: Any) -> tuple[float, float]:
    """``[1700000000.123, "0.25"]`` -> floats; the value may be "NaN", "+Inf" or "-Inf"."""
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[1], str):
        raise _not_prometheus("malformed sample")
    t = value[0]
    if isinstance(t, bool) or not isinstance(t, int | float):
        raise _not_prometheus("malformed sample time")
    try:
        return float(t), float(value[1])
    except ValueError:
        raise _not_prometheus("malformed sample value") from None


@dataclass(frozen=True, slots=True)
class Limits:
    """What one answer may hold (``too_large`` past either)."""

    series: int = DEFAULT_MAX_SERIES
    samples: int = DEFAULT_MAX_SAMPLES

    def check(self, series: int, samples: int) -> None:
        if series > self.series:
            raise PromAPIError("too_large", f"the answer holds more than {self.series} series (max_series)",
                               "max_series")
        if samples > self.samples:
            raise PromAPIError("too_large", f"the answer holds more than {self.samples} points (max_samples)",
                               "max_samples")


def _vector(data: Any, limits: Limits = Limits()) -> list[VectorSample]:
    """``data`` of an instant query; its ``result`` a list, or an iterator of items (streamed)."""
    if not isinstance(data, dict):
        raise _not_prometheus("no result data")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return [VectorSample({}, _point(result)[1])]
    if kind == "matrix":
        raise PromAPIError("bad_query", "query rejected: an instant query must return an instant vector, not a range")
    if kind == "string":
        raise PromAPIError("bad_query", "query rejected: the result is a string, not numbers")
    if kind != "vector" or not isinstance(result, list | Iterator):
        raise _not_prometheus("unknown result type")
    if isinstance(result, list):
        limits.check(len(result), len(result))
    out: list[VectorSample] = []
    for item in result:
        if len(out) == limits.series:
            limits.check(len(out) + 1, 0)
        try:  # the common shape, checked in one go: {"metric": {...}, "value": [t, "v"]}
            labels, (t, v) = item["metric"], item["value"]
            if type(labels) is not dict or type(v) is not str or type(t) not in (int, float):
                raise TypeError
            out.append(VectorSample(_labels(labels), float(v)))
        except (TypeError, KeyError, ValueError):
            if not isinstance(item, dict):
                raise _not_prometheus("malformed result") from None
            out.append(VectorSample(_labels(item.get("metric", {})), _point(item.get("value"))[1]))
    return out


def _matrix(data: Any, limits: Limits = Limits()) -> list[RangeSeries]:
    """``data`` of a range query; its ``result`` a list, or an iterator of items (streamed)."""
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or \
            not isinstance(data.get("result"), list | Iterator):
        raise _not_prometheus("no range result")
    out: list[RangeSeries] = []
    points = 0
    for item in data["result"]:
        if not isinstance(item, dict) or not isinstance(item.get("values", []), list):
            raise _not_prometheus("malformed result")
        points += len(item.get("values", []))
        limits.check(len(out) + 1, points)
        out.append(RangeSeries(_labels(item.get("metric", {})), [_point(p) for p in item.get("values", [])]))
    return out


def _first(body: bytes, prefix: str) -> Any:
    """The first value at ``prefix`` of a JSON body, decoded lazily; None where there is none."""
    try:
        return next(ijson.items(io.BytesIO(body), prefix, use_float=True), None)
    except ijson.JSONError:
        return None


def _streamed(body: bytes) -> tuple[dict[str, Any], list[str]] | None:
    """A large success answer as ``data`` whose ``result`` yields one item at a time, and its
    warnings; None when the body does not start as a success (errors are small: decoded whole)."""
    if _first(body, "status") != "success":
        return None
    result_type = _first(body, "data.resultType")

    def items() -> Iterator[Any]:
        try:
            yield from ijson.items(io.BytesIO(body), "data.result.item", use_float=True)
        except ijson.JSONError:
            raise _not_prometheus("a body that is not the API's JSON") from None
    if result_type == "scalar":
        return {"resultType": result_type, "result": _first(body, "data.result")}, []
    return {"resultType": result_type, "result": items()}, _warnings(body)


def _warnings(body: bytes) -> list[str]:
    """A large answer's warnings. Looking for them decodes the whole body a second time, so a
    body that cannot hold the key - neither ``"warnings"`` nor any ``\\u`` escape in its bytes -
    has none without it (a 24 MB answer: 0.4 s of CPU saved)."""
    if b'"warnings"' not in body and b"\\u" not in body:
        return []
    try:
        return [w for w in ijson.items(io.BytesIO(body), "warnings.item") if isinstance(w, str)]
    except ijson.JSONError:
        raise _not_prometheus("a body that is not the API's JSON") from None


class PrometheusClient:
    """One Prometheus HTTP API endpoint. ``url`` is its base (``http://prometheus:9090``, or
    ``http://mimir/prometheus`` behind a path prefix). Thread-safe; call :meth:`close` when done.

    Credentials (``bearer_token``, ``basic_auth``, ``headers`` such as ``X-Scope-OrgID``) are
    sent on every request and appear in no message, log line or ``repr``.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_file: str | None = None,
        insecure_skip_verify: bool = False,
        timeout: float = 20.0,
        max_concurrency: int = 8,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_series: int = DEFAULT_MAX_SERIES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url: must be an http:// or https:// URL with a host")
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError("timeout: must be a positive number of seconds")
        if max_concurrency < 1:
            raise ValueError("max_concurrency: must be at least 1")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.max_concurrency = max_concurrency
        self.max_response_bytes = max_response_bytes
        self.limits = Limits(max_series, max_samples)
        sent = {"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        if bearer_token is not None:
            sent["Authorization"] = f"Bearer {bearer_token}"
        verify: ssl.SSLContext | bool = True
        if insecure_skip_verify:
            verify = False
        elif ca_file is not None:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError):
                raise ValueError("ca_file: cannot be read as PEM certificates") from None
        self._client = httpx.Client(
            headers=sent,
            auth=httpx.BasicAuth(*basic_auth) if basic_auth is not None else None,
            verify=verify,
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
            follow_redirects=False,
        )
        self._lock = threading.Lock()
        self._in_flight = threading.BoundedSemaphore(max_concurrency)
        self.read_concurrency = max(1, max_concurrency // 2)  # rounds keep the rest
        self._reads = threading.BoundedSemaphore(self.read_concurrency)
        self._queries = 0
        self._bytes = 0
        self._wire = 0
        self._use_get = False  # set once a POST got 405 (a proxy that only lets GET through)
        self._executor: ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        parts = urlsplit(self.url)
        return f"PrometheusClient({parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''})"

    @property
    def queries(self) -> int:
        """HTTP API calls made so far (every request sent, retries and fallbacks included)."""
        with self._lock:
            return self._queries

    @property
    def bytes_read(self) -> int:
        """Answer bytes received so far, decompressed (what the service decodes and the server
        encodes), for ``GET /api/v1/sources`` and the benchmarks."""
        with self._lock:
            return self._bytes

    @property
    def wire_bytes(self) -> int:
        """Answer bytes as they crossed the network (gzip where the server compresses)."""
        with self._lock:
            return self._wire

    # ---- API -------------------------------------------------------------------------------
    def query(self, promql: str, time: float) -> QueryResult[VectorSample]:
        """``/api/v1/query`` at ``time`` (unix seconds)."""
        data, warnings = self._call("query", {"query": promql, "time": format_time(time)})
        return QueryResult(_vector(data, self.limits), warnings)

    def query_samples(self, selector: str, time: float) -> QueryResult[RangeSeries]:
        """``/api/v1/query`` of a range selector (``x[5m]``) at ``time``: the raw samples, for the
        few numbers no PromQL function gives exactly (a ratio of two gauges sample by sample)."""
        data, warnings = self._call("query", {"query": selector, "time": format_time(time)})
        return QueryResult(_matrix(data, self.limits), warnings)

    def query_range(self, promql: str, start: float, end: float, step: float) -> QueryResult[RangeSeries]:
        """``/api/v1/query_range`` over ``[start, end]`` every ``step`` seconds."""
        form = {"query": promql, "start": format_time(start), "end": format_time(end), "step": format_time(step)}
        data, warnings = self._call("query_range", form)
        return QueryResult(_matrix(data, self.limits), warnings)

    def series(self, matchers: list[str], start: float, end: float) -> list[dict[str, str]]:
        """``/api/v1/series``: label sets of the series matching any of ``matchers`` in the range."""
        data, _ = self._call("series", {"match[]": list(matchers), "start": format_time(start),
                                        "end": format_time(end)})
        if not isinstance(data, list):
            raise _not_prometheus("no series list")
        return [_labels(item) for item in data]

    def check_selector(self, selector: str) -> str | None:
        """The server's own parser on a series selector: None if accepted, else a clean reason.

        Asks ``/api/v1/series`` over the last second: it reads the index only, never samples,
        so it is cheap on any server. Faults other than a rejected selector raise PromAPIError.
        """
        now = _time.time()
        try:
            self.series([selector], now - 1.0, now)
        except PromAPIError as exc:
            if exc.kind == "bad_query":
                return exc.message.replace("query rejected", "selector rejected", 1)
            raise
        return None

    def build_info(self) -> dict[str, str] | None:
        """``/api/v1/status/buildinfo`` (version, revision, ...), or None where the server
        has no such endpoint (VictoriaMetrics, some proxies)."""
        try:
            data, _ = self._call("status/buildinfo", None)
        except PromAPIError as exc:
            if exc.kind in ("http_error", "bad_query") and exc.message.startswith(
                ("HTTP 404", "HTTP 405", "HTTP 501", "query rejected")
            ):
                return None
            raise
        if not isinstance(data, dict):
            raise _not_prometheus("no build information")
        info = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
        return info or None  # VictoriaMetrics answers an empty stub

    def active_targets(self) -> list[ActiveTarget]:
        """``/api/v1/targets?state=active``: what the server scrapes and how often. Decoded target
        by target (an answer of a large cluster is mostly discovered labels, which are not
        kept); the targets' labels and ``scrapeInterval`` only (VictoriaMetrics gives none: its
        discovered ``__scrape_interval__`` then)."""
        status, body = self._request("targets?state=active", None)
        if not (200 <= status < 300) or _first(body, "status") != "success":
            self._envelope(status, body)  # the classified error
            raise _not_prometheus("no targets list")
        out = []
        try:
            for item in ijson.items(io.BytesIO(body), "data.activeTargets.item"):
                if not isinstance(item, dict):
                    raise _not_prometheus("malformed targets list")
                text = item.get("scrapeInterval")
                if text is None and isinstance(item.get("discoveredLabels"), dict):
                    text = item["discoveredLabels"].get("__scrape_interval__")
                try:
                    interval = parse_duration(text) if isinstance(text, str) and len(text) <= 32 else None
                except ValueError:
                    interval = None
                out.append(ActiveTarget(_labels(item.get("labels", {})), interval or None))
        except ijson.JSONError:
            raise _not_prometheus("a body that is not the API's JSON") from None
        return out

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]`` with at most ``max_concurrency`` calls running at once.

        Results keep the order of ``items``. Every call runs to its end; then the error of
        the first failed item (in item order) is raised. ``fn`` must not call :meth:`map`
        itself (the pool is shared and bounded).
        """
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="promapi")
            executor = self._executor
        futures: list[Future[R]] = [executor.submit(contextvars.copy_context().run, fn, item) for item in items]
        errors = [f.exception() for f in futures]  # waits for every call
        for error in errors:
            if error is not None:
                raise error
        return [f.result() for f in futures]

    def map_as_completed(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[int, R]]:
        """``(index, fn(item))`` in the order the calls finish, at most ``max_concurrency`` at
        once: the caller works on an answer while the others are still in flight (a round's
        decoding overlaps the server's query time). A failure, as with :meth:`map`: every call
        runs to its end, then the error of the first failed item (in item order) is raised,
        and no result after it is yielded."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="promapi")
            executor = self._executor
        futures: list[Future[R]] = [executor.submit(contextvars.copy_context().run, fn, item) for item in items]
        index = {id(f): i for i, f in enumerate(futures)}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: index[id(f)]):
                    if future.exception() is not None:
                        wait(pending)
                        for f in futures:
                            error = f.exception()
                            if error is not None:
                                raise error
                    yield index[id(future)], future.result()
        finally:
            wait(pending)  # a caller that stops early still leaves no call running

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport -------------------------------------------------------------------------
    def _call(self, endpoint: str, form: dict[str, Any] | None) -> tuple[Any, list[str]]:
        """One API call: ``data`` and ``warnings`` of a success envelope, else PromAPIError."""
        status, body = self._request(endpoint, form)
        if 200 <= status < 300 and len(body) > STREAM_FROM_BYTES:
            streamed = _streamed(body)
            if streamed is not None:
                return streamed
        return self._envelope(status, body)

    def _request(self, endpoint: str, form: dict[str, Any] | None) -> tuple[int, bytes]:
        """One API request: its status and (bounded) body.

        ``form`` None means a GET without parameters; otherwise a POST form (GET with the
        same parameters after a 405). The query timeout goes to the server as well.
        """
        url = f"{self.url}/api/v1/{endpoint}"
        budget = request_budget.current()
        with self._slot(budget):
            timeout = self.timeout if budget is None else max(0.001, min(self.timeout, budget.remaining()))
            if form is not None:
                form = {**form, "timeout": format_duration(timeout)}
            try:
                status, body = self._send(url, form, timeout)
                if status == 405 and form is not None and not self._use_get:
                    self._use_get = True
                    status, body = self._send(url, form, timeout)
            except PromAPIError as exc:
                if budget is not None and exc.kind == "timeout" and budget.remaining() <= 0:
                    raise BudgetExceeded(budget.seconds, budget.checks) from None
                raise
        return status, body

    @contextmanager
    def _slot(self, budget: RequestBudget | None) -> Iterator[None]:
        """One of the ``max_concurrency`` requests in flight; a read (``budget``) takes a read
        slot first and waits for either only while its budget lasts."""
        if budget is None:
            with self._in_flight:
                yield
            return
        budget.check()
        if not self._reads.acquire(timeout=max(0.0, budget.remaining() - MIN_READ_SECONDS)):
            raise BudgetExceeded(budget.seconds, budget.checks)
        try:
            if not self._in_flight.acquire(timeout=max(0.0, budget.remaining() - MIN_READ_SECONDS)):
                raise BudgetExceeded(budget.seconds, budget.checks)
            try:
                if budget.remaining() < MIN_READ_SECONDS:  # a slot came free too late to ask anything
                    raise BudgetExceeded(budget.seconds, budget.checks)
                yield
            finally:
                self._in_flight.release()
        finally:
            self._reads.release()

    def _send(self, url: str, form: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
        """Send one request (retried once if a kept-alive connection was closed under us)."""
        deadline = _time.monotonic() + timeout
        limit = httpx.Timeout(timeout)
        if form is None:
            request = self._client.build_request("GET", url, timeout=limit)
        elif self._use_get:
            request = self._client.build_request("GET", url, params=form, timeout=limit)
        else:
            request = self._client.build_request("POST", url, data=form, timeout=limit)
        for attempt in (1, 2):
            with self._lock:
                self._queries += 1
            try:
                response = self._client.send(request, stream=True)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                if attempt == 1:
                    continue
                raise PromAPIError("http_error", "the server closed the connection without answering") from None
            except httpx.ConnectTimeout:
                raise PromAPIError("unreachable", f"no connection within {timeout:g}s") from None
            except httpx.TimeoutException:
                raise PromAPIError("timeout", f"no answer within {timeout:g}s") from None
            except httpx.ConnectError as exc:
                raise PromAPIError("unreachable", _connect_failure(exc)) from None
            except httpx.HTTPError:
                raise PromAPIError("http_error", "the request failed before an answer arrived") from None
            try:
                return response.status_code, self._read(response, deadline, timeout)
            finally:
                response.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, response: httpx.Response, deadline: float, timeout: float) -> bytes:
        """The (decompressed) body, bounded in size and by the overall deadline."""
        limit = self.max_response_bytes
        too_large = PromAPIError("too_large", f"answer larger than {limit} bytes", "max_response_bytes")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit and "content-encoding" not in response.headers:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise too_large
                if _time.monotonic() > deadline:
                    raise PromAPIError("timeout", f"no complete answer within {timeout:g}s")
                chunks.append(chunk)
        except httpx.TimeoutException:
            raise PromAPIError("timeout", f"no complete answer within {timeout:g}s") from None
        except httpx.DecodingError:
            raise PromAPIError("http_error", "the answer's compressed body is broken") from None
        except httpx.HTTPError:
            raise PromAPIError("http_error", "the connection broke before the answer was complete") from None
        with self._lock:
            self._bytes += size
            self._wire += response.num_bytes_downloaded
        return b"".join(chunks)

    @staticmethod
    def _envelope(status: int, body: bytes) -> tuple[Any, list[str]]:
        """Classify an answer: the ``data`` and ``warnings`` of a success, else PromAPIError."""
        if status in (401, 403):
            raise PromAPIError("auth", f"{http_status_message(status)}: the credentials were refused")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        is_envelope = isinstance(doc, dict) and doc.get("status") in ("success", "error")
        if not is_envelope:
            if 200 <= status < 300:
                looks_html = body.lstrip()[:1] == b"<"
                raise _not_prometheus("an HTML page" if looks_html else "a body that is not the API's JSON")
            raise PromAPIError("http_error", http_status_message(status))
        assert isinstance(doc, dict)
        if doc["status"] == "error" or not 200 <= status < 300:
            error_type = doc.get("errorType")
            known = error_type if isinstance(error_type, str) and error_type in _ERROR_TYPES else None
            if known in ("timeout", "canceled"):
                raise PromAPIError("timeout", f"the server gave up on the query ({known})")
            if status in (400, 422) or known in ("bad_data", "execution"):
                detail = f" ({known})" if known else ""
                error = doc.get("error")
                where = _PARSE_POSITION.search(error) if isinstance(error, str) else None
                if where:
                    detail += f": parse error at line {where[1]}, column {where[2]}"
                raise PromAPIError("bad_query", f"query rejected{detail}")
            detail = f" ({known})" if known else ""
            raise PromAPIError("http_error", f"{http_status_message(status)}{detail}")
        warnings = doc.get("warnings")
        clean = [w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []
        return doc.get("data"), clean
