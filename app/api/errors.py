"""Exception handlers: errors that are the client's or the database's, answered as such
instead of as a 500.

* A validation error whose input was a non-finite number (JSON ``1e999999`` parses to
  infinity) broke FastAPI's own 422 response, which cannot encode infinity in JSON: the
  handler writes such numbers as text, so the 422 names the field as any other.
* A database that cannot be reached (stopped, dropped, connections terminated, pool
  exhausted) is a 503 with ``{"detail": ...}``, which clients and load balancers retry,
  not a 500 or a reset connection. The driver's message stays in the log: it can name
  hosts and SQL.
* A read that ran out of its time budget (:mod:`app.runtime.budget`) is a 503 naming the budget; one
  whose client went away is logged and answered 499 (nobody reads it). A route that answers
  HTML (the status pages) gets the same message as a short HTML page instead of JSON.
"""

from __future__ import annotations

import html
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from app.runtime.budget import BudgetExceeded, ClientGone
from app.store.writer import DatabaseUnavailable
from app.windows import WindowError

log = logging.getLogger(__name__)
DATABASE_ERRORS = (OperationalError, InterfaceError, PoolTimeoutError, DatabaseUnavailable)


def _json_safe(value: Any) -> Any:
    """``value`` with every infinite or NaN float written as text (``"inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


async def validation_error(_: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own 422 body, with non-finite inputs written as text."""
    assert isinstance(exc, RequestValidationError)  # registered for that class only
    return JSONResponse({"detail": _json_safe(jsonable_encoder(exc.errors()))}, status_code=422)


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: database unavailable: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": f"database unavailable ({type(exc).__name__}); retry later"}, status_code=503,
                        headers={"Retry-After": "5"})


def _count_stopped(request: Request, reason: str) -> None:
    monitor = getattr(request.app.state, "monitor", None)
    if monitor is not None:
        monitor.telemetry.requests_stopped.labels(reason).inc()


def _stopped(request: Request, message: str, status_code: int, headers: dict[str, str] | None = None) -> Response:
    """``{"detail": message}``, or for a route that answers HTML (a browser reads it) the same
    message, escaped, as a short page that loads nothing."""
    if getattr(request.scope.get("route"), "response_class", None) is HTMLResponse:
        page = f"<!doctype html><title>{status_code}</title><p>{html.escape(message)}</p>\n"
        return HTMLResponse(page, status_code=status_code, headers={
            **(headers or {}), "Content-Security-Policy": "default-src 'none'", "X-Content-Type-Options": "nosniff"})
    return JSONResponse({"detail": message}, status_code=status_code, headers=headers)


async def budget_exceeded(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BudgetExceeded)  # registered for that class only
    log.warning("%s %s: %s (after %d checks)", request.method, request.url.path, exc, exc.checks)
    _count_stopped(request, "budget")
    return _stopped(request, str(exc), 503, {"Retry-After": "30"})


async def client_gone(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientGone)
    log.info("%s %s: %s", request.method, request.url.path, exc)
    _count_stopped(request, "disconnect")
    return _stopped(request, str(exc), 499)


async def window_error(request: Request, exc: Exception) -> Response:
    """A backend that could not answer for a target (:class:`app.windows.WindowError`): 502 when
    its server failed, 503 when it is no longer configured; the message classifies the fault."""
    assert isinstance(exc, WindowError)
    log.info("%s %s: %s", request.method, request.url.path, exc.message)
    return _stopped(request, exc.message, exc.status)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(WindowError, window_error)
    app.add_exception_handler(BudgetExceeded, budget_exceeded)
    app.add_exception_handler(ClientGone, client_gone)
    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, database_unavailable)
