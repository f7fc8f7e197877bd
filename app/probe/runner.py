"""One probe run: streamed OpenAI-compatible requests with input length, output length and
concurrency held fixed, timed from the client.

Per request the runner records TTFT (request sent -> first token received), every
inter-token gap, end-to-end time, the tokens received, the server's ``usage`` and, when
something went wrong, an error class:

===============  ============================================================================
``connect``      the connection could not be made (refused, DNS, connect timeout)
``timeout``      the request's own time limit passed (before the first token: a slow TTFT)
``http_status``  the answer was not 200 (the status and the start of the body are kept)
``stalled``      after the first token, no data within ``stall_timeout``
``malformed_sse`` lines that are not SSE or events that are not the expected JSON
``incomplete``   the stream ended (or broke) before ``[DONE]``/a finish reason
``stream_error`` the server sent an error object inside the stream
``cancelled``    still running when the probe's time limit ended the run
===============  ============================================================================

Only requests without an error enter the latency statistics; every request counts in
``errors``.

Bounds (a probe is safe to point at production): a level never issues more than its
``requests``, never has more than its ``concurrency`` in flight (workers + an httpx pool of
the same size) and the whole run ends at ``time_limit`` - requests still running are cut
off and recorded as ``cancelled``. The optional preflight (model discovery, protocol
negotiation, prompt calibration) sends at most :data:`MAX_PREFLIGHT_REQUESTS` tiny
requests (``max_tokens=1``) before the measured phase; they are reported separately
(``ProbeResult.preflight``: the engine saw them, so the consistency check counts them) and lie
outside the measured period of the levels (``LevelResult.started_at``/``finished_at``).
With ``metrics_url`` the engine's ``/metrics`` page is also read before the first level and
after each one (a GET, not a completion request): ``LevelResult.server`` is the engine's own
view of the level, its queue time above all (:mod:`app.probe.server_metrics`).

Prompt length is exact where the engine takes token ids (vLLM and the emulator do for
``/v1/completions``): the prompt is a list of ids. Otherwise the prompt is text whose length
is calibrated with two preflight requests from ``usage.prompt_tokens`` (the chat template's
overhead included). Every prompt starts with a per-request nonce so prefix caching cannot
make probes look faster than real traffic. Output length is fixed with ``max_tokens`` and
``ignore_eos``; a server that rejects an extension (``ignore_eos``, ``stream_options``,
token-id prompts) is retried without it during the preflight, and the result says what was
used (``ProbeResult.protocol``).

Times are wall-clock seconds as the client sees them. (An emulated target with
``time_scale`` k records simulated seconds in its histograms: multiply client numbers by k
to compare.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import random
import ssl
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from app.probe import server_metrics
from app.probe.sse import DONE, SSEParser
from app.scrape.client import PageFetcher

log = logging.getLogger(__name__)

ERROR_CLASSES = ("connect", "timeout", "http_status", "stalled", "malformed_sse", "incomplete", "stream_error",
                 "cancelled")
#: Error classes whose ``detail`` may quote the server's answer (an error body or event,
#: malformed stream lines, an HTTP library's message naming the bytes received); the API
#: shows those details only to token holders (app.api.redaction). The others are our words.
QUOTING_ERROR_CLASSES = ("http_status", "malformed_sse", "incomplete", "stream_error")
PromptMode = Literal["auto", "token_ids", "text"]
MAX_PREFLIGHT_REQUESTS = 6
#: Token ids used to build prompts: small ids exist in every vocabulary (even a 1k-token test model's).
TOKEN_ID_BASE, TOKEN_ID_SPAN = 10, 500
#: Words that are one token in common BPE vocabularies (and in the emulator: 4 characters).
WORDS = (" the", " and", " for", " are", " but", " not", " you", " all", " any", " can", " had", " her", " was",
         " one", " our", " out", " day", " get", " has", " him", " his", " how", " man", " new", " now", " old",
         " see", " two", " way", " who", " boy", " did", " its", " let", " put", " say", " she", " too", " use")
_DETAIL_CHARS = 300
DONE_GRACE_S = 1.0
METRICS_TIMEOUT_S = 5.0  # reading the engine's /metrics around a level


# ---------------------------------------------------------------------------- statistics

def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default ``linear`` method)."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    """p50/p90/p99/mean/min/max of a sample (None when empty)."""

    count: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    min: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        v = sorted(values)
        if not v:
            return cls(0)
        return cls(len(v), quantile(v, 0.5), quantile(v, 0.9), quantile(v, 0.99), math.fsum(v) / len(v), v[0], v[-1])


# ---------------------------------------------------------------------------- what to run

@dataclass(frozen=True)
class ProbeSpec:
    """Where to send requests and the fixed factors of a probe.

    ``url`` is the server's base URL (``http://host:8000``); a trailing ``/v1`` or
    ``/metrics`` (a monitored target's URL) is removed. ``requests`` defaults to two per
    concurrency slot. ``timeout`` bounds one request, ``time_limit`` the whole run.
    """

    url: str
    model: str | None = None
    prompt_tokens: int = 512
    max_tokens: int = 128
    concurrency: int = 1
    requests: int | None = None
    chat: bool = False
    endpoint: str | None = None  # default /v1/completions, or /v1/chat/completions with chat
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0
    stall_timeout: float = 30.0
    connect_timeout: float = 10.0
    time_limit: float | None = None
    prompt_mode: PromptMode = "auto"
    ignore_eos: bool = True
    include_usage: bool = True
    preflight: bool = True
    extra_body: dict = field(default_factory=dict)
    metrics_url: str | None = None  # the engine's /metrics, read around every level (LevelResult.server)

    def validate(self) -> ProbeSpec:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url: must be an http(s) URL with a host, got {self.url!r}")
        for name in ("prompt_tokens", "max_tokens", "concurrency"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.requests is not None and (not isinstance(self.requests, int) or self.requests < 1):
            raise ValueError(f"requests: must be a positive integer, got {self.requests!r}")
        for name in ("timeout", "stall_timeout", "connect_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ValueError(f"{name}: must be a positive number of seconds, got {value!r}")
        if self.time_limit is not None and not (0 < self.time_limit < math.inf):
            raise ValueError(f"time_limit: must be a positive number of seconds, got {self.time_limit!r}")
        if self.prompt_mode not in ("auto", "token_ids", "text"):
            raise ValueError(f"prompt_mode: must be auto, token_ids or text, got {self.prompt_mode!r}")
        if self.chat and self.prompt_mode == "token_ids":
            raise ValueError("prompt_mode: token ids are only accepted by /v1/completions, not chat")
        if self.endpoint is not None and not self.endpoint.startswith("/"):
            raise ValueError(f"endpoint: must be a path starting with '/', got {self.endpoint!r}")
        if self.metrics_url is not None:
            metrics = urlsplit(self.metrics_url)
            if metrics.scheme not in ("http", "https") or not metrics.hostname:
                raise ValueError(f"metrics_url: must be an http(s) URL with a host, got {self.metrics_url!r}")
        return self

    @property
    def base_url(self) -> str:
        return api_base(self.url)

    @property
    def path(self) -> str:
        return self.endpoint or ("/v1/chat/completions" if self.chat else "/v1/completions")

    @property
    def effective_requests(self) -> int:
        return self.requests if self.requests is not None else 2 * self.concurrency

    def plan(self) -> LevelPlan:
        return LevelPlan(self.concurrency, self.prompt_tokens, self.max_tokens, self.effective_requests)


def api_base(url: str) -> str:
    """``http://h:p/metrics``, ``http://h:p/v1/`` or ``http://h:p/v1/chat/completions`` ->
    ``http://h:p`` (other path prefixes, e.g. a gateway's ``/llm``, are kept)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in ("/metrics", "/chat/completions", "/completions", "/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)].rstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class LevelPlan:
    """One step of a probe: ``requests`` requests, at most ``concurrency`` in flight."""

    concurrency: int
    prompt_tokens: int
    max_tokens: int
    requests: int

    def validate(self) -> LevelPlan:
        for name in ("concurrency", "prompt_tokens", "max_tokens", "requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        return self


# ---------------------------------------------------------------------------- results

@dataclass
class RequestResult:
    """One request as the client saw it (seconds, wall clock)."""

    index: int
    started_at: float = 0.0  # unix time the request was sent
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)  # every gap between consecutive tokens
    e2e: float | None = None  # sent -> end of stream ([DONE] or close)
    tokens: int = 0  # content chunks received (one token each on vLLM/TGI/SGLang)
    usage: dict | None = None
    finish_reason: str | None = None
    status_code: int | None = None
    malformed_lines: int = 0
    error: str | None = None  # one of ERROR_CLASSES
    detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def prompt_tokens(self) -> int | None:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) else None

    @property
    def completion_tokens(self) -> int | None:
        value = (self.usage or {}).get("completion_tokens")
        return value if isinstance(value, int) else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["itl"] = Stats.of(self.itl).__dict__ if self.itl else None
        return out


@dataclass
class LevelResult:
    """One level of a probe (fixed prompt length, output length, concurrency) and its summary."""

    plan: LevelPlan
    started_at: float
    finished_at: float
    requests: list[RequestResult]
    max_in_flight: int
    stopped_by: str  # "done" | "time_limit"
    server: dict | None = None  # the engine's /metrics over the level (server_metrics.level_view), if read
    ttft: Stats = field(init=False)
    itl: Stats = field(init=False)
    e2e: Stats = field(init=False)
    tpot: Stats = field(init=False)  # per request (e2e - ttft) / (tokens - 1)
    errors: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        ok = [r for r in self.requests if r.ok]
        self.ttft = Stats.of([r.ttft for r in ok if r.ttft is not None])
        self.itl = Stats.of([g for r in ok for g in r.itl])
        self.e2e = Stats.of([r.e2e for r in ok if r.e2e is not None])
        self.tpot = Stats.of([(r.e2e - r.ttft) / (r.tokens - 1) for r in ok
                              if r.tokens > 1 and r.e2e is not None and r.ttft is not None])
        errors: dict[str, int] = {}
        for r in self.requests:
            if r.error:
                errors[r.error] = errors.get(r.error, 0) + 1
        self.errors = errors

    @property
    def concurrency(self) -> int:
        return self.plan.concurrency

    @property
    def duration(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    @property
    def issued(self) -> int:
        return len(self.requests)

    @property
    def succeeded(self) -> int:
        return sum(1 for r in self.requests if r.ok)

    @property
    def failed(self) -> int:
        return self.issued - self.succeeded

    @property
    def output_tokens_per_s(self) -> float | None:
        """Tokens received per second of the level (all streams together)."""
        return sum(r.tokens for r in self.requests) / self.duration if self.duration > 0 else None

    @property
    def prompt_tokens_seen(self) -> Stats:
        """What the server counted (``usage.prompt_tokens``): proves the prompt length held."""
        return Stats.of([r.prompt_tokens for r in self.requests if r.prompt_tokens is not None])

    def summary(self) -> dict:
        """JSON-friendly summary (no per-request data)."""
        seen = self.prompt_tokens_seen
        return {
            "concurrency": self.plan.concurrency, "prompt_tokens": self.plan.prompt_tokens,
            "max_tokens": self.plan.max_tokens, "requests_planned": self.plan.requests,
            "requests": self.issued, "succeeded": self.succeeded, "failed": self.failed, "errors": dict(self.errors),
            "started_at": self.started_at, "finished_at": self.finished_at, "duration_seconds": self.duration,
            "stopped_by": self.stopped_by, "max_in_flight": self.max_in_flight,
            "ttft": asdict(self.ttft), "itl": asdict(self.itl), "e2e": asdict(self.e2e), "tpot": asdict(self.tpot),
            "output_tokens_per_second": self.output_tokens_per_s,
            "tokens_received": sum(r.tokens for r in self.requests),
            "prompt_tokens_seen": {"min": seen.min, "max": seen.max, "mean": seen.mean} if seen.count else None,
            "server": self.server,
        }


@dataclass
class ProbeResult:
    """A whole probe run: the levels in order, the protocol used, what ended it."""

    url: str
    endpoint: str
    model: str | None
    started_at: float
    finished_at: float
    levels: list[LevelResult]
    protocol: dict[str, Any]
    preflight_requests: int
    stopped_by: str  # "done" | "time_limit"
    preflight: list[RequestResult] = field(default_factory=list)  # tiny requests (max_tokens=1) before level 1

    @property
    def preflight_ttfts(self) -> list[float]:
        """TTFTs of the preflight requests the engine served: they are in its histograms too."""
        return [r.ttft for r in self.preflight if r.ok and r.ttft is not None]

    @property
    def errors(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for level in self.levels:
            for key, n in level.errors.items():
                total[key] = total.get(key, 0) + n
        return total

    @property
    def failed(self) -> int:
        return sum(level.failed for level in self.levels)

    @property
    def requests(self) -> int:
        return sum(level.issued for level in self.levels)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.requests > 0

    def level(self, concurrency: int) -> LevelResult:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)

    def summary(self) -> dict:
        return {
            "url": self.url, "endpoint": self.endpoint, "model": self.model, "started_at": self.started_at,
            "finished_at": self.finished_at, "stopped_by": self.stopped_by, "requests": self.requests,
            "failed": self.failed, "errors": self.errors, "preflight_requests": self.preflight_requests,
            "protocol": dict(self.protocol), "levels": [lv.summary() for lv in self.levels],
            "preflight_ttfts": self.preflight_ttfts,
        }


# ---------------------------------------------------------------------------- the runner

@dataclass
class _Protocol:
    model: str | None
    prompt_mode: str  # token_ids | text
    ignore_eos: bool
    include_usage: bool
    tokens_per_word: float = 1.0
    overhead_tokens: float = 0.0
    calibrated: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


class Prober:
    """Runs probes against one server. Use :func:`run_probe` unless you need the pieces."""

    def __init__(self, spec: ProbeSpec, client: httpx.AsyncClient, *, seed: int | None = None) -> None:
        self.spec = spec.validate()
        self.client = client
        self.url = spec.base_url + spec.path
        self.headers = {"Accept": "text/event-stream"}
        if spec.api_key:
            self.headers["Authorization"] = f"Bearer {spec.api_key}"
        mode = spec.prompt_mode
        if mode == "auto":
            mode = "text" if spec.chat else "token_ids"
        self.protocol = _Protocol(spec.model, mode, spec.ignore_eos, spec.include_usage)
        self._rng = random.Random(seed)
        self._nonce = itertools.count(self._rng.randrange(1 << 30))
        self.preflight_requests = 0
        self.preflight_results: list[RequestResult] = []
        self.probe_deadline = math.inf  # loop time

    # ---------------------------------------------------------------- request bodies
    def _words(self, nonce: int, count: int) -> str:
        head = [WORDS[(nonce >> (6 * k)) % len(WORDS)] for k in range(4)]  # the nonce as 4 words
        body = [WORDS[(nonce + 7 * i) % len(WORDS)] for i in range(max(0, count - 4))]
        return "".join((head + body)[:count])

    def body(self, prompt_tokens: int, max_tokens: int, *, words: int | None = None) -> dict:
        p = self.protocol
        nonce = next(self._nonce)
        body: dict[str, Any] = {}
        if p.model:
            body["model"] = p.model
        if p.prompt_mode == "token_ids" and words is None:
            head = [TOKEN_ID_BASE + (nonce // TOKEN_ID_SPAN ** k) % TOKEN_ID_SPAN for k in range(3)]
            rest = [TOKEN_ID_BASE + (nonce + 7 * i) % TOKEN_ID_SPAN for i in range(max(0, prompt_tokens - 3))]
            prompt: Any = (head + rest)[:prompt_tokens]
        else:
            if words is None:
                words = max(1, round((prompt_tokens - p.overhead_tokens) / p.tokens_per_word))
            prompt = self._words(nonce, words)
        if self.spec.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body["max_tokens"] = max_tokens
        body["stream"] = True
        if p.include_usage:
            body["stream_options"] = {"include_usage": True}
        if p.ignore_eos:
            body["ignore_eos"] = True
        body.update(self.spec.extra_body)
        return body

    # ---------------------------------------------------------------- one request
    async def request(self, index: int, body: dict) -> RequestResult:
        """Send one streamed request and time it; never raises for anything the server does."""
        spec = self.spec
        loop = asyncio.get_running_loop()
        rec = RequestResult(index=index, started_at=time.time())
        t0 = time.perf_counter()
        request_deadline = loop.time() + spec.timeout
        parser = SSEParser()
        done = False
        last_data = t0
        last_token = 0.0
        kind = "timeout"  # what the armed deadline means when it fires

        def arm(cm: asyncio.Timeout, phase: str) -> None:
            nonlocal kind
            options = [(request_deadline, "timeout"), (self.probe_deadline, "cancelled")]
            if phase == "streaming":
                options.append((loop.time() + spec.stall_timeout, "stalled"))
            elif phase == "done":  # [DONE] seen: wait briefly for the end of the body (keeps the connection)
                options.append((loop.time() + min(spec.stall_timeout, DONE_GRACE_S), "after_done"))
            when, kind = min(options, key=lambda o: o[0])
            cm.reschedule(when)

        def handle(payload: str, now: float) -> None:
            nonlocal done, last_token
            if payload.strip() == DONE:
                done = True
                return
            try:
                event = json.loads(payload)
            except ValueError:
                parser.note(payload)
                return
            if not isinstance(event, dict):
                parser.note(payload)
                return
            if event.get("error"):
                err = event["error"]
                msg = err.get("message") if isinstance(err, dict) else err
                rec.error = rec.error or "stream_error"
                rec.detail = rec.detail or str(msg)[:_DETAIL_CHARS]
                return
            usage = event.get("usage")
            if isinstance(usage, dict):
                rec.usage = usage
            choices = event.get("choices")
            if choices is None and isinstance(usage, dict):
                return
            if not isinstance(choices, list):
                parser.note(payload)
                return
            for choice in choices:
                if not isinstance(choice, dict):
                    parser.note(payload)
                    continue
                text = choice.get("text")
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    text = delta.get("content") or delta.get("reasoning_content") or text
                if isinstance(text, str) and text:
                    elapsed = now - t0
                    if rec.ttft is None:
                        rec.ttft = elapsed
                    else:
                        rec.itl.append(elapsed - last_token)
                    last_token = elapsed
                    rec.tokens += 1
                reason = choice.get("finish_reason")
                if reason:
                    rec.finish_reason = str(reason)

        try:
            async with asyncio.timeout(None) as cm:
                arm(cm, "waiting")
                async with self.client.stream("POST", self.url, json=body, headers=self.headers) as resp:
                    rec.status_code = resp.status_code
                    if resp.status_code != 200:
                        raw = b""
                        async for chunk in resp.aiter_bytes():
                            raw += chunk
                            if len(raw) > 4096:
                                break
                        rec.error = "http_status"
                        rec.detail = f"HTTP {resp.status_code}: " + raw.decode("utf-8", "replace")[:_DETAIL_CHARS]
                        return rec
                    async for chunk in resp.aiter_bytes():
                        now = time.perf_counter()
                        if not done:
                            last_data = now
                            for payload in parser.feed(chunk):
                                handle(payload, now)
                        if done:
                            arm(cm, "done")
                        elif rec.ttft is not None:
                            arm(cm, "streaming")
                    now = time.perf_counter()
                    if not done:
                        last_data = now
                        for payload in parser.close():
                            handle(payload, now)
        except TimeoutError:
            if kind != "after_done":
                rec.error = rec.error or kind
                rec.detail = rec.detail or {
                    "timeout": f"no complete answer within the request timeout ({spec.timeout:g}s)",
                    "stalled": f"no data for {spec.stall_timeout:g}s after token {rec.tokens}",
                    "cancelled": f"cut off by the probe's time limit after token {rec.tokens}",
                }[kind]
        except httpx.ConnectTimeout:
            rec.error, rec.detail = "connect", f"connect timeout ({spec.connect_timeout:g}s)"
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
            rec.error, rec.detail = "connect", f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        except httpx.ReadTimeout:
            rec.error = rec.error or ("stalled" if rec.ttft is not None else "timeout")
            rec.detail = rec.detail or f"read timeout after token {rec.tokens}"
        except httpx.HTTPError as exc:  # RemoteProtocolError, ReadError, ...: the stream broke
            if not done:
                rec.error = rec.error or "incomplete"
                rec.detail = rec.detail or f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        except Exception as exc:
            log.warning("probe request to %s failed unexpectedly", self.url, exc_info=True)
            if not done:
                rec.error = rec.error or "incomplete"
                rec.detail = rec.detail or f"unexpected {type(exc).__name__}: {exc}"[:_DETAIL_CHARS]
        rec.malformed_lines = parser.malformed
        if rec.error is None:
            rec.e2e = last_data - t0
            if not done and rec.finish_reason is None:
                rec.error, rec.detail = "incomplete", f"stream ended without [DONE] after {rec.tokens} tokens"
            elif rec.tokens == 0:
                rec.error, rec.detail = "incomplete", "stream finished without any token"
            elif parser.malformed:
                rec.error = "malformed_sse"
                rec.detail = f"{parser.malformed} malformed line(s), e.g. " + " | ".join(parser.malformed_samples)
        return rec

    # ---------------------------------------------------------------- preflight
    async def discover_model(self) -> str | None:
        try:
            resp = await self.client.get(self.spec.base_url + "/v1/models", headers=self.headers,
                                         timeout=min(10.0, self.spec.timeout))
            data = resp.json().get("data") if resp.status_code == 200 else None
            if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
                return data[0]["id"]
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        return None

    async def _preflight_request(self, body: dict) -> RequestResult:
        self.preflight_requests += 1
        result = await self.request(-self.preflight_requests, body)
        self.preflight_results.append(result)
        return result

    async def preflight(self) -> None:
        """Find the model, the request features the server accepts and (text prompts) how many
        words make how many tokens. At most MAX_PREFLIGHT_REQUESTS tiny requests."""
        p = self.protocol
        if p.model is None:
            p.model = await self.discover_model()
        while self.preflight_requests < MAX_PREFLIGHT_REQUESTS - 2:
            r = await self._preflight_request(self.body(16, 1))
            if not (r.error == "http_status" and r.status_code in (400, 422)):
                break
            if not self._drop_feature((r.detail or "").lower()):
                break
        if p.prompt_mode == "text" and p.include_usage:
            await self._calibrate()

    def _drop_feature(self, message: str) -> bool:
        p = self.protocol
        if p.include_usage and "stream_options" in message:
            p.include_usage = False
        elif p.ignore_eos and "ignore_eos" in message:
            p.ignore_eos = False
        elif p.prompt_mode == "token_ids" and "prompt" in message:
            p.prompt_mode = "text"
        elif p.include_usage:
            p.include_usage = False
        elif p.prompt_mode == "token_ids":
            p.prompt_mode = "text"
        elif p.ignore_eos:
            p.ignore_eos = False
        else:
            return False
        return True

    async def _calibrate(self) -> None:
        p = self.protocol
        points = []
        for words in (16, 144):
            r = await self._preflight_request(self.body(0, 1, words=words))
            if r.prompt_tokens is None:
                return
            points.append((words, r.prompt_tokens))
        (w1, t1), (w2, t2) = points
        if t2 <= t1:
            return
        p.tokens_per_word = (t2 - t1) / (w2 - w1)
        p.overhead_tokens = t1 - p.tokens_per_word * w1
        p.calibrated = True

    # ---------------------------------------------------------------- one level
    async def run_level(self, plan: LevelPlan,
                        on_request: Callable[[LevelPlan, RequestResult], None] | None = None) -> LevelResult:
        plan.validate()
        loop = asyncio.get_running_loop()
        results: list[RequestResult] = []
        counter = itertools.count()
        in_flight = 0
        max_in_flight = 0
        started = time.time()

        async def worker() -> None:
            nonlocal in_flight, max_in_flight
            while loop.time() < self.probe_deadline:
                index = next(counter)
                if index >= plan.requests:
                    return
                body = self.body(plan.prompt_tokens, plan.max_tokens)
                in_flight += 1
                max_in_flight = max(max_in_flight, in_flight)
                try:
                    result = await self.request(index, body)
                finally:
                    in_flight -= 1
                results.append(result)
                if on_request is not None:
                    on_request(plan, result)

        await asyncio.gather(*(worker() for _ in range(min(plan.concurrency, plan.requests))))
        finished = time.time()
        results.sort(key=lambda r: r.index)
        stopped = "time_limit" if (len(results) < plan.requests or any(r.error == "cancelled" for r in results)) \
            else "done"
        return LevelResult(plan, started, finished, results, max_in_flight, stopped)


def _client(spec: ProbeSpec, max_concurrency: int, tls: ssl.SSLContext) -> httpx.AsyncClient:
    """A connection pool for one level (and one for the preflight).

    Each level gets a fresh pool: when many requests start together on a pool that already
    holds an idle connection (left by the preflight or the previous level), httpx hands that
    one connection to several of them, and they reach the engine one after another instead
    of together (32 "concurrent" requests then arrive spread over seconds, and the engine
    sees almost no queueing at "concurrency 32").
    httpx's own timeouts are backstops; the runner's clocks (request timeout, stall timeout,
    probe time limit) decide. The pool is exactly as large as the concurrency allows. Proxy
    variables are ignored (as by the scraper): the probe measures the path to the engine.
    ``tls`` is built once per probe: httpx builds a new TLS context per client otherwise,
    which can cost a noticeable part of a second per level on a busy machine."""
    timeout = httpx.Timeout(spec.timeout + 5.0, connect=spec.connect_timeout)
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    return httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False, verify=tls)


async def run_probe(spec: ProbeSpec, plans: Sequence[LevelPlan] | None = None, *,
                    on_request: Callable[[LevelPlan, RequestResult], None] | None = None,
                    seed: int | None = None) -> ProbeResult:
    """Run ``plans`` (default: the single level the spec describes) one after the other,
    sharing the preflight and the time limit (each level on a fresh connection pool, see
    :func:`_client`). With ``spec.metrics_url``
    the engine's page is read before the first level and after each (one GET per boundary,
    within the time limit): ``LevelResult.server`` is the engine's view of that level."""
    spec.validate()
    plans = [p.validate() for p in (plans or [spec.plan()])]
    loop = asyncio.get_running_loop()
    started = time.time()
    tls = httpx.create_ssl_context()
    async with _client(spec, 1, tls) as client, AsyncExitStack() as stack:
        fetcher = await stack.enter_async_context(PageFetcher(
            max_concurrency=1, connect_timeout=spec.connect_timeout)) \
            if spec.metrics_url else None
        prober = Prober(spec, client, seed=seed)
        if spec.time_limit is not None:
            prober.probe_deadline = loop.time() + spec.time_limit

        async def engine_page() -> server_metrics.Snapshot:
            left = min(METRICS_TIMEOUT_S, prober.probe_deadline - loop.time())
            if left <= 0:
                return server_metrics.Snapshot(time.time(), error="the probe's time limit was reached")
            return await server_metrics.snapshot(fetcher, spec.metrics_url, left)  # type: ignore[arg-type]

        if spec.preflight:
            await prober.preflight()
        levels: list[LevelResult] = []
        before = await engine_page() if spec.metrics_url else None
        for plan in plans:
            if loop.time() >= prober.probe_deadline:
                break
            async with _client(spec, plan.concurrency, tls) as prober.client:
                level = await prober.run_level(plan, on_request)
            if before is not None:
                after = await engine_page()
                level.server = server_metrics.level_view(spec.metrics_url, before, after)  # type: ignore[arg-type]
                before = after
            levels.append(level)
    finished = time.time()
    stopped = "time_limit" if (len(levels) < len(plans) or any(lv.stopped_by == "time_limit" for lv in levels)) \
        else "done"
    return ProbeResult(spec.base_url, spec.path, prober.protocol.model, started, finished, levels,
                       prober.protocol.as_dict(), prober.preflight_requests, stopped, prober.preflight_results)


def run_probe_sync(spec: ProbeSpec, plans: Sequence[LevelPlan] | None = None, **kw: Any) -> ProbeResult:
    """:func:`run_probe` for synchronous callers (its own event loop; not from inside a loop)."""
    return asyncio.run(run_probe(spec, plans, **kw))

