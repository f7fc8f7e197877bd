"""The targets' SQL: list, create, change and delete targets, keep the configured and the
discovered ones in step with their sources. Callers own the transaction boundary."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import (
    delete,
    select,
    update,
)
from sqlalchemy.orm import Session

from app.store.models import (
    DiagnosisRow,
    FindingRow,
    SampleLevel,
    Scrape,
    ScrapeSample,
    Series,
    Target,
    TargetInfo,
    TargetView,
)
from app.store.repository import core_rows, latest_scrapes

if TYPE_CHECKING:  # the scraper's output; the scrape package imports the store, not the reverse
    from app.store.record import ScrapeRecord

log = logging.getLogger(__name__)


def list_targets(session: Session) -> list[Target]:
    return list(session.scalars(select(Target).order_by(Target.name)))



def target_rows(session: Session) -> list[TargetView]:
    """Every target by name, as Core rows: for the pages that read the whole fleet's targets and
    change none (the status page, the targets list, the fleet view, the alert round); writers
    use :func:`list_targets`. The rows carry the columns under the model's attribute names;
    they are read on the session's connection, past the ORM's result processing (cheaper, and
    nothing here is written back)."""
    return list(core_rows(session, select(Target.__table__).order_by(Target.name)))


def get_target(session: Session, name: str) -> Target | None:
    return session.scalar(select(Target).where(Target.name == name))


def create_target(session: Session, *, source: str = "api", **fields: object) -> Target:
    now = time.time()
    target = Target(source=source, created_at=now, updated_at=now, **fields)
    session.add(target)
    session.flush()
    return target


def update_target(session: Session, target: Target, **fields: object) -> Target:
    for key, value in fields.items():
        setattr(target, key, value)
    target.updated_at = time.time()
    session.flush()
    return target


def delete_target(session: Session, target: Target) -> None:
    # Explicit child deletes: SQLite only cascades with foreign_keys=ON, and
    # explicit statements make the cost visible.
    series_ids = select(Series.id).where(Series.target_id == target.id)
    session.execute(delete(ScrapeSample).where(ScrapeSample.target_id == target.id))
    session.execute(delete(SampleLevel).where(SampleLevel.series_id.in_(series_ids)))
    session.execute(delete(Series).where(Series.target_id == target.id))
    session.execute(delete(Scrape).where(Scrape.target_id == target.id))
    session.execute(delete(TargetInfo).where(TargetInfo.target_id == target.id))
    session.execute(delete(FindingRow).where(FindingRow.target_id == target.id))
    session.execute(delete(DiagnosisRow).where(DiagnosisRow.target_id == target.id))
    session.delete(target)
    session.flush()


def sync_config_targets(session: Session, targets: Sequence[dict]) -> None:
    """Make config-file targets match the file: create, update, and drop removed ones.

    Targets created through the API or discovered are left alone; a config target of the
    same name takes it over (the file is the source of truth for what it names).
    """
    wanted = {t["name"]: t for t in targets}
    for target in list_targets(session):
        if target.name in wanted:
            fields = wanted.pop(target.name)
            update_target(session, target, source="config", origin=None, gone_at=None,  # a discovered one too
                          **{k: v for k, v in fields.items() if k != "name"})
        elif target.source == "config":
            delete_target(session, target)
    for fields in wanted.values():
        create_target(session, source="config", **fields)


def sync_discovered_targets(session: Session, source: str, origin: str, wanted: dict[str, dict],
                            now: float) -> dict[str, Target]:
    """Make the targets discovered by one origin (a Prometheus source, a discovery config) match
    ``wanted`` (name -> column values): create the new, update the changed, bring back the
    returned, and mark the missing ``gone_at`` - kept for their history, never deleted here
    (retention does that). A name held by a target of another origin is left alone and
    skipped (the file and the API win). Returns the live targets of the origin by name."""
    live: dict[str, Target] = {}
    rows = {t.name: t for t in session.scalars(select(Target).where(Target.name.in_(list(wanted))))}
    for name, fields in wanted.items():
        row = rows.get(name)
        if row is None:
            live[name] = create_target(session, source=source, origin=origin, name=name, **fields)
        elif row.source == source and row.origin == origin:
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            if row.gone_at is not None:
                changed["gone_at"] = None
            if changed:
                update_target(session, row, **changed)
            live[name] = row
    for row in session.scalars(select(Target).where(Target.source == source, Target.origin == origin,
                                                    Target.gone_at.is_(None))):
        if row.name not in live:
            row.gone_at = now
    session.flush()
    return live


def record_source_view(session: Session, records: Sequence[ScrapeRecord]) -> None:
    """A discovered target's up/down as its source reported it: one scrapes row per change."""
    latest = latest_scrapes(session, [r.target_id for r in records])
    for r in records:
        last = latest.get(r.target_id)
        if last is None or last.up != r.up or last.error_class != r.error_class:
            session.add(Scrape(target_id=r.target_id, ts=r.ts, up=r.up, duration=r.duration, bytes=0,
                               samples_seen=0, samples_kept=0, malformed=0, engine=r.engine,
                               error_class=r.error_class, error=r.error))
    session.flush()


def set_detected_engine(session: Session, target_id: int, engine: str) -> None:
    session.execute(update(Target).where(Target.id == target_id).values(detected_engine=engine))
