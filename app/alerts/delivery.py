"""The outbox worker: delivers notification rows, retrying until they arrive or expire.

* Only the oldest pending notification of each (receiver, group) is attempted, so a
  group's notifications arrive in the order they were created even across retries.
* A failed attempt is retried with exponential backoff (1 s, 2 s, 4 s, ... capped at
  ``max_backoff``) times a random jitter in [0.5, 1.5), until ``max_delivery_age`` after
  the notification was created; then it is marked ``expired`` and the group moves on.
* Every attempt is recorded: HTTP status, latency, the first 1 kB (1024 bytes) of the
  response or the error.
* A ``kind: alertmanager`` post is sent with its firing alerts' ``endsAt`` counted from
  the attempt (:func:`~app.alerts.schemas.alertmanager_post_at`), so one that waited out
  an Alertmanager outage does not arrive already ended (and resolve the alert).
* Each request carries ``Idempotency-Key: <notification id>`` (the same on every
  retry) so receivers can drop duplicates, and, when the receiver has a secret,
  ``X-LLM-Latency-Timestamp`` and ``X-LLM-Latency-Signature: sha256=<hex>`` where the hex
  is HMAC-SHA256(secret, timestamp + "." + raw body); verifying it:
  docs/alerts.md#verifying-a-notification.
* Rows live in the database, so pending deliveries survive a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import time
from collections.abc import Callable

import httpx
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import repository as alert_repository
from app.alerts.config import ReceiverConfig
from app.alerts.schemas import alertmanager_post_at
from app.store.models import NotificationRow

log = logging.getLogger(__name__)
SIGNATURE_HEADER = "X-LLM-Latency-Signature"
TIMESTAMP_HEADER = "X-LLM-Latency-Timestamp"
USER_AGENT = "llm-latency-monitor/0.1"
CLAIM_SECONDS = 120.0  # longer than any receiver timeout (at most 120 s): a row whose receiver is unknown
CLAIM_MARGIN = 5.0  # a claim outlives its receiver's timeout by this much (recording the outcome)
RESPONSE_LOG_BYTES = 1024  # of a receiver's answer (or an error) kept in the attempt log


async def _response_head(response: httpx.Response) -> str:
    """The first ``RESPONSE_LOG_BYTES`` of the answer, decoded without a cut character;
    the rest is never read, so a huge answer costs neither memory nor time."""
    head = b""
    async for chunk in response.aiter_bytes():
        head += chunk
        if len(head) >= RESPONSE_LOG_BYTES:
            break
    return head[:RESPONSE_LOG_BYTES].decode(response.encoding or "utf-8", errors="ignore")


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=`` + hex HMAC-SHA256 over ``timestamp.body`` (the Stripe/Slack scheme: the
    timestamp is signed too, so a captured request cannot be replayed later)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: str, timestamp: str, body: bytes, signature: str, now: float | None = None,
           tolerance: float = 300.0) -> bool:
    """The receiver side of :func:`sign` (docs/alerts.md#verifying-a-notification; used by the tests)."""
    now = time.time() if now is None else now
    try:
        fresh = abs(now - float(timestamp)) <= tolerance
    except ValueError:
        return False
    return fresh and hmac.compare_digest(sign(secret, timestamp, body), signature)


class DeliveryWorker:
    def __init__(self, sessions: sessionmaker[Session], receivers: Callable[[], dict[str, ReceiverConfig]],
                 secret: Callable[[str], str | None], max_age: float = 86400.0, max_backoff: float = 300.0,
                 base_backoff: float = 1.0, on_attempt: Callable[[str, bool, float], None] | None = None) -> None:
        self.sessions = sessions
        self.receivers = receivers
        self.secret = secret
        self.max_age = max_age
        self.max_backoff = max_backoff
        self.base_backoff = base_backoff
        self.on_attempt = on_attempt
        self._client: httpx.AsyncClient | None = None
        self._random = random.Random()
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._client = httpx.AsyncClient(follow_redirects=False, headers={"User-Agent": USER_AGENT})

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _due(self, now: float, claims: dict[str, float] | None = None) -> list[tuple[str, str, str, int, float]]:
        """(id, receiver, body, attempts, created_at) of group heads due now; expires the too-old ones.

        Each returned row is *claimed*: its next attempt is pushed its receiver's timeout +
        ``CLAIM_MARGIN`` ahead (``claims``: receiver -> seconds; ``CLAIM_SECONDS`` for one
        not listed) in the same transaction, so an overlapping run (or a second replica)
        does not send it again while this attempt is in flight; the attempt's outcome then
        sets the real next time. If the process dies mid-attempt, the row is due again when
        the claim runs out and is retried with the same Idempotency-Key (at-least-once).
        """
        claims = claims or {}
        due = []
        with self.sessions.begin() as session:
            heads = alert_repository.pending_notification_heads(session, lock=True)
            # an expired head hands its group to the next notification in this same run
            while expired := [row for row in heads if now - row.created_at > self.max_age]:
                for row in expired:
                    if row.attempts == 0:
                        reason = " (never attempted)"
                    else:
                        tries = f"{row.attempts} attempt{'s' if row.attempts > 1 else ''}"
                        reason = f" after {tries}: {row.last_error or 'no error recorded'}"
                    row.state, row.last_error = "expired", f"not delivered within {self.max_age:g}s{reason}"
                session.flush()
                heads = alert_repository.pending_notification_heads(session, lock=True)
            for row in heads:
                if row.next_attempt_at <= now:
                    due.append((row.id, row.receiver, row.body, row.attempts, row.created_at))
                    row.next_attempt_at = max(now, time.time()) + claims.get(row.receiver, CLAIM_SECONDS)
        return due

    async def run_once(self, now: float | None = None) -> int:
        """Attempt every due group head once; returns how many were delivered."""
        async with self._lock:  # runs never overlap in one process
            now = time.time() if now is None else now
            receivers = await asyncio.to_thread(self.receivers)
            claims = {name: r.timeout + CLAIM_MARGIN for name, r in receivers.items()}
            due = await asyncio.to_thread(self._due, now, claims)
            if not due:
                return 0
            results = await asyncio.gather(*(self._attempt(item, receivers.get(item[1]), now) for item in due))
            return sum(1 for ok in results if ok)

    async def _attempt(self, item: tuple[str, str, str, int, float], receiver: ReceiverConfig | None,
                       now: float) -> bool:
        notification_id, receiver_name, body, attempts, created_at = item
        started = time.time()
        t0 = time.perf_counter()
        status_code, response_text, error = None, None, None
        if receiver is None:
            error = f"receiver {receiver_name!r} no longer exists"
        else:
            if receiver.kind == "alertmanager":
                body = alertmanager_post_at(body, created_at, now)
            raw = body.encode()  # signed as sent
            timestamp = str(int(started))
            headers = {**receiver.headers, "Content-Type": "application/json", "Idempotency-Key": notification_id,
                       TIMESTAMP_HEADER: timestamp}
            secret = self.secret(receiver.secret_env) if receiver.secret_env else None
            if secret:
                headers[SIGNATURE_HEADER] = sign(secret, timestamp, raw)
            url = receiver.url.rstrip("/") + "/api/v2/alerts" if receiver.kind == "alertmanager" else receiver.url
            try:
                assert self._client is not None
                async with self._client.stream("POST", url, content=raw, headers=headers,
                                               timeout=receiver.timeout) as response:
                    status_code, response_text = response.status_code, await _response_head(response)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:RESPONSE_LOG_BYTES]
        latency = time.perf_counter() - t0
        ok = status_code is not None and 200 <= status_code < 300
        if not ok and error is None:
            error = f"HTTP {status_code}"
        await asyncio.to_thread(self._record, notification_id, started, status_code, latency, response_text, error,
                                ok, attempts)
        if self.on_attempt is not None:
            self.on_attempt(receiver_name, ok, latency)
        return ok

    def _record(self, notification_id: str, ts: float, status_code: int | None, latency: float,
                response: str | None, error: str | None, ok: bool, attempts: int) -> None:
        with self.sessions.begin() as session:
            row = session.get(NotificationRow, notification_id)
            if row is None:
                return
            alert_repository.record_attempt(session, row, ts, status_code, latency, response, error)
            if ok:
                row.state, row.delivered_at, row.last_error = "delivered", ts, None
            else:
                backoff = min(self.max_backoff, self.base_backoff * 2 ** attempts)
                row.next_attempt_at = ts + backoff * (0.5 + self._random.random())
                row.last_error = error
