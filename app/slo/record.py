"""The SLO recording round: what Prometheus recording rules would store, in the built-in store.

Every alerting round, for each SLO and each matched target the service scrapes itself, the
good requests (``bucket{le=threshold}``) and all requests (``count``) between consecutive
stored snapshots since the last round are added up and written as one row of
``slo_increments``. Counter resets are handled as Prometheus' ``increase`` does: a value
below the previous one counts from zero. Burn rates over 5 m .. 28 d then read a SUM of a
few thousand rows per target (older rows are merged, see ``COMPACTION``) instead of every
snapshot.

Differences from ``increase()`` over the same data, by design: no extrapolation to the
window's edges (good and total are counted between the same snapshots, so the ratio is what
extrapolation would give), and a window's edge falls on the round that recorded a row (at
most one alerting interval, 15 s by default, off).

The first round after an SLO is added reads back what the store holds (``retention``, 7 d
by default); after that each round reads only the snapshots since the last one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.core.quantiles import HistogramSnapshot
from app.slo import repository as slo_repository
from app.slo.buckets import bound_index
from app.slo.config import SloObjective
from app.store import repository
from app.store.models import DISCOVERED_BY_SOURCES, SERVICE_KIND, Target
from app.targets import repository as target_repository


def matched_targets(session: Session, slo: SloObjective, targets: Sequence[Target] | None = None) -> list[Target]:
    """The live targets of ``slo``: those the service scrapes itself, or a source's replicas
    (not the services a source groups them into: their requests are the replicas')."""
    rows = target_repository.list_targets(session) if targets is None else targets
    return [t for t in rows if t.gone_at is None and t.source != SERVICE_KIND and slo.matches(t.name, dict(t.labels))]


#: The longest span one row covers: a round normally records one alerting interval; the first
#: round of an SLO reads back the retention and records it in rows of this size, so every
#: window's edge stays within this of the truth.
ROW_SECONDS = 60.0


def pair_increments(snapshots: Sequence[HistogramSnapshot], index: int) -> list[tuple[float, float, float]]:
    """(end of the pair, good, total) per pair of consecutive snapshots: the bucket at ``index``
    and the count, each with Prometheus' counter-reset rule (a drop means the counter
    restarted from 0)."""
    out = []
    for prev, cur in itertools.pairwise(snapshots):
        g0, g1 = prev.counts[index], cur.counts[index]
        out.append((cur.ts, g1 - g0 if g1 >= g0 else g1,
                    cur.count - prev.count if cur.count >= prev.count else cur.count))
    return out


def chunk_rows(pairs: Sequence[tuple[float, float, float]], start: float) -> list[tuple[float, float, float, float]]:
    """Pairs sorted by time -> (ts_start, ts_end, good, total) rows of at most ~:data:`ROW_SECONDS`."""
    rows: list[tuple[float, float, float, float]] = []
    chunk_start, good, total, end = start, 0.0, 0.0, None
    for ts, g, n in sorted(pairs):
        if end is not None and ts != end and ts - chunk_start > ROW_SECONDS:
            rows.append((chunk_start, end, good, total))
            chunk_start, good, total = end, 0.0, 0.0
        good, total, end = good + g, total + n, ts
    if end is not None:
        rows.append((chunk_start, end, good, total))
    return rows


#: (age, size): rows older than ``age`` are merged into rows of ``size`` seconds, so an SLO
#: holds ~2,800 rows per target for 28 days instead of 160,000 (a 28-day SUM stays cheap).
#: A window's edge is then as coarse as the rows it falls on: 5 m for the 6 h and 1 d windows
#: (under 1.4 %), 1 h for 3 d and the period (under 1.4 %, 0.15 % of 28 d).
COMPACTION = ((6 * 3600.0, 300.0), (3 * 86400.0, 3600.0))


def compact(session: Session, slo: SloObjective, now: float, full: bool = False) -> int:
    """Merge the SLO's rows that crossed an age of :data:`COMPACTION` into rows of its size
    (whole buckets of ``size`` seconds only); ``full``: look at every row, not only the
    latest few buckets (after a backfill). Returns the rows removed."""
    removed = 0
    for age, size in COMPACTION:
        cutoff = math.floor((now - age) / size) * size  # only buckets that are complete
        since = None if full else cutoff - 3 * size
        rows = slo_repository.rows_to_compact(session, slo.name, slo.signal, slo.threshold, cutoff, since,
                                              size / 2)
        buckets: dict[tuple[int, float], list] = {}
        for row in rows:
            buckets.setdefault((row.target_id, math.ceil(row.ts_end / size) * size), []).append(row)
        merge = {key: group for key, group in buckets.items() if len(group) > 1}
        if not merge:
            continue
        new = [{"slo": slo.name, "target_id": target_id, "ts_end": max(r.ts_end for r in group),
                "signal": slo.signal, "threshold": slo.threshold, "ts_start": min(r.ts_start for r in group),
                "good": sum(r.good for r in group), "total": sum(r.total for r in group)}
               for (target_id, _), group in merge.items()]
        old = [row for group in merge.values() for row in group]
        slo_repository.replace_rows(session, old, new)
        removed += len(old) - len(new)
    return removed


def record_increments(session: Session, slos: Sequence[SloObjective], now: float, retention: float) -> int:
    """Write this round's increments of every SLO and scraped target; returns the rows written."""
    targets = target_repository.list_targets(session)
    written = 0
    for slo in slos:
        chosen = [t for t in matched_targets(session, slo, targets) if t.source not in DISCOVERED_BY_SOURCES]
        if not chosen:
            continue
        slo_repository.forget_changed(session, slo.name, slo.signal, slo.threshold)
        last = slo_repository.last_recorded(session, slo.name, slo.signal, slo.threshold)
        series = repository.find_series(session, [t.id for t in chosen], [slo.signal])
        rows = []
        for target in chosen:
            mine = [s for s in series if s.target_id == target.id and s.kind == "histogram"]
            usable = [(s, i) for s in mine if (i := bound_index(s.bounds, slo.threshold)) is not None]
            if not usable:
                continue  # no histogram with a bucket at the threshold: reported by the status, not recorded
            start = last.get(target.id, now - min(slo.period, retention))
            snaps = repository.histogram_snapshots(session, [s.id for s, _ in usable], start, now)
            pairs = [pair for ref, index in usable for pair in pair_increments(snaps.get(ref.id, []), index)]
            if not pairs:
                continue
            if target.id not in last:  # the first row starts at the first snapshot there is
                start = min(points[0].ts for points in snaps.values() if points)
            rows += [{"slo": slo.name, "target_id": target.id, "ts_end": end, "signal": slo.signal,
                      "threshold": slo.threshold, "ts_start": begin, "good": good, "total": total}
                     for begin, end, good, total in chunk_rows(pairs, start)]
        slo_repository.add_increments(session, rows)
        written += len(rows)
        compact(session, slo, now, full=any(t.id not in last for t in chosen))
    return written
