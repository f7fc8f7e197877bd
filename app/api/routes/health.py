"""Liveness, readiness and the service's own Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from app.api.deps import MonitorDep
from app.api.schemas import Liveness, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness)
def healthz() -> dict[str, str]:
    """The process is alive (no dependencies checked)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, response_model_exclude_unset=True,
            responses={503: {"model": Readiness, "description": "The database does not answer"}})
def readyz(monitor: MonitorDep, response: Response) -> dict[str, str | int]:
    """Ready when the database answers."""
    try:
        with monitor.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "unavailable", "database": f"{type(exc).__name__}: {exc}"[:300]}
    return {"status": "ok", "database": "ok", "targets": len(monitor.scraping.scrapers)}


@router.get("/metrics", include_in_schema=False)
def metrics(monitor: MonitorDep) -> Response:
    return Response(generate_latest(monitor.telemetry.registry), media_type=CONTENT_TYPE_LATEST)
