"""The alerting round: conditions -> alert states -> outbox rows, in one transaction (after
the ``slos:`` increments are recorded, in one of their own).

Run by the scheduler every ``alert_interval`` (and by tests with an explicit ``now``); the
outbox is delivered separately (:mod:`app.alerts.delivery`), so a slow receiver never holds
up a round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import Counter
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from app.alerts import engine as alerts_engine
from app.alerts import repository as alert_repository
from app.alerts.config import AlertsConfig, ReceiverConfig
from app.diagnosis.telemetry import DiagnosisCollector
from app.slo.config import SloObjective
from app.slo.record import record_increments
from app.slo.status import slo_statuses
from app.slo.telemetry import SloCollector
from app.store import db
from app.windows import default_windows
from app.windows.base import WindowReader

log = logging.getLogger(__name__)

class AlertTelemetry(Protocol):
    """What the alerting round exports (:class:`app.telemetry.Telemetry`, which sits above the
    features whose numbers it exports)."""

    slo: SloCollector
    diagnosis: DiagnosisCollector
    alert_notifications: Counter


def load_receivers(sessions: sessionmaker[Session]) -> dict[str, ReceiverConfig]:
    """The configured receivers by name, as stored (config file and API)."""
    with sessions() as session:
        return {row.name: ReceiverConfig.model_validate(row.config) for row in alert_repository.list_receivers(session)}


def evaluate_alerts(sessions: sessionmaker[Session], config: AlertsConfig, *, generator_url: str,
                    eval_interval: float, telemetry: AlertTelemetry | None = None,
                    now: float | None = None, windows: WindowReader | None = None,
                    slos: Sequence[SloObjective] = (), retention: float = 7 * 86400.0,
                    what_changed: alerts_engine.WhatChanged | None = None) -> dict[str, int]:
    """One alerting round; returns the numbers of conditions and of notifications written.
    ``generator_url`` is this service's alerts page, the ``generatorURL`` of every alert;
    the open alerts and the notification count go to ``telemetry`` for ``/metrics``.
    ``slos`` (the ``slos:`` section): the round first records their increments
    (app/slo/record.py, reading back ``retention`` the first time), then their burn-rate
    alerts read the same :class:`~app.slo.status.SloStatus` the API and ``/metrics`` show.
    ``what_changed``: an alert firing carries its target's attribution (``what_changed``)."""
    now = time.time() if now is None else now
    receivers = list(load_receivers(sessions).values())
    reads = windows if windows is not None else default_windows()
    with sessions() as session:  # read before the round's transaction: a backend may be slow to answer
        slo_reads, held = alerts_engine.slo_histograms(session, config, now, reads)
    source_sums, source_errors = reads.slo_sums(sessions, slos, now) if slos else ({}, {})
    if slos:
        # The recording first, in a transaction of its own: one that fails (another instance
        # wrote the same rows) must not stop alerting. It reads and then writes, so it holds
        # the write lock from its start on SQLite; the alert round's reads below do not.
        try:
            with db.write_transaction(sessions) as session:
                record_increments(session, slos, now, retention)
        except SQLAlchemyError:
            log.warning("recording the SLO increments failed; SLOs use what is recorded", exc_info=True)
    with sessions.begin() as session:
        statuses = slo_statuses(session, slos, now, retention, source_sums, source_errors)
        result = alerts_engine.evaluate(session, config, receivers, now, generator_url=generator_url,
                                        eval_interval=eval_interval, slo_reads=slo_reads,
                                        held_targets=held, slo_statuses=statuses, what_changed=what_changed)
        open_alerts = [(row.alertname, row.labels.get("target", ""), row.labels.get("severity", ""), row.state)
                       for row in alert_repository.open_alerts(session)]
    if telemetry is not None:
        telemetry.slo.statuses = statuses
        telemetry.diagnosis.alerts = open_alerts
        telemetry.alert_notifications.inc(result["notifications"])
    return result
