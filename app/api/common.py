"""Helpers every route module shares: FastAPI-shaped 422s, duration and time-range query
parameters, and a target looked up by name or 404. One module, so a route module imports
these rather than another route module."""

from __future__ import annotations

import time

from fastapi import HTTPException, status
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.durations import parse_duration
from app.store import repository
from app.store.models import Target


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(422,
                         [{"loc": field.split("."), "msg": message, "type": "value_error"}])


def unprocessable_from(exc: ValidationError) -> HTTPException:
    """The first error of a body validated by hand, as the same 422 (``body.<field>``)."""
    first = exc.errors()[0]
    field = ".".join(["body", *map(str, first["loc"])])
    return unprocessable(field, first["msg"].removeprefix("Value error, "))


def duration_param(value: str, name: str, minimum: float = 1.0, maximum: float = 31 * 86400) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise unprocessable(f"query.{name}", str(exc)) from None
    if not minimum <= seconds <= maximum:
        raise unprocessable(f"query.{name}", f"must be between {minimum:g}s and {maximum:g}s, got {value!r}")
    return seconds


def time_range(window: str, start: float | None, end: float | None) -> tuple[float, float]:
    """(window seconds, end) from either ``window`` (+ optional ``end``) or explicit ``start``/``end``."""
    end = end if end is not None else time.time()
    if start is None:
        return duration_param(window, "window"), end
    if not start < end:
        raise unprocessable("query.start", f"must be before end ({start} >= {end})")
    return end - start, end


def get_or_404(session: Session, name: str) -> Target:
    target = repository.get_target(session, name)
    if target is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"target {name!r} not found")
    return target
