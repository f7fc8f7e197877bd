"""A target's prefill/decode disaggregation in its latency answer: its role, and for a decode
worker the TTFT assembled across it and its prefill side (the latency API and the status page
show the same numbers from here).

Pairing: a scraped decode target names its prefill worker in its ``llm_latency_prefill_target``
label; a Prometheus source pairs the replicas that share its ``pd_pair_labels`` values (the
prefill replicas of the deployment, summed; :meth:`app.promsource.service.SourceService.prefill_of`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from app import latency
from app.lifespan import Monitor
from app.promsource.service import DISCOVERED_BY_SOURCES
from app.store import repository
from app.store.models import Target


def add_disaggregation(session: Session, monitor: Monitor, target: Target, report: dict, infos: Iterable[Any],
                       start: float, end: float) -> None:
    """Adds ``pd_role`` (role and what said so) and, for a decode worker with a known prefill
    side, ``disaggregation`` (:func:`app.latency.pd_split`) to a latency ``report``. ``infos``:
    the target's engine configuration. A discovered target's source may raise PromAPIError."""
    present = {*report, *report.get("rates", {})}
    role = latency.pd_role(infos, present, target.detected_engine or target.engine or "")
    if role is not None:
        report["pd_role"] = role.to_dict()
    if target.source in DISCOVERED_BY_SOURCES:
        found = monitor.sources.prefill_of(session, target, start, end) \
            if role is not None and role.role == "decode" else None
        if found is not None:
            names, window = found
            report["disaggregation"] = latency.pd_split(report, latency.report_from_window(window, per_model=False),
                                                        names)
        return
    prefill_name = (target.labels or {}).get(latency.PD_PREFILL_LABEL)
    prefill = repository.get_target(session, prefill_name) if prefill_name else None
    if prefill is not None:
        prefill_report = latency.latency_report(session, [prefill.id], end - start, end, per_model=False)
        report["disaggregation"] = latency.pd_split(report, prefill_report, [prefill.name])
