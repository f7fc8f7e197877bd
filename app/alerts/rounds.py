"""The alerting round: conditions -> alert states -> outbox rows, in one transaction.

Run by the scheduler every ``alert_interval`` (and by tests with an explicit ``now``); the
outbox is delivered separately (:mod:`app.alerts.delivery`), so a slow receiver never holds
up a round.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from app.alerts import engine as alerts_engine
from app.alerts.config import AlertsConfig, ReceiverConfig
from app.store import repository

if TYPE_CHECKING:  # the telemetry sits above the features whose numbers it exports
    from app.telemetry import Telemetry


def load_receivers(sessions: sessionmaker[Session]) -> dict[str, ReceiverConfig]:
    """The configured receivers by name, as stored (config file and API)."""
    with sessions() as session:
        return {row.name: ReceiverConfig.model_validate(row.config) for row in repository.list_receivers(session)}


def evaluate_alerts(sessions: sessionmaker[Session], config: AlertsConfig, *, generator_url: str,
                    eval_interval: float, telemetry: Telemetry | None = None,
                    now: float | None = None) -> dict[str, int]:
    """One alerting round; returns the numbers of conditions and of notifications written.
    ``generator_url`` is this service's alerts page, the ``generatorURL`` of every alert;
    the open alerts and the notification count go to ``telemetry`` for ``/metrics``."""
    now = time.time() if now is None else now
    receivers = list(load_receivers(sessions).values())
    with sessions.begin() as session:
        result = alerts_engine.evaluate(session, config, receivers, now, generator_url=generator_url,
                                        eval_interval=eval_interval)
        open_alerts = [(row.alertname, row.labels.get("target", ""), row.labels.get("severity", ""), row.state)
                       for row in repository.open_alerts(session)]
    if telemetry is not None:
        telemetry.diagnosis.alerts = open_alerts
        telemetry.alert_notifications.inc(result["notifications"])
    return result
