"""Diagnoses: the current verdict per target/model, the finding history."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import TypeAdapter

from app.api.common import (
    DiagnosisMade,
    current_diagnoses,
    diagnosis_out,
    diagnosis_sources,
    duration_param,
    get_or_404,
    response_json,
    time_range,
)
from app.api.deps import BudgetDep, MonitorDep, SessionDep
from app.api.schemas import DiagnosisOut, FindingRecordOut
from app.core.limits import UnixTime
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis.findings import runbook_link
from app.diagnosis.profile import HardwareProfile
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.runtime.budget import bounded
from app.runtime.kept import KeptParts
from app.store.db import statement_budget
from app.store.models import FindingRow, known_engine

router = APIRouter(prefix="/api/v1", tags=["diagnosis"])


def finding_out(target: str, row: FindingRow, base_url: str) -> dict:
    return {
        "id": row.id, "target": target, "model": row.model, "regime": row.regime, "state": row.state,
        "severity": row.severity, "confidence": row.confidence, "primary": row.is_primary, "summary": row.summary,
        "evidence": row.details.get("evidence", []), "remedies": row.details.get("remedies", []),
        "caused_by": row.details.get("caused_by"), "window": row.details.get("window"),
        "runbook_url": runbook_link(row.regime, base_url),
        "first_seen": row.first_seen, "last_seen": row.last_seen, "activated_at": row.activated_at,
        "resolved_at": row.resolved_at,
    }


DIAGNOSIS_OUT = TypeAdapter(DiagnosisOut)
#: each diagnosis' JSON by everything it is made of (see :func:`list_diagnoses`)
DIAGNOSIS_JSON = KeptParts[tuple, DiagnosisMade, bytes](
    lambda made: response_json(DIAGNOSIS_OUT, diagnosis_out(*made), exclude_unset=True))


@router.get("/diagnoses", response_model=list[DiagnosisOut], response_model_exclude_unset=True)
def list_diagnoses(session: SessionDep, monitor: MonitorDep) -> Response:
    """The latest evaluation of every target and model. A finding's ``state`` is
    ``pending`` until it has held for ``activate_after`` evaluations, then ``active``.

    A diagnosis changes once per diagnosis round, so each one's JSON (FastAPI's bytes for it) is
    kept by what it is made of - the stored row and text, its findings' states and the runbook
    base - rather than validated and serialized for every read. The list is those joined, as
    pydantic writes a list."""
    parts = DIAGNOSIS_JSON.parts(diagnosis_sources(session, monitor))
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")


@router.get("/diagnoses/history", response_model=list[FindingRecordOut])
def diagnosis_history(session: SessionDep, monitor: MonitorDep, target: str | None = None,
                      since: Annotated[str, Query(description="e.g. 1h, 7d")] = "1d",
                      limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> list[dict]:
    """Findings that were pending, active or resolved in the period, newest first."""
    target_id = get_or_404(session, target).id if target else None
    start = time.time() - duration_param(since, "since", maximum=366 * 86400)
    base = monitor.external_url
    return [finding_out(name, row, base) for name, row in
            diagnosis_repository.finding_history(session, target_id, since=start, limit=limit)]


@router.get("/targets/{name}/diagnosis", response_model=list[DiagnosisOut], response_model_exclude_unset=True)
def target_diagnosis(name: str, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
                     window: Annotated[str | None, Query(description="evaluate now over this window (no lifecycle); "
                                                                      "default: latest scheduled")] = None,
                     start: Annotated[UnixTime | None, Query(description="unix seconds; with end, evaluate now "
                                                                      "over exactly [start, end]")] = None,
                     end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None
                     ) -> list[dict]:
    """The latest scheduled diagnosis, or (``window`` or ``start``) one evaluated now over that
    range without touching the finding lifecycle. ``start`` exists because a window in
    milliseconds rounds: a range meant to begin at a scrape would begin just after it and
    the first increase would be extrapolated."""
    target = get_or_404(session, name)
    if window is None and start is None:
        return current_diagnoses(session, monitor, target.id)
    seconds, end = time_range(window or "5m", start, end)
    hardware = HardwareProfile.model_validate(target.hardware) if target.hardware else None
    engine = known_engine(target) or "vllm"
    with bounded(budget), statement_budget(session, budget):
        data = monitor.windows.window(session, target, end - seconds, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
        diagnoses = diagnosis_engine.evaluate_target(session, target.id, name, engine, end, seconds,
                                                     monitor.diagnosis_config.thresholds_for(name), hardware, data=data)
    return [d.to_dict() for d in diagnoses]
