"""Liveness, readiness and the service's own Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from app.api.deps import MonitorDep
from app.api.schemas import Liveness, Readiness, SourceOut
from app.api.window_notes import source_window_warning
from app.windows.base import SourceStatus

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness)
async def healthz() -> dict[str, str]:
    """The process is alive (no dependencies checked). On the event loop, not in the worker
    threads: it answers while every worker waits for a slow database or Prometheus."""
    return {"status": "ok"}


@router.get("/readyz", response_model=Readiness, response_model_exclude_unset=True,
            responses={503: {"model": Readiness, "description": "The database does not answer"}})
def readyz(monitor: MonitorDep, response: Response) -> dict[str, Any]:
    """Ready when the database answers. ``targets``: those this process scrapes and those its
    Prometheus sources found in their last successful round (replicas and services)."""
    try:
        with monitor.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "unavailable", "database": f"{type(exc).__name__}: {exc}"[:300]}
    statuses = monitor.windows.statuses()
    discovered = sum(s.targets + s.services for s in statuses)
    out: dict[str, Any] = {"status": "ok", "database": "ok", "targets": len(monitor.scraping.scrapers) + discovered}
    if statuses:
        out["sources"] = {s.name: source_state(s) for s in statuses}
    return out


def source_state(s: SourceStatus) -> str:
    if s.failing:
        return f"failing: {s.last_error}"
    return "ok" if s.last_success is not None else "pending"


@router.get("/metrics", include_in_schema=False)
def metrics(monitor: MonitorDep) -> Response:
    return Response(monitor.telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)


@router.get("/api/v1/sources", response_model=list[SourceOut], tags=["sources"])
def list_sources(monitor: MonitorDep) -> list[SourceOut]:
    """Every Prometheus source of the targets YAML: URL (no credentials), last success, last error,
    queries and duration of the last round, how many targets it has, its scrape interval and the
    diagnosis window that follows (with the rules it is too short for), and how many pods lack
    the service labels."""
    return [SourceOut(name=s.name, kind=s.kind, url=s.url, target_labels=s.target_labels,
                      state="failing" if s.failing else source_state(s), last_success=s.last_success,
                      last_error=s.last_error, last_error_at=s.last_error_at,
                      queries_last_round=s.queries_last_round, bytes_last_round=s.bytes_last_round,
                      buckets_last_round=s.buckets_last_round, last_round_seconds=s.last_round_seconds,
                      targets=s.targets, services=s.services, down=s.down, gone=s.gone, bad_series=s.bad_series,
                      refused_answers=s.refused, scrape_interval=s.scrape_interval, held_series=s.held_series,
                      held_refreshed_at=s.held_refreshed_at, held_note=s.held_note,
                      native_histograms=s.native_histograms,
                      scrape_interval_from=s.scrape_interval_origin or None,
                      scrape_interval_note=s.scrape_interval_note, diagnosis_window=s.diagnosis_window,
                      window_note=s.window_note, window_warning=source_window_warning(monitor, s),
                      pods_without_service_labels=s.unlabelled, missing_service_labels=s.unlabelled_by_label)
            for s in monitor.windows.statuses()]
