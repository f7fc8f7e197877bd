"""Alerts, silences, receivers and the delivery log."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.alerts import repository as alert_repository
from app.alerts.config import ReceiverConfig
from app.alerts.schemas import AlertInstance, group_key, notification_body, rfc3339
from app.alerts.silences import MatcherError, check_budget, parse_matcher, silenced_by
from app.api.common import duration_param, unprocessable, unprocessable_from
from app.api.deps import MonitorDep, SessionDep, TokenHolderDep, WriteAuth
from app.api.redaction import fetched_text, header_names
from app.api.schemas import (
    AlertOut,
    NotificationOut,
    QueuedNotification,
    ReceiverOut,
    SilenceOut,
)
from app.core.durations import format_utc
from app.core.limits import MAX_MATCHERS, MAX_UNIX_TIME, UnixTime
from app.core.urls import validate_target_url

router = APIRouter(prefix="/api/v1", tags=["alerts"])


def alert_out(row, silences, told: dict[str, list[str]], now: float) -> dict:
    """``notifiedFiring``: the receivers last told this alert is firing (``told``: fingerprint
    -> receivers). A pending alert shows no startsAt/endsAt (the row keeps those of its last
    episode that fired until it fires again)."""
    fired = row.state != "pending"
    return {"fingerprint": row.fingerprint, "alertname": row.alertname, "state": row.state, "labels": row.labels,
            "annotations": row.annotations, "value": row.value, "activeSince": rfc3339(row.active_since),
            "startsAt": rfc3339(row.starts_at) if fired and row.starts_at else None,
            "endsAt": rfc3339(row.ends_at) if fired and row.ends_at else None, "groupKey": row.group_key,
            "silencedBy": silenced_by(silences, row.labels, now), "notifiedFiring": told.get(row.fingerprint, [])}


@router.get("/alerts", response_model=list[AlertOut])
def list_alerts(session: SessionDep, state: Annotated[str | None, Query(description="pending|firing|resolved")] = None,
                since: Annotated[str, Query(description="resolved alerts seen within this period")] = "1d") -> list:
    """Active alerts (pending and firing) and the recently resolved ones."""
    now = time.time()
    states = ("pending", "firing", "resolved") if state is None else (state,)
    if state is not None and state not in ("pending", "firing", "resolved"):
        raise unprocessable("query.state", f"must be pending, firing or resolved, got {state!r}")
    cutoff = now - duration_param(since, "since", maximum=366 * 86400)
    silences = alert_repository.active_silences(session, now)
    told: dict[str, list[str]] = {}
    for (receiver, _), log in sorted(alert_repository.notification_logs(session).items()):
        for fp in log.firing:
            told.setdefault(fp, []).append(receiver)
    rows = [r for r in alert_repository.list_alerts(session,
                                                    states) if r.state != "resolved" or r.last_evaluated >= cutoff]
    return [alert_out(r, silences, told, now) for r in rows]


class SilenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    matchers: list[str | dict[str, Any]] = Field(min_length=1, max_length=MAX_MATCHERS,
                                                 description='e.g. ["target=\\"vllm-a\\"", '
                                                             '"alertname=~\\"LLMLatency.*\\""]')
    startsAt: UnixTime | None = Field(None, description="unix seconds; default now")
    endsAt: UnixTime | None = Field(None, description="unix seconds; or give duration")
    duration: str | None = Field(None, description="e.g. 2h")
    createdBy: str = Field(min_length=1, max_length=128)
    comment: str = Field(min_length=1, max_length=2000)


def silence_out(row, now: float) -> dict:
    state = "expired" if row.ends_at <= now else ("active" if row.starts_at <= now else "pending")
    return {"id": row.id, "matchers": row.matchers, "startsAt": rfc3339(row.starts_at), "endsAt": rfc3339(row.ends_at),
            "createdBy": row.created_by, "comment": row.comment, "status": {"state": state}}


@router.post("/silences", response_model=SilenceOut, status_code=status.HTTP_201_CREATED, dependencies=[WriteAuth])
def create_silence(body: SilenceIn, session: SessionDep) -> dict:
    now = time.time()
    matchers = []
    for index, item in enumerate(body.matchers):
        try:
            matchers.append(parse_matcher(item))
        except MatcherError as exc:
            raise unprocessable(f"body.matchers.{index}", str(exc)) from None
    try:
        check_budget((row.matchers for row in alert_repository.list_silences(session) if row.ends_at > now), matchers)
    except MatcherError as exc:
        raise unprocessable("body.matchers", str(exc)) from None
    starts = body.startsAt if body.startsAt is not None else now
    if body.endsAt is not None and body.duration is not None:
        raise unprocessable("body.duration", "give endsAt or duration, not both")
    if body.endsAt is not None:
        ends = body.endsAt
    elif body.duration is not None:
        ends = starts + duration_param(body.duration, "duration", maximum=366 * 86400)
    else:
        raise unprocessable("body.endsAt", "give endsAt or duration")
    if ends <= starts:
        raise unprocessable("body.endsAt", "must be after startsAt")
    if ends > MAX_UNIX_TIME:
        raise unprocessable("body.duration" if body.duration is not None else "body.endsAt",
                            f"the silence would end after {format_utc(MAX_UNIX_TIME)}")
    row = alert_repository.create_silence(session, str(uuid.uuid4()), matchers, starts, ends, body.createdBy,
                                          body.comment,
                                    now)
    session.commit()
    return silence_out(row, now)


@router.get("/silences", response_model=list[SilenceOut])
def list_silences(session: SessionDep) -> list:
    now = time.time()
    return [silence_out(r, now) for r in alert_repository.list_silences(session)]


@router.get("/silences/{silence_id}", response_model=SilenceOut)
def get_silence(silence_id: str, session: SessionDep) -> dict:
    row = alert_repository.get_silence(session, silence_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"silence {silence_id!r} not found")
    return silence_out(row, time.time())


@router.delete("/silences/{silence_id}", response_model=SilenceOut, dependencies=[WriteAuth])
def expire_silence(silence_id: str, session: SessionDep) -> dict:
    """Expire a silence now (it stays listed, as in Alertmanager)."""
    row = alert_repository.get_silence(session, silence_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"silence {silence_id!r} not found")
    now = time.time()
    row.ends_at = min(row.ends_at, now)
    session.commit()
    return silence_out(row, now)


def receiver_out(row) -> dict:
    """A receiver as the API shows it: header values redacted (app.api.redaction)."""
    config = dict(row.config)
    config["headers"] = header_names(config.get("headers") or {})
    config["has_secret"] = bool(config.get("secret_env"))
    return {**config, "source": row.source}


@router.get("/receivers", response_model=list[ReceiverOut])
def list_receivers(session: SessionDep) -> list:
    return [receiver_out(r) for r in alert_repository.list_receivers(session)]


@router.post("/receivers", response_model=ReceiverOut, status_code=status.HTTP_201_CREATED, dependencies=[WriteAuth])
def create_receiver(body: dict[str, Any], session: SessionDep, monitor: MonitorDep) -> dict:
    try:
        receiver = ReceiverConfig.model_validate(body)
    except ValidationError as exc:
        raise unprocessable_from(exc) from None
    try:
        validate_target_url(receiver.url, monitor.settings.allowed_target_hosts)
    except ValueError as exc:
        raise unprocessable("body.url", str(exc)) from None
    if alert_repository.get_receiver(session, receiver.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"receiver {receiver.name!r} already exists")
    row = alert_repository.save_receiver(session, receiver.name, receiver.model_dump(mode="json"), "api", time.time())
    session.commit()
    return receiver_out(row)


@router.delete("/receivers/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[WriteAuth])
def delete_receiver(name: str, session: SessionDep) -> None:
    row = alert_repository.get_receiver(session, name)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"receiver {name!r} not found")
    if row.source == "config":
        raise HTTPException(status.HTTP_409_CONFLICT, f"receiver {name!r} comes from the config file; remove it there")
    alert_repository.delete_receiver(session, row)
    session.commit()


@router.post("/receivers/{name}/test", response_model=QueuedNotification, status_code=status.HTTP_202_ACCEPTED,
             dependencies=[WriteAuth])
def test_receiver(name: str, session: SessionDep, monitor: MonitorDep) -> dict:
    """Queue a test notification (a firing ``LLMLatencyTestNotification``) through the outbox."""
    row = alert_repository.get_receiver(session, name)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"receiver {name!r} not found")
    receiver = ReceiverConfig.model_validate(row.config)
    now = time.time()
    labels = {"alertname": "LLMLatencyTestNotification", "severity": "info"}
    instance = AlertInstance(labels, {"summary": "Test notification from LLM Latency Monitor",
                                      "description": "If you can read this, the receiver works."}, "firing", now, None,
                             monitor.settings.public_url)
    group_labels = {"alertname": labels["alertname"]}
    status_text, body = notification_body(receiver.kind, name, group_labels, [instance],
                                          monitor.alerts_config.external_url)
    notification = alert_repository.enqueue_notification(session, str(uuid.uuid4()), name, group_key(group_labels),
                                                   status_text, body, now)
    session.commit()
    return {"notification": notification.id, "state": notification.state}


@router.get("/notifications", response_model=list[NotificationOut])
def list_notifications(session: SessionDep, token_holder: TokenHolderDep, receiver: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list:
    """The delivery log: every notification with all its attempts. An attempt's ``response``
    (the start of the receiver's answer) is shown only to a request carrying the API token."""
    rows = alert_repository.list_notifications(session, receiver, limit)
    attempts = alert_repository.attempts_of(session, [r.id for r in rows])
    return [{"id": r.id, "receiver": r.receiver, "groupKey": r.group_key, "seq": r.seq, "status": r.status,
             "state": r.state, "attempts": r.attempts, "createdAt": r.created_at, "deliveredAt": r.delivered_at,
             "nextAttemptAt": r.next_attempt_at if r.state == "pending" else None, "lastError": r.last_error,
             "attemptLog": [{"attempt": a.attempt, "ts": a.ts, "statusCode": a.status_code, "latency": a.latency,
                             "response": fetched_text(a.response, token_holder), "error": a.error}
                            for a in attempts.get(r.id, [])]}
            for r in rows]
