"""Alerting's SQL: alerts, silences, the notification outbox and its attempts and log, and
the receivers. Callers own the transaction boundary."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Text,
    cast,
    delete,
    func,
    select,
)
from sqlalchemy.orm import Session

from app.store.models import (
    AlertRow,
    DeliveryAttemptRow,
    NotificationLogRow,
    NotificationRow,
    ReceiverRow,
    SilenceRow,
)

log = logging.getLogger(__name__)


def open_alerts(session: Session) -> list[AlertRow]:
    return list(session.scalars(select(AlertRow).where(AlertRow.state.in_(("pending", "firing")))))


def get_alerts(session: Session, fps: Sequence[str]) -> dict[str, AlertRow]:
    """The alerts with these fingerprints, by fingerprint, in one query per 500 (a round where
    hundreds of conditions start at once reads them together, not one by one)."""
    out: dict[str, AlertRow] = {}
    for i in range(0, len(fps), 500):
        out.update((row.fingerprint, row) for row in
                   session.scalars(select(AlertRow).where(AlertRow.fingerprint.in_(fps[i:i + 500]))))
    return out


def start_alert(session: Session, row: AlertRow | None, fp: str, labels: dict[str, str], annotations: dict[str, str],
                gk: str, now: float, value: float | None) -> AlertRow:
    """A condition became true: a new pending alert (or a resolved one starts a new episode)."""
    if row is None:
        row = AlertRow(fingerprint=fp)
        session.add(row)
    row.alertname, row.labels, row.annotations, row.group_key = labels["alertname"], labels, annotations, gk
    # starts_at/ends_at keep the last episode that fired until this one fires: a receiver
    # not yet told about that resolution still gets it with its real times
    row.state, row.active_since, row.last_evaluated, row.value = "pending", now, now, value
    return row


def delete_alert(session: Session, row: AlertRow) -> None:
    session.delete(row)


def notifiable_alerts(session: Session, told_firing: set[str]) -> list[AlertRow]:
    """Firing alerts, and the ones some receiver was told are firing (``told_firing``
    fingerprints) that no longer are: their resolution is still to be sent."""
    wanted = AlertRow.state == "firing"
    if told_firing:
        wanted = wanted | AlertRow.fingerprint.in_(sorted(told_firing))
    return list(session.scalars(select(AlertRow).where(wanted).order_by(AlertRow.fingerprint)))


def list_alerts(session: Session, states: tuple[str, ...] = ("pending", "firing", "resolved"),
                since: float | None = None) -> list[AlertRow]:
    query = select(AlertRow).where(AlertRow.state.in_(states))
    if since is not None:
        query = query.where(AlertRow.last_evaluated >= since)
    return list(session.scalars(query.order_by(AlertRow.active_since.desc())))


def active_silences(session: Session, now: float) -> list[SilenceRow]:
    return list(session.scalars(select(SilenceRow).where(SilenceRow.starts_at <= now, SilenceRow.ends_at > now)))


def list_silences(session: Session) -> list[SilenceRow]:
    return list(session.scalars(select(SilenceRow).order_by(SilenceRow.created_at.desc())))


def create_silence(session: Session, silence_id: str, matchers: list[dict[str, Any]], starts_at: float, ends_at: float,
                   created_by: str, comment: str, now: float) -> SilenceRow:
    row = SilenceRow(id=silence_id, matchers=matchers, starts_at=starts_at, ends_at=ends_at, created_by=created_by,
                     comment=comment, created_at=now)
    session.add(row)
    session.flush()
    return row


def get_silence(session: Session, silence_id: str) -> SilenceRow | None:
    return session.get(SilenceRow, silence_id)


def notification_logs(session: Session) -> dict[tuple[str, str], NotificationLogRow]:
    """Every (receiver, group) -> what that receiver was last told about that group."""
    return {(row.receiver, row.group_key): row for row in session.scalars(select(NotificationLogRow))}


def save_notification_log(session: Session, row: NotificationLogRow | None, receiver: str, gk: str,
                          firing: list[str], sent_at: float) -> NotificationLogRow:
    if row is None:
        row = NotificationLogRow(receiver=receiver, group_key=gk)
        session.add(row)
    row.firing, row.sent_at = firing, sent_at
    return row


def delete_notification_logs(session: Session, keep_receivers: Sequence[str], idle_before: float) -> None:
    """Forget receivers that no longer exist (a receiver added again starts afresh), and
    groups a receiver was last told have nothing firing, told before ``idle_before``.

    Such a row plans exactly like no row once ``group_interval`` has passed since it was
    sent (the caller's ``idle_before``): any firing alert is news for it and is due at
    once. Kept, every group ever seen would stay forever and be loaded every round. A row
    that still lists a firing alert stays, whatever its age: its resolution is still to
    be sent."""
    session.execute(delete(NotificationLogRow).where(NotificationLogRow.receiver.not_in(list(keep_receivers))))
    session.execute(delete(NotificationLogRow).where(cast(NotificationLogRow.firing, Text) == "[]",
                                                     NotificationLogRow.sent_at <= idle_before))


def has_pending_notification(session: Session, receiver: str, gk: str) -> bool:
    return session.scalar(select(NotificationRow.id).where(
        NotificationRow.receiver == receiver, NotificationRow.group_key == gk, NotificationRow.state == "pending")
        .limit(1)) is not None


def enqueue_notification(session: Session, notification_id: str, receiver: str, gk: str, status: str, body: str,
                         now: float) -> NotificationRow:
    seq = (session.scalar(select(func.max(NotificationRow.seq)).where(
        NotificationRow.receiver == receiver, NotificationRow.group_key == gk)) or 0) + 1
    row = NotificationRow(id=notification_id, receiver=receiver, group_key=gk, seq=seq, status=status, body=body,
                          state="pending", attempts=0, created_at=now, next_attempt_at=now)
    session.add(row)
    session.flush()
    return row


def pending_notification_heads(session: Session, lock: bool = False) -> list[NotificationRow]:
    """The oldest pending notification of every (receiver, group): delivery order within a
    group is kept by only ever attempting its head. ``lock`` takes row locks on PostgreSQL
    (``FOR UPDATE SKIP LOCKED``) so two delivery workers never claim the same row."""
    query = (select(NotificationRow).where(NotificationRow.state == "pending")
             .order_by(NotificationRow.receiver, NotificationRow.group_key, NotificationRow.seq))
    if lock and session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    rows = session.scalars(query)
    heads: dict[tuple[str, str], NotificationRow] = {}
    for row in rows:
        heads.setdefault((row.receiver, row.group_key), row)
    return list(heads.values())


def record_attempt(session: Session, row: NotificationRow, ts: float, status_code: int | None, latency: float,
                   response: str | None, error: str | None) -> None:
    row.attempts += 1
    session.add(DeliveryAttemptRow(notification_id=row.id, attempt=row.attempts, ts=ts, status_code=status_code,
                                   latency=latency, response=response, error=error))


def list_notifications(session: Session, receiver: str | None = None, limit: int = 100) -> list[NotificationRow]:
    query = select(NotificationRow)
    if receiver is not None:
        query = query.where(NotificationRow.receiver == receiver)
    return list(session.scalars(query.order_by(NotificationRow.created_at.desc(), NotificationRow.seq.desc())
                                .limit(limit)))


def attempts_of(session: Session, notification_ids: Sequence[str]) -> dict[str, list[DeliveryAttemptRow]]:
    out: dict[str, list[DeliveryAttemptRow]] = defaultdict(list)
    if notification_ids:
        for row in session.scalars(select(DeliveryAttemptRow).where(
                DeliveryAttemptRow.notification_id.in_(notification_ids)).order_by(DeliveryAttemptRow.attempt)):
            out[row.notification_id].append(row)
    return out


def list_receivers(session: Session) -> list[ReceiverRow]:
    return list(session.scalars(select(ReceiverRow).order_by(ReceiverRow.name)))


def get_receiver(session: Session, name: str) -> ReceiverRow | None:
    return session.get(ReceiverRow, name)


def save_receiver(session: Session, name: str, config: dict[str, Any], source: str, now: float) -> ReceiverRow:
    row = session.get(ReceiverRow, name)
    if row is None:
        row = ReceiverRow(name=name, config=config, source=source, created_at=now)
        session.add(row)
    else:
        row.config, row.source = config, source
    session.flush()
    return row


def delete_receiver(session: Session, row: ReceiverRow) -> None:
    session.delete(row)
    session.flush()


def sync_config_receivers(session: Session, receivers: Sequence[dict[str, Any]], now: float) -> None:
    wanted = {r["name"]: r for r in receivers}
    for row in list_receivers(session):
        if row.name not in wanted and row.source == "config":
            session.delete(row)
    for name, config in wanted.items():
        save_receiver(session, name, config, "config", now)
