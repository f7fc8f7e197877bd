"""Helpers every route module shares: FastAPI-shaped 422s, duration and time-range query
parameters, a target looked up by name or 404, the current diagnoses (JSON API and status
page), answers serialized in the request's thread. One module, so a route module imports these
rather than another route module."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Response, status
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from app.core.durations import parse_duration
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.findings import runbook_link
from app.store.models import Target
from app.targets import repository as target_repository

if TYPE_CHECKING:
    from app.lifespan import Monitor


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors, naming the field."""
    return HTTPException(422,
                         [{"loc": field.split("."), "msg": message, "type": "value_error"}])


def unprocessable_from(exc: ValidationError) -> HTTPException:
    """The first error of a body validated by hand, as the same 422 (``body.<field>``)."""
    first = exc.errors()[0]
    field = ".".join(["body", *map(str, first["loc"])])
    return unprocessable(field, first["msg"].removeprefix("Value error, "))


#: The longest window a read may ask for, by ``window`` or by ``start``/``end``: a month, the longest
#: the dashboards and status pages show; a longer range would make a Prometheus source read years.
MAX_WINDOW = 31 * 86400.0


def duration_param(value: str, name: str, minimum: float = 1.0, maximum: float = MAX_WINDOW) -> float:
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
    if end - start > MAX_WINDOW:
        raise unprocessable("query.start", f"the range is {end - start:g}s; at most {MAX_WINDOW:g}s (31 days) may be "
                                           "read at once")
    return end - start, end


def response_json(adapter: TypeAdapter[Any], value: Any, *, exclude_unset: bool = False) -> bytes:
    """The JSON FastAPI makes of ``value`` for a ``response_model``: validated, then dumped by alias."""
    return adapter.dump_json(adapter.validate_python(value), exclude_unset=exclude_unset, by_alias=True)


def serialized(adapter: TypeAdapter[Any], value: Any, *, exclude_unset: bool = False) -> Response:
    """:func:`response_json` as the answer, made here in the request's worker thread: FastAPI
    validates a sync endpoint's return in a worker thread but dumps it on the event loop, where
    a large answer would hold up the scrapes and every other request."""
    return Response(response_json(adapter, value, exclude_unset=exclude_unset), media_type="application/json")


def get_or_404(session: Session, name: str) -> Target:
    target = target_repository.get_target(session, name)
    if target is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"target {name!r} not found")
    return target


def current_diagnoses(session: Session, monitor: Monitor, target_id: int | None = None) -> list[dict[str, Any]]:
    """The latest evaluation of every target and model (of ``target_id`` only, when given), each
    finding with its lifecycle state: the answer of ``GET /api/v1/diagnoses`` and what the status
    page shows."""
    return [diagnosis_out(*made) for _, made in diagnosis_sources(session, monitor, target_id)]


DiagnosisMade = tuple[diagnosis_repository.LatestDiagnosis, "FindingStates", str]


def diagnosis_sources(session: Session, monitor: Monitor,
                      target_id: int | None = None) -> list[tuple[tuple, DiagnosisMade]]:
    """What each current diagnosis is made of, with the key that stands for all of it (the
    stored row and the version of its details, its findings' states, the runbook base): the answer's parts are kept
    by that key (:class:`app.runtime.kept.KeptParts`)."""
    base = monitor.external_url
    open_states = diagnosis_repository.open_finding_states(session, target_id)
    out = []
    for row in diagnosis_repository.latest_diagnoses(session, target_id):
        states = finding_states(row, open_states)
        out.append(((row.target, row.model, row.verdict, row.evaluated_at, row.version, states, base),
                    (row, states, base)))
    return out


FindingStates = tuple[tuple[str, float | None], ...]


def finding_states(row: diagnosis_repository.LatestDiagnosis,
                   open_states: dict[tuple[str, str, str], tuple[str, float | None]]) -> FindingStates:
    """(state, active since) of each of the diagnosis' findings, in order; ``pending`` for one
    the finding table does not hold open."""
    return tuple(open_states.get((row.target, row.model, f["regime"]), ("pending", None))
                 for f in row.details.get("findings", []))


def diagnosis_out(row: diagnosis_repository.LatestDiagnosis, states: FindingStates, base: str) -> dict[str, Any]:
    """One diagnosis as the API answers it: its stored details and its findings' states."""
    details = row.details
    findings = [{**finding, "state": state, "active_since": active_since,
                 "runbook_url": runbook_link(finding["regime"], base)}
                for finding, (state, active_since) in zip(details.get("findings", []), states, strict=True)]
    return {"target": row.target, "model": row.model, "engine": details.get("engine"), "verdict": row.verdict,
            "active": [f["regime"] for f in findings if f["state"] == "active"],
            "evaluated_at": row.evaluated_at, "window": details.get("window"), "findings": findings,
            "notes": details.get("notes", []), "signals": details.get("signals", {}),
            "not_judged": details.get("not_judged", [])}
