"""All SQL of the probe feature (tables ``probe_runs`` and ``probe_requests``). Callers own
the transaction boundary, as in :mod:`app.store.repository`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.probe.runner import ProbeResult, Stats
from app.store.models import ProbeRequestRow, ProbeRunRow, Scrape, Target

KINDS = ("adhoc", "canary", "sweep")
STATES = ("running", "done", "error", "cancelled")


def create_run(session: Session, *, target: str, url: str, kind: str, params: dict, target_id: int | None = None,
               started_at: float | None = None) -> ProbeRunRow:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    row = ProbeRunRow(target_id=target_id, target=target[:256], url=url, kind=kind, params=params, state="running",
                      started_at=time.time() if started_at is None else started_at)
    session.add(row)
    session.flush()
    return row


def finish_run(session: Session, run_id: int, state: str, *, result: ProbeResult | None = None,
               summary: dict | None = None, error: str | None = None,
               finished_at: float | None = None) -> ProbeRunRow | None:
    """Record the outcome (and, with ``result``, every request). Returns None when the row is gone."""
    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state!r}")
    row = session.get(ProbeRunRow, run_id)
    if row is None:
        return None
    row.state = state
    row.finished_at = finished_at or (result.finished_at if result is not None else time.time())
    if summary is None and result is not None:
        summary = result.summary()
    row.summary = summary
    row.error = error
    if result is not None:
        session.add_all(request_rows(run_id, result))
    session.flush()
    return row


def request_rows(run_id: int, result: ProbeResult) -> list[ProbeRequestRow]:
    rows = []
    for level_index, level in enumerate(result.levels):
        plan = level.plan
        for r in level.requests:
            itl = Stats.of(r.itl)
            rows.append(ProbeRequestRow(
                run_id=run_id, level=level_index, concurrency=plan.concurrency, prompt_tokens=plan.prompt_tokens,
                max_tokens=plan.max_tokens, seq=r.index, started_at=r.started_at, ttft=r.ttft, e2e=r.e2e,
                itl_mean=itl.mean, itl_p50=itl.p50, itl_p99=itl.p99, itl_max=itl.max, tokens=r.tokens,
                prompt_tokens_seen=r.prompt_tokens, completion_tokens=r.completion_tokens,
                finish_reason=(r.finish_reason or None) and r.finish_reason[:32], status_code=r.status_code,
                error=r.error, detail=r.detail))
    return rows


def get_run(session: Session, run_id: int) -> ProbeRunRow | None:
    return session.get(ProbeRunRow, run_id)


def list_runs(session: Session, target: str | None = None, kind: str | None = None,
              limit: int = 50) -> list[ProbeRunRow]:
    query = select(ProbeRunRow)
    if target is not None:
        query = query.where(ProbeRunRow.target == target)
    if kind is not None:
        query = query.where(ProbeRunRow.kind == kind)
    return list(session.scalars(query.order_by(ProbeRunRow.started_at.desc(), ProbeRunRow.id.desc()).limit(limit)))


def requests_of(session: Session, run_id: int) -> list[ProbeRequestRow]:
    return list(session.scalars(select(ProbeRequestRow).where(ProbeRequestRow.run_id == run_id)
                                .order_by(ProbeRequestRow.level, ProbeRequestRow.seq)))


def finished_runs(session: Session, target: int | str, since: float, kinds: Sequence[str] = KINDS,
                  limit: int = 20, until: float | None = None) -> list[ProbeRunRow]:
    """Completed runs of a target (by id, or by name/URL) finished in ``[since, until]``, newest first."""
    column = ProbeRunRow.target_id if isinstance(target, int) else ProbeRunRow.target
    query = select(ProbeRunRow).where(column == target, ProbeRunRow.state == "done", ProbeRunRow.kind.in_(kinds),
                                      ProbeRunRow.finished_at >= since)
    if until is not None:
        query = query.where(ProbeRunRow.finished_at <= until)
    return list(session.scalars(
        query.order_by(ProbeRunRow.finished_at.desc(), ProbeRunRow.id.desc()).limit(limit)))


def targets_with_finished_runs(session: Session, since: float, kinds: Sequence[str] = KINDS) -> set[int]:
    """Ids of the targets with a completed run finished at or after ``since``: one query, so a
    diagnosis round over many targets asks :func:`finished_runs` only for those."""
    return set(session.scalars(
        select(ProbeRunRow.target_id).where(ProbeRunRow.target_id.is_not(None), ProbeRunRow.state == "done",
                                            ProbeRunRow.kind.in_(kinds), ProbeRunRow.finished_at >= since)
        .distinct()))


def runs_finished_since(session: Session, since: float, limit: int = 1000) -> list[ProbeRunRow]:
    """Completed (``done``) runs of monitored targets with ``finished_at >= since``, oldest first."""
    return list(session.scalars(
        select(ProbeRunRow).where(ProbeRunRow.finished_at >= since, ProbeRunRow.target_id.is_not(None),
                                  ProbeRunRow.state == "done")
        .order_by(ProbeRunRow.finished_at, ProbeRunRow.id).limit(limit)))


def newest_finish(session: Session) -> float | None:
    return session.scalar(select(func.max(ProbeRunRow.finished_at)))


def latest_runs(session: Session) -> list[ProbeRunRow]:
    """The newest completed (``done``) run per (target, kind) among monitored targets."""
    newest = (select(func.max(ProbeRunRow.id).label("id"))
              .where(ProbeRunRow.target_id.is_not(None), ProbeRunRow.state == "done")
              .group_by(ProbeRunRow.target_id, ProbeRunRow.kind).subquery())
    return list(session.scalars(select(ProbeRunRow).join(newest, ProbeRunRow.id == newest.c.id)
                                .order_by(ProbeRunRow.id)))


def mark_running_as(session: Session, state: str, error: str) -> int:
    """Runs left ``running`` by a process that died: close them (call at start-up)."""
    rows = list(session.scalars(select(ProbeRunRow).where(ProbeRunRow.state == "running")))
    for row in rows:
        row.state, row.error, row.finished_at = state, error, time.time()
    session.flush()
    return len(rows)


def prune(session: Session, before: float) -> int:
    """Delete runs (and their requests) started before ``before`` (retention)."""
    old = select(ProbeRunRow.id).where(ProbeRunRow.started_at < before)
    session.execute(delete(ProbeRequestRow).where(ProbeRequestRow.run_id.in_(old)))
    result = session.execute(delete(ProbeRunRow).where(ProbeRunRow.started_at < before))
    return result.rowcount or 0


def target_by_name(session: Session, name: str) -> Target | None:
    return session.scalar(select(Target).where(Target.name == name))


def scrape_bracket(session: Session, target_id: int, start: float, end: float) -> tuple[float | None, float | None]:
    """The last successful scrape at or before ``start`` and the first at or after ``end``:
    the smallest window of stored snapshots that contains ``[start, end]``."""
    ok = (Scrape.target_id == target_id, Scrape.up.is_(True))
    before = session.scalar(select(func.max(Scrape.ts)).where(*ok, Scrape.ts <= start))
    after = session.scalar(select(func.min(Scrape.ts)).where(*ok, Scrape.ts >= end))
    return before, after
