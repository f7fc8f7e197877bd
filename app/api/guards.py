"""ASGI middleware that judges a request before any route reads its body.

FastAPI reads a whole body before it runs a route's dependencies, so the token check of
:func:`app.api.deps.require_token` alone would come after a whole upload was received, and
nothing would bound what a route is handed. These two run first:

* :class:`RequireTokenForWrites` answers 401 to a write (POST, PUT, PATCH, DELETE) under
  ``/api/`` without the configured token, before one byte of its body is read;
* :class:`LimitRequestBody` answers 413 when ``Content-Length`` is over
  ``max_request_bytes``, or, for a body without one (chunked), as soon as the bytes read
  pass it; it stops reading there.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import UNAUTHORIZED, token_accepted
from app.settings import Settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


async def send_error(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """A JSON error shaped like FastAPI's own (``{"detail": ...}``); the connection is closed
    after it, since the unread body cannot be skipped."""
    body = json.dumps({"detail": detail}).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class RequireTokenForWrites:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] in WRITE_METHODS and scope["path"].startswith("/api/")
                and not token_accepted(self.settings, Headers(scope=scope).get("authorization"))):
            await send_error(send, 401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
            return
        await self.app(scope, receive, send)


class LimitRequestBody:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = (f"request body larger than {self.max_bytes} bytes "
                     "(LLM_LATENCY_MAX_REQUEST_BYTES)")
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, 413, too_large)
            return
        # Read the body here, at most max_bytes of it; the route gets it replayed. Routes
        # read whole bodies anyway, so holding one (bounded) costs nothing extra.
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await send_error(send, 413, too_large)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
