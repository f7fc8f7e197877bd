"""Every SQL statement on the change events (``change_events``) and the detectors' memory
(``change_detectors``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, delete, func, or_, select
from sqlalchemy.orm import Session

from app.attribution.events import ChangeEvent
from app.store.models import ChangeDetectorRow, ChangeEventRow, FindingRow, Target

#: the most events one answer lists (the newest)
MAX_EVENTS = 1000


def _event(row: ChangeEventRow, target: str) -> ChangeEvent:
    return ChangeEvent(row.kind, row.ts, row.subject, row.before, row.after, row.summary, row.id, target,
                       row.detected_at)


def add_events(session: Session, target_id: int, events: Sequence[ChangeEvent], now: float) -> None:
    session.add_all(ChangeEventRow(target_id=target_id, ts=e.ts, kind=e.kind, subject=e.subject[:256],
                                   before=e.before, after=e.after, summary=e.summary, detected_at=now)
                    for e in events)


def events(session: Session, target_ids: Sequence[int] | None = None, since: float | None = None,
           until: float | None = None, kinds: Sequence[str] | None = None,
           limit: int = MAX_EVENTS) -> list[ChangeEvent]:
    """Events of ``target_ids`` (None: every target) with ``since <= ts <= until``, oldest first
    (the newest ``limit`` of them)."""
    query = select(ChangeEventRow, Target.name).join(Target, Target.id == ChangeEventRow.target_id)
    if target_ids is not None:
        query = query.where(ChangeEventRow.target_id.in_(list(target_ids)))
    if since is not None:
        query = query.where(ChangeEventRow.ts >= since)
    if until is not None:
        query = query.where(ChangeEventRow.ts <= until)
    if kinds is not None:
        query = query.where(ChangeEventRow.kind.in_(list(kinds)))
    rows = session.execute(query.order_by(ChangeEventRow.ts.desc(), ChangeEventRow.id.desc()).limit(limit)).all()
    return [_event(row, name) for row, name in reversed(rows)]


def event(session: Session, target_id: int, event_id: int) -> ChangeEvent | None:
    row = session.execute(select(ChangeEventRow, Target.name).join(Target, Target.id == ChangeEventRow.target_id)
                          .where(ChangeEventRow.id == event_id, ChangeEventRow.target_id == target_id)).first()
    return None if row is None else _event(row[0], row[1])


def counts(session: Session) -> dict[tuple[str, str], int]:
    """(target, kind) -> events stored."""
    rows = session.execute(select(Target.name, ChangeEventRow.kind, func.count())
                           .join(Target, Target.id == ChangeEventRow.target_id)
                           .group_by(Target.name, ChangeEventRow.kind))
    return {(name, kind): n for name, kind, n in rows}


def last_times(session: Session) -> dict[tuple[str, str], float]:
    """(target, kind) -> when its newest stored event happened (the ``/metrics`` gauge)."""
    rows = session.execute(select(Target.name, ChangeEventRow.kind, func.max(ChangeEventRow.ts))
                           .join(Target, Target.id == ChangeEventRow.target_id)
                           .group_by(Target.name, ChangeEventRow.kind))
    return {(name, kind): float(ts) for name, kind, ts in rows}


def finding_transitions(session: Session, since: float, until: float) -> list[FindingRow]:
    """Findings that became active or resolved in ``(since, until]`` (the diagnosis' table)."""
    def inside(column: Any) -> Any:
        return and_(column > since, column <= until)
    return list(session.scalars(select(FindingRow).where(or_(inside(FindingRow.activated_at),
                                                             inside(FindingRow.resolved_at)))
                                .order_by(FindingRow.id)))


def detectors(session: Session, target_ids: Sequence[int]) -> dict[int, ChangeDetectorRow]:
    rows = session.scalars(select(ChangeDetectorRow).where(ChangeDetectorRow.target_id.in_(list(target_ids))))
    return {row.target_id: row for row in rows}


def save_detector(session: Session, row: ChangeDetectorRow | None, target_id: int, read_until: float,
                  state: dict[str, Any]) -> None:
    if row is None:
        session.add(ChangeDetectorRow(target_id=target_id, read_until=read_until, state=state))
    else:
        row.read_until, row.state = read_until, state


def prune(session: Session, before: float) -> int:
    """Delete the events older than ``before`` (the retention of the samples they explain)."""
    result = session.execute(delete(ChangeEventRow).where(ChangeEventRow.ts < before))
    return int(getattr(result, "rowcount", 0) or 0)
