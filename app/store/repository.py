"""The store's SQL: series and their samples (raw and downsampled levels), scrapes and the
engines' infos, retention. Callers own the transaction boundary. Writing scrapes is
:mod:`app.store.writer`; each feature keeps its own tables' SQL (targets, diagnoses, alerts,
probes, SLOs)."""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import (
    Delete,
    Engine,
    Select,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, CursorResult, Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app.core.quantiles import HistogramSnapshot, to_millis
from app.store import levels as lv
from app.store.encoding import (
    decode_resets,
    decode_scrape,
    decode_snapshot,
    decode_value,
    encode_resets,
    encode_snapshot,
    encode_value,
    snapshot_blob,
)
from app.store.models import (
    DeliveryAttemptRow,
    FindingRow,
    LevelProgress,
    NotificationRow,
    SampleLevel,
    Scrape,
    ScrapeSample,
    ScrapeView,
    Series,
    Target,
    TargetInfo,
)

log = logging.getLogger(__name__)


def encode_floats(values: Iterable[float]) -> str:
    """Comma-joined ``repr`` floats: exact round trip, portable across SQLite and PostgreSQL
    (a series' bucket bounds, stored once; bucket counts are binary, app/store/encoding.py)."""
    return ",".join(map(repr, values))


def bounds_key(bounds: str) -> str:
    """A series' bounds (:func:`encode_floats`) in its identity: their 128-bit digest, "" for a
    scalar's ""."""
    return hashlib.blake2b(bounds.encode(), digest_size=16).hexdigest() if bounds else ""


def core_rows(session: Session, statement: Select) -> Result:
    """``statement``'s Core rows on the session's connection, past the ORM's result processing,
    after the autoflush ``session.execute`` would do (so a pending target or scrape is seen)."""
    if session.autoflush:
        session.flush()
    return session.connection().execute(statement)


def decode_floats(text: str) -> tuple[float, ...]:
    return tuple(map(float, text.split(","))) if text else ()


# --------------------------------------------------------------------------- reading

@dataclass(slots=True)
class SeriesRef:
    id: int
    target_id: int
    signal: str
    kind: str
    model: str
    rank: str
    bounds: tuple[float, ...]


def find_series(session: Session, target_ids: Sequence[int], signals: Sequence[str],
                model: str | None = None) -> list[SeriesRef]:
    query = select(Series.id, Series.target_id, Series.signal, Series.kind, Series.model, Series.rank,
                   Series.bounds).where(Series.target_id.in_(target_ids), Series.signal.in_(signals))
    if model is not None:
        query = query.where(Series.model == model)
    return [SeriesRef(sid, tid, signal, kind, m, rank, _bounds(bounds))
            for sid, tid, signal, kind, m, rank, bounds in session.execute(query)]


def _bounds(text: str) -> tuple[float, ...]:
    """A series' bounds; the common short ones decoded once (a 20,000-bucket layout is 160 kB
    of text: 4,096 of them are not kept)."""
    return _short_bounds(text) if len(text) <= 4096 else decode_floats(text)


@functools.lru_cache(maxsize=4096)
def _short_bounds(text: str) -> tuple[float, ...]:
    return decode_floats(text)


def snapshots_and_points(session: Session, histogram_ids: Iterable[int], scalar_ids: Iterable[int], start: float,
                         end: float) -> tuple[dict[int, list[HistogramSnapshot]], dict[int, list[tuple[float, float]]]]:
    """The raw samples with ``start <= ts <= end`` of histogram and of gauge or counter
    series, oldest first per series, in one read of their targets' rows: (snapshots per
    histogram series, (ts, value) per scalar series)."""
    snapshots: dict[int, list[HistogramSnapshot]] = defaultdict(list)
    points: dict[int, list[tuple[float, float]]] = defaultdict(list)
    histograms = set(histogram_ids)
    wanted = histograms | set(scalar_ids)
    for _, ts, blob in _raw_rows(session, wanted, start, end):
        for sid, vector in decode_scrape(blob, wanted):
            if sid in histograms:
                snapshots[sid].append(HistogramSnapshot(ts, vector[:-2], vector[-2], vector[-1]))
            else:
                points[sid].append((ts, vector[0]))
    return snapshots, points


def histogram_snapshots(session: Session, series_ids: Sequence[int], start: float,
                        end: float) -> dict[int, list[HistogramSnapshot]]:
    """Snapshots with ``start <= ts <= end`` per histogram series, oldest first."""
    return snapshots_and_points(session, series_ids, (), start, end)[0]


def scalar_points(session: Session, series_ids: Sequence[int], start: float,
                  end: float) -> dict[int, list[tuple[float, float]]]:
    """(ts, value) with ``start <= ts <= end`` per gauge or counter series, oldest first."""
    return snapshots_and_points(session, (), series_ids, start, end)[1]


RAW_LEVEL = 0  # level_progress row of the raw samples: raw samples older than its value are pruned


def level_progress(session: Session) -> tuple[float | None, dict[int, float]]:
    """(raw samples kept since - None when never pruned, {level: complete until})."""
    rows = {int(level): float(done) for level, done in session.execute(
        select(LevelProgress.level, LevelProgress.done_until))}
    return rows.pop(RAW_LEVEL, None), rows


def _set_progress(conn: Connection, level: int, done_until: float, expected: float | None = None) -> bool:
    """Record a level's progress; with ``expected``, only if nobody moved it meanwhile (a late
    write reopened it, :func:`reopen_levels`): False then, and the round stops there."""
    where = [LevelProgress.level == level]
    if expected is not None:
        where.append(LevelProgress.done_until == expected)
    if conn.execute(update(LevelProgress).where(*where).values(done_until=done_until)).rowcount:
        return True
    if expected is None:
        conn.execute(insert(LevelProgress).values(level=level, done_until=done_until))
        return True
    return False


_REOPEN = text("UPDATE level_progress SET done_until = :start WHERE level = :level AND done_until > :ts")


def reopen_levels(conn: Connection, oldest: float) -> None:
    """Samples older than a level's progress (a batch kept through a database outage, a
    backfill): move that level's progress back to the start of their interval, so the
    downsample round rebuilds it and reads use raw samples there meanwhile. Changes nothing
    in the steady state (scrapes are newer than every level's progress)."""
    for level in lv.LEVELS:
        conn.execute(_REOPEN, {"start": math.floor(oldest / level) * level, "level": level, "ts": oldest})


#: The raw rows of the series' targets (a series belongs to one target: its samples are in
#: that target's rows), each target's in time order.
_RAW_ROWS = text(
    "SELECT target_id, ts, samples FROM scrape_samples WHERE target_id IN (SELECT DISTINCT target_id FROM series "
    "WHERE id IN :ids) AND ts >= :lo AND ts <= :hi ORDER BY target_id, ts").bindparams(
    bindparam("ids", expanding=True))
_LEVEL_COLUMNS = "SELECT series_id, n, first_ts, first, last_ts, last, resets, total, peak FROM sample_levels "
_LEVEL_ROWS = {closed: text(_LEVEL_COLUMNS + "WHERE series_id IN :ids AND level = :level AND bucket >= :lo AND bucket "
                            + ("<=" if closed else "<") + " :hi ORDER BY series_id, bucket").bindparams(
    bindparam("ids", expanding=True)) for closed in (False, True)}


def _raw_rows(conn: Connection | Session, series_ids: Iterable[int], lo: float,
              hi: float) -> Iterator[tuple[int, float, bytes]]:
    """(target id, ts, samples) of the ``scrape_samples`` rows with ``lo <= ts <= hi`` of
    the series' targets, each target's in time order. Plain SQL text: on a short window
    building the ORM expression cost more than the rows. Fetched :data:`RAW_FETCH` rows
    at a time (:func:`_driver_batches`): row by row the driver's per-row calls cost as
    much as decoding the rows, all at once would hold a round's every sample."""
    ids = list(series_ids)
    if not ids:
        return
    for rows in _driver_batches(conn.execute(_RAW_ROWS, {"ids": ids, "lo": lo, "hi": hi})):
        yield from rows


def _raw_samples(conn: Connection | Session, series_ids: Sequence[int], lo_ms: int, hi_ms: int,
                 closed: bool) -> Iterable[tuple[int, int, tuple[float, ...]]]:
    """(series id, ms, vector) of raw samples with ``lo <= ms < hi`` (``<= hi`` if closed),
    each series' in time order, one per series and millisecond (the first, as Prometheus
    keeps one). A histogram's vector is its counts, then ``_sum`` and ``_count``; a
    scalar's its value."""
    wanted = set(series_ids)
    previous: tuple[int, int] | None = None  # (target, ms) of the last row read
    first_blob, seen = b"", None
    for target_id, ts, blob in _raw_rows(conn, wanted, lo_ms / 1000 - 0.001, hi_ms / 1000 + 0.001):
        ms = int(round(ts * 1000.0))  # to_millis, inline: once per raw row
        if ms < lo_ms or ms > hi_ms or (ms == hi_ms and not closed):
            continue
        if (target_id, ms) != previous:
            previous, first_blob, seen = (target_id, ms), blob, None
            for sid, vector in decode_scrape(blob, wanted):
                yield sid, ms, vector
            continue
        # another row of the target in the same millisecond (scrapes under a millisecond
        # apart, as ``to_millis`` rounds): only the series the earlier rows lacked
        if seen is None:
            seen = {sid for sid, _ in decode_scrape(first_blob, wanted)}
        for sid, vector in decode_scrape(blob, wanted):
            if sid not in seen:
                seen.add(sid)
                yield sid, ms, vector


#: Raw rows fetched per driver call (:func:`_raw_samples`).
RAW_FETCH = 5000


def _driver_batches(result: Result) -> Iterator[Sequence[tuple]]:
    """The rows of an executed plain-SQL statement as the driver's tuples, :data:`RAW_FETCH`
    at a time, without a SQLAlchemy ``Row`` per row (a round reads tens of thousands of raw
    rows; a ``Row`` each is a visible share of the round). A driver error while fetching
    (SQLite's progress handler interrupting a read over its budget) is raised as
    SQLAlchemy's, as ``partitions`` would have."""
    assert isinstance(result, CursorResult)  # a statement's result, not a buffered copy
    cursor = result.cursor
    dbapi_error = result.context.dialect.loaded_dbapi.Error
    try:
        while True:
            try:
                rows = cursor.fetchmany(RAW_FETCH)
            except dbapi_error as exc:
                raise DBAPIError.instance(None, None, exc, dbapi_error) from exc
            if not rows:
                return
            yield rows
    finally:
        result.close()


def _raw_chunks(conn: Connection | Session, series_ids: Sequence[int], lo_ms: int, hi_ms: int,
                closed: bool, fold: bool = False) -> dict[int, list[lv.Chunk]]:
    """Each series' raw samples in the range as chunks: one per sample, or with ``fold`` all
    of a series' samples as one chunk (exactly :func:`app.store.levels.combine` of them,
    without a chunk per sample) - for a reader that asks only for windows containing the
    whole range."""
    out: dict[int, list[lv.Chunk]] = defaultdict(list)
    if not fold:
        for sid, ms, vector in _raw_samples(conn, series_ids, lo_ms, hi_ms, closed):
            out[sid].append(lv.raw_chunk(ms, vector))
        return out
    runs: dict[int, lv.Run] = {}
    for sid, ms, vector in _raw_samples(conn, series_ids, lo_ms, hi_ms, closed):
        run = runs.get(sid)
        if run is None:
            run = runs[sid] = lv.Run()
        run.append(ms, vector)
    for sid, run in runs.items():
        out[sid].append(run.chunk())
    return out


def _level_rows(conn: Connection | Session, series_ids: Sequence[int], kinds: dict[int, str], level: int,
                lo_ms: int, hi_ms: int, closed: bool) -> Iterable[tuple[int, lv.Chunk]]:
    """(series id, chunk) of the level rows whose interval starts in the range, in order."""
    params = {"ids": list(series_ids), "level": level, "lo": lo_ms / 1000, "hi": hi_ms / 1000}
    # fetched at once: row by row, the driver's fetchone cost as much as decoding the row
    for sid, n, first_ts, first, last_ts, last, resets, total, peak in conn.execute(_LEVEL_ROWS[closed],
                                                                                    params).all():
        decode = decode_snapshot if kinds[sid] == "histogram" else decode_value
        yield sid, lv.Chunk(to_millis(first_ts), decode(bytes(first)), to_millis(last_ts), decode(bytes(last)), n,
                            decode_resets(resets), 0.0 if total is None else total,
                            -math.inf if peak is None else peak)


def timelines(session: Session, series: Sequence[SeriesRef], segments: Sequence[lv.Segment],
              fold_raw: bool = False) -> dict[int, lv.Timeline]:
    """The chunks of every series over a read plan (:func:`app.store.levels.plan`): one
    query per segment, whatever the number of series. ``fold_raw``: the caller
    asks only for the one window the plan covers, so each raw segment of a series is one
    chunk (:func:`_raw_chunks`)."""
    chunks: dict[int, list[lv.Chunk]] = {s.id: [] for s in series}
    kinds = {s.id: s.kind for s in series}
    for seg in segments:
        if seg.level == 0:
            for sid, raw in _raw_chunks(session, list(kinds), seg.lo_ms, seg.hi_ms, seg.closed, fold_raw).items():
                chunks[sid].extend(raw)
        elif series:
            for sid, chunk in _level_rows(session, list(kinds), kinds, seg.level, seg.lo_ms, seg.hi_ms, seg.closed):
                chunks[sid].append(chunk)
    return {sid: lv.Timeline(c) for sid, c in chunks.items()}


#: Series downsampled per statement: bounds the rows held in memory (series x samples per slice).
DOWNSAMPLE_SERIES_BATCH = 500
#: Raw samples are read this many seconds at a time when building the finest level.
DOWNSAMPLE_SLICE = 3600.0


def downsample(begin: Callable[[], AbstractContextManager[Connection]], now: float) -> dict[int, int]:
    """Complete the level rows of every interval that ended ``GRACE_SECONDS`` ago and is not
    done yet: the finest level from raw samples, each coarser level from the one below.
    Idempotent (a slice's rows are replaced), so a crash halfway only repeats work. Reads
    happen outside the short write transactions. Returns, per level, the rows of the
    intervals it completed (kept or built).

    The writer builds most finest-level rows as it writes (:class:`SampleWriter`). For
    those, a slice costs two small grouped queries per series batch: the raw rows per
    target and interval (counted in SQL) and the stored rows' ``n``. Only a series with an
    interval whose count differs (a missing row, a row from a writer that did not see every
    sample, a row without samples, or a series absent from some of its target's scrapes)
    has its raw samples read and its rows rebuilt.

    ``begin``: a context manager yielding a connection in a transaction (``engine.begin``,
    or the migration's own connection)."""
    with begin() as conn:
        _, progress = level_progress(conn)  # type: ignore[arg-type]
        kinds, targets = {}, {}
        for sid, kind, target_id in conn.execute(select(Series.id, Series.kind, Series.target_id)):
            kinds[sid], targets[sid] = kind, target_id
    ids = sorted(kinds)
    written: dict[int, int] = {}
    source: int | None = None
    for level in lv.LEVELS:
        until = math.floor((now - lv.GRACE_SECONDS) / level) * level
        if source is not None:
            until = min(until, math.floor(progress.get(source, 0.0) / level) * level)
        done = progress.get(level)
        if done is None:
            with begin() as conn:
                first = _earliest(conn, source)
            if first is None:  # nothing stored yet: the level starts with the first samples
                source = level
                continue
            done = min(until, math.floor(first / level) * level)
        written[level] = 0
        slice_seconds = max(float(level), DOWNSAMPLE_SLICE)
        t = done
        while t < until:
            t_next = min(until, t + slice_seconds)
            for i in range(0, len(ids), DOWNSAMPLE_SERIES_BATCH):
                batch = ids[i:i + DOWNSAMPLE_SERIES_BATCH]
                with begin() as conn:
                    kept = 0
                    if source is None:
                        batch, kept = _stale_series(conn, batch, targets, level, t, t_next)
                    per_series = _source_chunks(conn, batch, kinds, source, t, t_next) if batch else {}
                rows = []
                for sid, chunks in per_series.items():
                    for bucket_ms, c in lv.downsample(chunks, level).items():
                        rows.append(level_row(sid, kinds[sid], level, bucket_ms, c))
                if batch:
                    with begin() as conn:
                        conn.execute(delete(SampleLevel).where(SampleLevel.series_id.in_(batch),
                                                               SampleLevel.level == level,
                                                               SampleLevel.bucket >= t, SampleLevel.bucket < t_next))
                        if rows:
                            _replace_levels(conn, rows)
                written[level] += kept + len(rows)
            with begin() as conn:
                moved = _set_progress(conn, level, t_next, expected=t if level in progress else None)
            if not moved:
                return written  # a late write reopened the level: the next round starts over from there
            progress[level] = t_next
            t = t_next
        if level not in progress:
            with begin() as conn:
                _set_progress(conn, level, done)
            progress[level] = done
        source = level
    return written


def _level_insert(conn: Connection) -> sqlite.Insert | postgresql.Insert:
    """``INSERT INTO sample_levels`` with the dialect's ``ON CONFLICT`` clauses."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(SampleLevel)


_LEVEL_KEY = ("series_id", "level", "bucket")


@functools.cache
def _new_levels_sqlite() -> tuple[str, tuple[str, ...]]:
    """SQLite's ``INSERT ... ON CONFLICT DO NOTHING`` of a level row, and its parameters' order."""
    compiled = sqlite.insert(SampleLevel).on_conflict_do_nothing().compile(dialect=sqlite.dialect())
    return str(compiled), tuple(compiled.positiontup or ())


def insert_new_levels(conn: Connection, rows: list[dict]) -> None:
    """The writer's finished rows, unless a row is there already (``ON CONFLICT DO
    NOTHING``). SQLite: positional rows straight to the driver, as :func:`_insert_rows`
    (through ``conn.execute`` building the parameters cost as much as the insert)."""
    if conn.dialect.name == "sqlite":
        sql, names = _new_levels_sqlite()
        conn.exec_driver_sql(sql, [tuple(row[name] for name in names) for row in rows])
    else:
        conn.execute(_level_insert(conn).on_conflict_do_nothing(), rows)


def _replace_levels(conn: Connection, rows: list[dict]) -> None:
    """Insert rebuilt level rows over any a writer put in since the slice's rows were
    deleted (the round's rows are built from every raw sample: they win)."""
    stmt = _level_insert(conn)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=list(_LEVEL_KEY),
        set_={c.name: stmt.excluded[c.name] for c in SampleLevel.__table__.columns if c.name not in _LEVEL_KEY}),
        rows)


#: Raw samples per series and finest-level interval; the interval index is
#: ``to_millis(ts) // step`` (``to_millis`` rounds half to even, ``floor(x + 0.5)`` half up:
#: they differ only at an exact half millisecond k + 0.5 with k even, and then k + 1 is odd,
#: never an interval start, so both land in the same interval).
_INTERVAL_INDEX = {
    "sqlite": "CAST(ts * 1000 + 0.5 AS INTEGER) / :step",
    "postgresql": "CAST(floor(ts * 1000 + 0.5) AS BIGINT) / :step",
}
_RAW_COUNTS = {dialect: text(
    f"SELECT target_id, {index} AS i, count(*) FROM scrape_samples WHERE target_id IN :ids "
    "AND ts >= :lo AND ts < :hi GROUP BY target_id, i").bindparams(bindparam("ids", expanding=True))
    for dialect, index in _INTERVAL_INDEX.items()}
_LEVEL_COUNTS = text("SELECT series_id, bucket, n FROM sample_levels WHERE series_id IN :ids AND level = :level "
                     "AND bucket >= :lo AND bucket < :hi").bindparams(bindparam("ids", expanding=True))


def raw_counts(conn: Connection, target_ids: Sequence[int], level: int, start: float,
               end: float) -> dict[tuple[int, int], int]:
    """Raw rows (scrapes with samples) per (target, interval start in ms) of ``level`` for
    the intervals that start in ``[start, end)``, counted in SQL (read through the
    ``(target_id, ts)`` key)."""
    step = level * 1000
    lo_ms, hi_ms = to_millis(start), to_millis(end)
    query = _RAW_COUNTS["postgresql" if conn.dialect.name == "postgresql" else "sqlite"]
    out = {}
    for target_id, index, count in conn.execute(query, {"ids": list(target_ids), "step": step,
                                                       "lo": start - 0.001, "hi": end + 0.001}):
        bucket_ms = int(index) * step
        if lo_ms <= bucket_ms < hi_ms:
            out[(target_id, bucket_ms)] = int(count)
    return out


def _stale_series(conn: Connection, batch: Sequence[int], targets: dict[int, int], level: int, start: float,
                  end: float) -> tuple[list[int], int]:
    """(the series of ``batch`` whose rows of the slice must be rebuilt from raw samples, the
    rows of the others, kept): a row is kept when its ``n`` equals the raw rows stored in
    its interval for the series' target. A writer's row holds a subset of the series'
    samples, in time order, one a millisecond, and a series has at most one sample a row,
    so equal counts mean every sample, and none duplicated within a millisecond. Any other
    difference - a missing row, a row without samples, a series absent from some of its
    target's scrapes (a model gone, a NaN gauge) - rebuilds the series: never wrong, only
    dearer."""
    by_target: dict[int, list[int]] = defaultdict(list)
    for sid in batch:
        by_target[targets[sid]].append(sid)
    expected = {(sid, bucket_ms): n for (target_id, bucket_ms), n in
                raw_counts(conn, list(by_target), level, start, end).items() for sid in by_target[target_id]}
    stored = {(sid, to_millis(bucket)): n for sid, bucket, n in conn.execute(
        _LEVEL_COUNTS, {"ids": list(batch), "level": level, "lo": start, "hi": end})}
    stale = {key[0] for key in expected.keys() | stored.keys() if expected.get(key) != stored.get(key)}
    kept = sum(1 for sid, _ in stored if sid not in stale)
    return [sid for sid in batch if sid in stale], kept


def _earliest(conn: Connection, source: int | None) -> float | None:
    if source is None:
        values = [conn.scalar(select(func.min(ScrapeSample.ts)))]
    else:
        values = [conn.scalar(select(func.min(SampleLevel.bucket)).where(SampleLevel.level == source))]
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _source_chunks(conn: Connection, batch: Sequence[int], kinds: dict[int, str], source: int | None,
                   start: float, end: float) -> dict[int, list[lv.Chunk]]:
    out: dict[int, list[lv.Chunk]] = defaultdict(list)
    lo_ms, hi_ms = to_millis(start), to_millis(end)
    if source is None:
        for sid, raw in _raw_chunks(conn, batch, lo_ms, hi_ms, False).items():
            out[sid].extend(raw)
    else:
        for sid, chunk in _level_rows(conn, batch, kinds, source, lo_ms, hi_ms, False):
            out[sid].append(chunk)
    return out


def level_row(sid: int, kind: str, level: int, bucket_ms: int, c: lv.Chunk,
               counts: tuple[bytes, bytes] | None = None) -> dict:
    """The ``sample_levels`` row of a chunk; ``counts``: a histogram's first and last counts
    already encoded (:func:`app.store.encoding.encode_counts`), when the caller has them."""
    if kind != "histogram":
        first, last = encode_value(c.first[0]), encode_value(c.last[0])
    elif counts is None:
        first, last = encode_snapshot(c.first[:-2], c.first[-2], c.first[-1]), encode_snapshot(
            c.last[:-2], c.last[-2], c.last[-1])
    else:
        first, last = snapshot_blob(counts[0], c.first[-2], c.first[-1]), snapshot_blob(
            counts[1], c.last[-2], c.last[-1])
    gauge = kind == "gauge"
    return {"series_id": sid, "level": level, "bucket": bucket_ms / 1000, "n": c.n, "first_ts": c.first_ms / 1000,
            "first": first, "last_ts": c.last_ms / 1000, "last": last,
            "resets": encode_resets(c.resets), "total": c.total if gauge else None, "peak": c.peak if gauge else None}


def target_infos(session: Session, target_id: int) -> list[TargetInfo]:
    return list(session.scalars(select(TargetInfo).where(TargetInfo.target_id == target_id)))


def latest_scrape(session: Session, target_id: int) -> Scrape | None:
    """One target's most recent scrape: one row by the ``(target_id, ts)`` index, where
    :func:`latest_scrapes` groups every target's (a per-target read asking for all of them
    costs several times its own work at 1,000 targets, bench/load.py)."""
    return session.scalars(select(Scrape).where(Scrape.target_id == target_id)
                           .order_by(Scrape.ts.desc()).limit(1)).first()


def latest_scrapes(session: Session, target_ids: Sequence[int] | None = None) -> dict[int, ScrapeView]:
    """The most recent scrape of every target (of ``target_ids`` only, when given): one
    index lookup per target (``ix_scrapes_target_ts`` read backwards from the target's end),
    so the cost follows the number of targets, not the scrape log's length (a ``max(ts) ...
    GROUP BY target_id`` reads the whole log, which holds ``retention`` of scrapes). Core
    rows on the session's connection, not ORM objects: read-only."""
    newest = (select(Scrape.id).where(Scrape.target_id == Target.id).order_by(Scrape.ts.desc(), Scrape.id.desc())
              .limit(1).correlate(Target).scalar_subquery())
    newest_ids = select(newest).select_from(Target)
    if target_ids is not None:
        newest_ids = newest_ids.where(Target.id.in_(list(target_ids)))
    rows = core_rows(session, select(Scrape.__table__).where(Scrape.id.in_(newest_ids)))
    return {row.target_id: row for row in rows}


def scrape_log(session: Session, target_id: int, limit: int = 50) -> list[Scrape]:
    return list(session.scalars(select(Scrape).where(Scrape.target_id == target_id)
                                .order_by(Scrape.ts.desc()).limit(limit)))


def scrape_counts(session: Session, target_id: int, since: float) -> tuple[int, int]:
    """(scrapes, failed scrapes) since ``since``."""
    where = (Scrape.target_id == target_id, Scrape.ts >= since)
    total = session.scalar(select(func.count()).select_from(Scrape).where(*where)) or 0
    failed = session.scalar(select(func.count()).select_from(Scrape).where(*where, Scrape.up.is_(False))) or 0
    return int(total), int(failed)


def scrape_counts_by_target(session: Session, since: float) -> dict[int, tuple[int, int]]:
    """(scrapes, failed scrapes) since ``since`` of every target that has any, in one query
    (the fleet's scrape health; :func:`scrape_counts` for one target)."""
    failed = func.sum(case((Scrape.up.is_(False), 1), else_=0))
    rows = session.execute(select(Scrape.target_id, func.count(), failed).where(Scrape.ts >= since)
                           .group_by(Scrape.target_id))
    return {target_id: (int(total), int(down or 0)) for target_id, total, down in rows}


def prune_records(session: Session, before: float) -> dict[str, int]:
    """Delete dropped findings and finished notifications (delivered or expired, with their
    delivery attempts) older than ``before`` (retention); the sample tables and the scrape
    log are pruned by :func:`prune_samples`. A pending notification stays whatever its age:
    the outbox never loses one."""
    def deleted(statement: Delete) -> int:
        result = session.execute(statement)
        return (result.rowcount or 0) if isinstance(result, CursorResult) else 0

    # findings that never became active are noise once they are old; real history stays
    findings = deleted(delete(FindingRow).where(FindingRow.state == "dropped", FindingRow.last_seen < before))
    # every notification keeps the payload it sent: kept forever, the outbox would grow with
    # every alert ever sent
    finished = (NotificationRow.state.in_(("delivered", "expired")), NotificationRow.created_at < before,
                or_(NotificationRow.delivered_at.is_(None), NotificationRow.delivered_at < before))
    attempts = deleted(delete(DeliveryAttemptRow).where(
        DeliveryAttemptRow.notification_id.in_(select(NotificationRow.id).where(*finished))))
    return {"findings": findings, "notifications": deleted(delete(NotificationRow).where(*finished)),
            "delivery_attempts": attempts}


#: SQLite pruning deletes at most this many rows per transaction, so a scrape batch waiting
#: for the write lock waits for one such statement only (~10 ms on a slow disk).
PRUNE_BATCH_ROWS = 2000
#: The same for ``scrape_samples``, whose row holds a whole scrape (~1.2 KB on the vLLM
#: page): about as many bytes a transaction as 2,000 of the other tables' rows.
RAW_PRUNE_BATCH_ROWS = 200


def prune_samples(engine: Engine, before: float, raw_before: float, batch_rows: int = PRUNE_BATCH_ROWS,
                  raw_batch_rows: int = RAW_PRUNE_BATCH_ROWS) -> dict[str, int]:
    """Retention of the sample tables and the scrape log: raw samples older than
    ``raw_before``, downsampled levels and scrapes older than ``before``.

    PostgreSQL drops whole time partitions (no row-by-row delete, no table scan, no vacuum
    debt); rows of the partly expired partition stay until its span is over. SQLite deletes
    in rowid order (rows are inserted in time order, so the oldest come first) in
    transactions of ``batch_rows`` rows each (raw rows: ``raw_batch_rows``), committing in
    between so the scrape writer never waits for more than one batch. Returns rows (PostgreSQL: partitions) removed."""
    from app.store import partitions

    raw_before = min(raw_before, _raw_prune_limit(engine, raw_before))
    cutoffs = {"scrape_samples": raw_before, "sample_levels": before}
    deleted: dict[str, int] = {}
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            for table, cutoff in cutoffs.items():
                deleted[f"{table}_partitions"] = partitions.drop_before(conn, table, cutoff)
            deleted["scrapes"] = conn.execute(delete(Scrape).where(Scrape.ts < before)).rowcount or 0
    else:
        for table, cutoff in (*cutoffs.items(), ("scrapes", before)):
            column = "bucket" if table == "sample_levels" else "ts"
            rows = raw_batch_rows if table == "scrape_samples" else batch_rows
            deleted[table] = _prune_in_batches(engine, table, column, cutoff, rows)
    with engine.begin() as conn:
        _set_progress(conn, RAW_LEVEL, raw_before)
    return deleted


def _raw_prune_limit(engine: Engine, wanted: float) -> float:
    """Raw samples are never pruned before the finest level holds them."""
    with engine.connect() as conn:
        done = conn.scalar(select(LevelProgress.done_until).where(LevelProgress.level == lv.LEVELS[0]))
    return wanted if done is None else min(wanted, done)


def _prune_in_batches(engine: Engine, table: str, column: str, cutoff: float, batch_rows: int) -> int:
    """SQLite: delete rows with ``column < cutoff`` walking the rowid order in batches; stops
    at the first batch with nothing to delete (the rest is newer)."""
    deleted, after = 0, 0  # rowids start at 1
    while True:
        with engine.begin() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT max(rowid), count(*) FROM (SELECT rowid FROM {table} WHERE rowid > ? "
                f"ORDER BY rowid LIMIT ?)", (after, batch_rows)).one()
            high, seen = rows
            if not seen:
                return deleted
            n = conn.exec_driver_sql(f"DELETE FROM {table} WHERE rowid > ? AND rowid <= ? AND {column} < ?",
                                     (after, high, cutoff)).rowcount
        deleted += n
        after = high
        if n == 0:
            return deleted


def scrape_times(session: Session, target_id: int, start: float, end: float) -> list[float]:
    """Timestamps of the successful scrapes of a target within ``[start, end]``."""
    return list(session.scalars(select(Scrape.ts).where(Scrape.target_id == target_id, Scrape.ts >= start,
                                                         Scrape.ts <= end, Scrape.up.is_(True))
                                .order_by(Scrape.ts)))


def successful_scrape_counts(session: Session, target_ids: Sequence[int], start: float,
                             end: float) -> dict[int, int]:
    """Successful scrapes within ``[start, end]`` of many targets, in one query (a round's)."""
    if not target_ids:
        return {}
    rows = session.execute(select(Scrape.target_id, func.count()).where(
        Scrape.target_id.in_(list(target_ids)), Scrape.ts >= start, Scrape.ts <= end, Scrape.up.is_(True))
        .group_by(Scrape.target_id))
    return {target_id: int(count) for target_id, count in rows}


def infos_by_target(session: Session, target_ids: Sequence[int]) -> dict[int, list[TargetInfo]]:
    """The info metrics of many targets, in one query."""
    out: dict[int, list[TargetInfo]] = defaultdict(list)
    if target_ids:
        for info in session.scalars(select(TargetInfo).where(TargetInfo.target_id.in_(list(target_ids)))):
            out[info.target_id].append(info)
    return out
