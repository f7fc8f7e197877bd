"""The capacity signal: replicas each target or service needs for its load (:mod:`app.diagnosis.capacity`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.common import current_diagnoses, get_or_404
from app.api.deps import MonitorDep, SessionDep
from app.api.schemas import CapacityOut
from app.diagnosis import capacity
from app.targets import repository as target_repository

router = APIRouter(prefix="/api/v1", tags=["diagnosis"])


@router.get("/capacity", response_model=list[CapacityOut])
def list_capacity(session: SessionDep, monitor: MonitorDep,
                  target: Annotated[str | None, Query(description="one target or service by name")] = None
                  ) -> list[capacity.Capacity]:
    """From the latest diagnosis of every present target and model: the replicas the load needs
    (``desired_replicas``) and whether more replicas are the answer (``scaling_helps``, with the
    verdict that decided as ``reason``), raised to one more replica while an SLO on the target
    burns its budget (the latest alerting round's burn rates). The same numbers as
    ``llm_latency_capacity_*`` on ``/metrics``."""
    target_id = get_or_404(session, target).id if target else None
    gone = {t.name for t in target_repository.list_targets(session) if t.gone_at is not None}
    return [c for c in capacity.assess_all(current_diagnoses(session, monitor, target_id),
                                           monitor.diagnosis_config.thresholds, monitor.telemetry.slo.statuses)
            if c.target not in gone]
