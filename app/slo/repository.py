"""Every SQL statement on the SLO recording table (``slo_increments``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import CursorResult, and_, case, delete, func, insert, not_, select
from sqlalchemy.orm import Session

from app.store.models import SloIncrementRow


def _of(slo: str, signal: str, threshold: float):
    return and_(SloIncrementRow.slo == slo, SloIncrementRow.signal == signal, SloIncrementRow.threshold == threshold)


def last_recorded(session: Session, slo: str, signal: str, threshold: float) -> dict[int, float]:
    """Per target, the end of the last recorded increment (where the next one starts)."""
    rows = session.execute(select(SloIncrementRow.target_id, func.max(SloIncrementRow.ts_end))
                           .where(_of(slo, signal, threshold)).group_by(SloIncrementRow.target_id))
    return {target_id: ts for target_id, ts in rows}


def forget_changed(session: Session, slo: str, signal: str, threshold: float) -> int:
    """Delete the SLO's rows recorded for another signal or threshold (the SLO was edited):
    they count other requests as good, and the new record starts from the stored samples."""
    stale = delete(SloIncrementRow).where(SloIncrementRow.slo == slo, not_(_of(slo, signal, threshold)))
    return cast(CursorResult, session.execute(stale)).rowcount or 0


def add_increments(session: Session, rows: Sequence[dict]) -> None:
    if rows:
        session.execute(insert(SloIncrementRow), list(rows))


def window_sums(session: Session, slo: str, signal: str, threshold: float, target_ids: Sequence[int],
                windows: Sequence[float], now: float) -> dict[int, list[tuple[float, float, float | None]]]:
    """Per target, for each of ``windows`` (seconds ending at ``now``): (good, total, start of the
    oldest increment in the window or None). One query, every window a conditional SUM."""
    if not target_ids or not windows:
        return {}
    columns = []
    for window in windows:
        inside = SloIncrementRow.ts_end > now - window
        columns += [func.sum(case((inside, SloIncrementRow.good), else_=0.0)),
                    func.sum(case((inside, SloIncrementRow.total), else_=0.0)),
                    func.min(case((inside, SloIncrementRow.ts_start), else_=None))]
    query = (select(SloIncrementRow.target_id, *columns)
             .where(_of(slo, signal, threshold), SloIncrementRow.target_id.in_(list(target_ids)),
                    SloIncrementRow.ts_end > now - max(windows), SloIncrementRow.ts_end <= now)
             .group_by(SloIncrementRow.target_id))
    out: dict[int, list[tuple[float, float, float | None]]] = {}
    for target_id, *values in session.execute(query):
        out[target_id] = [(float(values[i] or 0.0), float(values[i + 1] or 0.0), values[i + 2])
                          for i in range(0, len(values), 3)]
    return out


def prune(session: Session, keep: dict[str, float], now: float) -> int:
    """Delete increments of SLOs no longer configured, and those older than their SLO's
    period (``keep``: SLO name -> seconds to keep)."""
    gone = delete(SloIncrementRow).where(not_(SloIncrementRow.slo.in_(list(keep))))
    deleted = cast(CursorResult, session.execute(gone))
    count = deleted.rowcount or 0
    for name, seconds in keep.items():
        result = cast(CursorResult, session.execute(delete(SloIncrementRow).where(
            SloIncrementRow.slo == name, SloIncrementRow.ts_end < now - seconds)))
        count += result.rowcount or 0
    return count
