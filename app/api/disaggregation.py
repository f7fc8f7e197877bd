"""A target's prefill/decode disaggregation in its latency answer: its role, and for a decode
worker the TTFT assembled across it and its prefill side (the latency API and the status page
show the same numbers from here).

Pairing is the backend's (:meth:`app.windows.base.WindowReader.prefill_of`): a scraped decode
target names its prefill worker in its ``llm_latency_prefill_target`` label; a Prometheus source
pairs the replicas that share its ``pd_pair_labels`` values (the prefill replicas of the
deployment, summed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from app import latency
from app.store.models import Target
from app.windows.base import WindowReader


def add_disaggregation(session: Session, windows: WindowReader, target: Target, report: dict, infos: Iterable[Any],
                       start: float, end: float) -> None:
    """Adds ``pd_role`` (role and what said so) and, for a decode worker with a known prefill
    side, ``disaggregation`` (:func:`app.latency.pd_split`) to a latency ``report``. ``infos``:
    the target's engine configuration. May raise :class:`app.windows.WindowError`."""
    present = {*report, *report.get("rates", {})}
    role = latency.pd_role(infos, present, target.detected_engine or target.engine or "")
    if role is not None:
        report["pd_role"] = role.to_dict()
    found = windows.prefill_of(session, target, start, end, role is not None and role.role == "decode")
    if found is not None:
        names, window = found
        report["disaggregation"] = latency.pd_split(report, latency.report_from_window(window, per_model=False),
                                                    names)
