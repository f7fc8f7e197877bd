"""All SQL of the service lives here. Callers own the transaction boundary.

Hot path: :class:`SampleWriter` writes a batch of scrapes with one multi-row insert
per table (SQLAlchemy Core "executemany"/"insertmanyvalues", ``COPY`` on PostgreSQL), in
one transaction; a scrape's samples are one ``scrape_samples`` row.
Every scrape in the batch is therefore written completely or not at all. If the batch
fails (it should not), each scrape is retried in a transaction of its own so one bad
scrape can never drop the others.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Delete,
    Engine,
    Select,
    Text,
    bindparam,
    case,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, CursorResult, Result
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, defer

from app.core.quantiles import HistogramSnapshot, to_millis
from app.runtime.kept import KeptParts
from app.store import levels as lv
from app.store.db import NOT_A_CHANGE
from app.store.encoding import (
    decode_resets,
    decode_scrape,
    decode_snapshot,
    decode_value,
    encode_counts,
    encode_resets,
    encode_scrape,
    encode_snapshot,
    encode_value,
    snapshot_blob,
)
from app.store.models import (
    AlertRow,
    DeliveryAttemptRow,
    DiagnosisRow,
    FindingRow,
    LevelProgress,
    NotificationLogRow,
    NotificationRow,
    ReceiverRow,
    SampleLevel,
    Scrape,
    ScrapeSample,
    ScrapeView,
    Series,
    SilenceRow,
    Target,
    TargetInfo,
    TargetView,
)

if TYPE_CHECKING:  # the scraper's output; the scrape package imports the store, not the reverse
    from app.store.record import ScrapeRecord

log = logging.getLogger(__name__)


def encode_floats(values: Iterable[float]) -> str:
    """Comma-joined ``repr`` floats: exact round trip, portable across SQLite and PostgreSQL
    (a series' bucket bounds, stored once; bucket counts are binary, app/store/encoding.py)."""
    return ",".join(map(repr, values))


def decode_floats(text: str) -> tuple[float, ...]:
    return tuple(map(float, text.split(","))) if text else ()


# --------------------------------------------------------------------------- targets

def list_targets(session: Session) -> list[Target]:
    return list(session.scalars(select(Target).order_by(Target.name)))


def _core_rows(session: Session, statement: Select) -> Result:
    """``statement``'s Core rows on the session's connection, past the ORM's result processing,
    after the autoflush ``session.execute`` would do (so a pending target or scrape is seen)."""
    if session.autoflush:
        session.flush()
    return session.connection().execute(statement)


def target_rows(session: Session) -> list[TargetView]:
    """Every target by name, as Core rows: for the pages that read the whole fleet's targets and
    change none (the status page, the targets list, the fleet view, the alert round); writers
    use :func:`list_targets`. The rows carry the columns under the model's attribute names;
    they are read on the session's connection, past the ORM's result processing (cheaper, and
    nothing here is written back)."""
    return list(_core_rows(session, select(Target.__table__).order_by(Target.name)))


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


# --------------------------------------------------------------------------- writing

class DatabaseUnavailable(Exception):
    """The database could not be reached; nothing of the batch was written."""


SeriesKey = tuple[int, str, str, str, str]  # target_id, signal, model, rank, bounds
INFO_REFRESH_SECONDS = 300.0  # an unchanged info row is rewritten (its ts refreshed) this often


class _OpenInterval:
    """A series' current finest-level interval as the writer saw it: the run of the samples
    it wrote there, in order, the timestamp of the last one kept, and (histograms) the
    encoded counts of the first and last one (the raw rows' own: not encoded again)."""

    __slots__ = ("kind", "bucket_ms", "end_ms", "last_ts", "run", "first_counts", "last_counts")

    def __init__(self, kind: str, bucket_ms: int, step_ms: int, ts: float, ms: int, vector: tuple[float, ...],
                 counts: bytes | None) -> None:
        self.kind, self.bucket_ms, self.end_ms = kind, bucket_ms, bucket_ms + step_ms
        self.run = lv.Run()
        self.run.append(ms, vector)
        self.last_ts = ts
        self.first_counts = self.last_counts = counts

    def row(self, sid: int) -> dict:
        first, last = self.first_counts, self.last_counts
        counts = None if first is None or last is None else (first, last)
        return _level_row(sid, self.kind, lv.LEVELS[0], self.bucket_ms, self.run.chunk(), counts)


class SampleWriter:
    """Writes scrape batches; caches series ids so a steady-state scrape does no lookups.

    It also builds the finest level (``lv.LEVELS[0]``) as it writes: per series, the run of
    the samples it wrote in the current interval (one :class:`_OpenInterval` per series).
    When a sample of a later interval comes, the finished row goes in with the raw rows, in
    the same transaction (``ON CONFLICT DO NOTHING``: a row already there stays). The row
    is the one the downsample round would build from the same samples, bit for bit, but
    only if this writer wrote every sample of the interval: after a restart, a hand-over
    between replicas or a late batch it holds fewer. The round therefore keeps a row only
    when its ``n`` equals the raw samples stored in the interval, and rebuilds it otherwise
    (:func:`downsample`). A sample older than the last one kept drops the series' interval
    (its row would no longer be time-ordered), and so does one more than an interval later
    (the row is left to the round: targets scraped less often than every 5 minutes gain
    nothing); a failed transaction drops them all (they may hold samples not stored)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._series: dict[SeriesKey, int] = {}
        self._bounds_text: dict[tuple[float, ...], str] = {}
        self._bounds_by_id: dict[int, tuple[tuple[float, ...], str]] = {}
        # last written engine config per (target, name, model, rank): info pages rarely
        # change, and an UPDATE per info per scrape would be a fifth of the ingest CPU
        self._infos: dict[tuple[int, str, str, str], tuple[dict, float]] = {}
        self._open: dict[int, _OpenInterval] = {}
        self._step_ms = lv.LEVELS[0] * 1000

    def forget_target(self, target_id: int) -> None:
        for key, sid in list(self._series.items()):
            if key[0] == target_id:
                self._open.pop(sid, None)
        self._series = {k: v for k, v in self._series.items() if k[0] != target_id}
        self._infos = {k: v for k, v in self._infos.items() if k[0] != target_id}

    def write(self, records: Sequence[ScrapeRecord]) -> int:
        """Write the batch; returns how many scrapes were written.

        Raises :class:`DatabaseUnavailable` when the database cannot be reached, so
        the caller keeps the batch and retries instead of losing it.
        """
        if not records:
            return 0
        try:
            self._write_transaction(records)
            return len(records)
        except OperationalError as exc:
            self._open.clear()
            raise DatabaseUnavailable(str(exc)) from exc
        except Exception:
            self._open.clear()
            log.exception("batch of %d scrapes failed; retrying one by one", len(records))
        written = 0
        for record in records:
            try:
                self._write_transaction([record])
                written += 1
            except Exception as exc:  # the scrape itself is still recorded, as failed
                self._open.clear()
                log.exception("scrape of target %s at %s could not be stored", record.target_id, record.ts)
                failed = replace(record, up=False, samples_kept=0, error_class="storage_error",
                                 error=f"{type(exc).__name__}: {exc}"[:500], canonical=None)
                try:
                    self._write_transaction([failed])
                except Exception:
                    log.exception("target %s removed while its scrape was pending", record.target_id)
        return written

    def _bounds(self, bounds: tuple[float, ...]) -> str:
        """The series key's text of a histogram's bounds. An adapter hands the same tuple
        object every scrape of a page shape (its layouts are memoized), so the first lookup
        is by identity, without hashing ~30 floats. The entry holds the tuple, so its id cannot
        be reused while it is there; bounded, as adapters without a plan make new tuples each
        scrape."""
        hit = self._bounds_by_id.get(id(bounds))
        if hit is not None and hit[0] is bounds:
            return hit[1]
        text = self._bounds_text.get(bounds)
        if text is None:
            text = self._bounds_text[bounds] = encode_floats(bounds)
        if len(self._bounds_by_id) >= 4096:
            self._bounds_by_id.clear()
        self._bounds_by_id[id(bounds)] = (bounds, text)
        return text

    def _write_transaction(self, records: Sequence[ScrapeRecord]) -> None:
        new_series: dict[SeriesKey, int] = {}
        new_infos: dict[tuple[int, str, str, str], tuple[dict, float]] = {}
        with self.engine.begin() as conn:
            conn.execution_options(**{NOT_A_CHANGE: True})  # reaches reused answers by their age
            scrape_rows, sample_rows, infos = [], [], []
            level_rows: list[dict] = []
            feed = self._feed
            for r in records:
                scrape_rows.append((r.target_id, r.ts, r.up, r.duration, r.bytes, r.samples_seen, r.samples_kept,
                                    r.malformed, r.engine, r.error_class, r.error))
                c = r.canonical
                if c is None:
                    continue
                ms = to_millis(r.ts)
                histograms, scalars = [], []
                for h in c.histograms:
                    key = (r.target_id, h.signal, h.model, h.rank, self._bounds(h.bounds))
                    sid = (self._series.get(key) or new_series.get(key)
                           or self._resolve(conn, key, "histogram", new_series))
                    counts = encode_counts(h.counts)
                    histograms.append((sid, snapshot_blob(counts, h.sum, h.count)))
                    feed(sid, "histogram", r.ts, ms, (*h.counts, h.sum, h.count), counts, level_rows)
                for s in c.scalars:
                    key = (r.target_id, s.signal, s.model, s.rank, "")
                    sid = self._series.get(key) or new_series.get(key) or self._resolve(conn, key, s.kind, new_series)
                    if not math.isnan(s.value):
                        scalars.append((sid, s.value))
                        feed(sid, s.kind, r.ts, ms, (s.value,), None, level_rows)
                if histograms or scalars:
                    sample_rows.append((r.target_id, r.ts, encode_scrape(histograms, scalars)))
                for info in c.infos:
                    info_key = (r.target_id, info.name, info.model, info.rank)
                    known = new_infos.get(info_key) or self._infos.get(info_key)
                    if known is None or known[0] != info.labels or r.ts - known[1] >= INFO_REFRESH_SECONDS:
                        infos.append((r.target_id, info, r.ts))
                        new_infos[info_key] = (info.labels, r.ts)
            put_rows = _copy_rows if conn.dialect.name == "postgresql" else _insert_rows
            put_rows(conn, _SCRAPE_COLUMNS, scrape_rows)
            if sample_rows:
                _reopen_levels(conn, min(row[1] for row in sample_rows))
                put_rows(conn, _SAMPLE_COLUMNS, sample_rows)
            if level_rows:
                _insert_new_levels(conn, level_rows)
            for target_id, info, ts in infos:
                _upsert_info(conn, target_id, info.name, info.model, info.rank, info.labels, ts)
        self._series.update(new_series)
        self._infos.update(new_infos)

    def _feed(self, sid: int, kind: str, ts: float, ms: int, vector: tuple[float, ...], counts: bytes | None,
              finished: list[dict]) -> None:
        """One written sample (``ms``: ``to_millis(ts)``; ``counts``: a histogram's encoded
        counts) into its series' open interval; a finished interval's row goes to
        ``finished``. Skips a sample in the same millisecond as the last one kept, as
        :func:`app.store.levels.chunks_from_samples` does."""
        acc = self._open.get(sid)
        if acc is not None:
            if ts < acc.last_ts:
                pass  # out of order: what it holds is no longer the interval's samples in time order
            elif ms == acc.run.last_ms:
                return
            elif ms < acc.end_ms:
                acc.run.append(ms, vector)
                acc.last_ts, acc.last_counts = ts, counts
                return
            elif ms < acc.end_ms + self._step_ms:
                finished.append(acc.row(sid))
            # else more than an interval later (a gap, or a target written again after it was
            # handed over and back): no row, the round builds it from the raw samples - a
            # writer never puts in a row for an interval the round may have passed, or pruned
        step = self._step_ms
        self._open[sid] = _OpenInterval(kind, ms // step * step, step, ts, ms, vector, counts)

    @staticmethod
    def _resolve(conn: Connection, key: SeriesKey, kind: str, new_series: dict[SeriesKey, int]) -> int:
        target_id, signal, model, rank, bounds = key
        where = (Series.target_id == target_id, Series.signal == signal, Series.model == model,
                 Series.rank == rank, Series.bounds == bounds)
        sid = conn.scalar(select(Series.id).where(*where))
        if sid is None:
            sid = conn.execute(insert(Series).values(target_id=target_id, signal=signal, kind=kind, model=model,
                                                     rank=rank, bounds=bounds).returning(Series.id)).scalar_one()
        new_series[key] = sid
        return sid


# Scrape and sample rows are tuples in these column orders (Scrape, ScrapeSample).
_SCRAPE_COLUMNS = ("scrapes", ("target_id", "ts", "up", "duration", "bytes", "samples_seen", "samples_kept",
                               "malformed", "engine", "error_class", "error"))
_SAMPLE_COLUMNS = ("scrape_samples", ("target_id", "ts", "samples"))


def _insert_rows(conn: Connection, columns: tuple[str, tuple[str, ...]], rows: list[tuple]) -> None:
    """SQLite: one ``executemany`` with positional rows, straight to the driver: building
    the parameters through SQLAlchemy's ``insert()`` costs more than sqlite3 storing the
    rows (bench/ingest.py).
    """
    table, names = columns
    conn.exec_driver_sql(f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})", rows)


def _copy_rows(conn: Connection, columns: tuple[str, tuple[str, ...]], rows: list[tuple]) -> None:
    """PostgreSQL: scrape and sample rows go in with ``COPY`` inside the same transaction:
    multi-row INSERT statements cost more to build and to parse server-side than the rows
    themselves (bench/ingest.py).
    """
    table, names = columns
    cursor = conn.connection.driver_connection.cursor()
    try:
        with cursor.copy(f"COPY {table} ({', '.join(names)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    finally:
        cursor.close()


def _upsert_info(conn: Connection, target_id: int, name: str, model: str, rank: str, labels: dict, ts: float) -> None:
    where = (TargetInfo.target_id == target_id, TargetInfo.name == name, TargetInfo.model == model,
             TargetInfo.rank == rank)
    if conn.execute(update(TargetInfo).where(*where).values(labels=labels, ts=ts)).rowcount == 0:
        conn.execute(insert(TargetInfo).values(target_id=target_id, name=name, model=model, rank=rank,
                                               labels=labels, ts=ts))


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


@functools.lru_cache(maxsize=4096)
def _bounds(text: str) -> tuple[float, ...]:
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
    write reopened it, :func:`_reopen_levels`): False then, and the round stops there."""
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


def _reopen_levels(conn: Connection, oldest: float) -> None:
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
                        rows.append(_level_row(sid, kinds[sid], level, bucket_ms, c))
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


def _insert_new_levels(conn: Connection, rows: list[dict]) -> None:
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


def _level_row(sid: int, kind: str, level: int, bucket_ms: int, c: lv.Chunk,
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
    rows = _core_rows(session, select(Scrape.__table__).where(Scrape.id.in_(newest_ids)))
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


# --------------------------------------------------------------------------- diagnosis

def open_findings(session: Session, target_id: int, model: str) -> list[FindingRow]:
    return list(session.scalars(select(FindingRow).where(
        FindingRow.target_id == target_id, FindingRow.model == model, FindingRow.state.in_(("pending", "active")))))


def all_open_findings(session: Session) -> dict[tuple[int, str], list[FindingRow]]:
    """Every pending or active finding by (target id, model): one query for a whole round."""
    out: dict[tuple[int, str], list[FindingRow]] = defaultdict(list)
    for row in session.scalars(select(FindingRow).where(FindingRow.state.in_(("pending", "active")))):
        out[(row.target_id, row.model)].append(row)
    return out


def _finding_fields(payload: dict) -> dict:
    return {"severity": payload["severity"], "confidence": payload["confidence"], "is_primary": payload["primary"],
            "summary": payload["summary"],
            "details": {k: payload[k] for k in ("evidence", "remedies", "runbook", "caused_by", "window")}}


def create_finding(session: Session, target_id: int, model: str, regime: str, now: float, payload: dict,
                   flush: bool = True) -> FindingRow:
    """``flush`` False: a round writing many findings lets the commit insert them in one batch."""
    row = FindingRow(target_id=target_id, model=model, regime=regime, state="pending", first_seen=now,
                     last_seen=now, consecutive=1, clear_count=0, **_finding_fields(payload))
    session.add(row)
    if flush:
        session.flush()
    return row


def touch_finding(session: Session, row: FindingRow, now: float, payload: dict) -> None:
    """The regime fired again: refresh its evidence, extend the streak."""
    for key, value in _finding_fields(payload).items():
        setattr(row, key, value)
    row.last_seen = now
    row.consecutive += 1
    row.clear_count = 0


def clear_finding(session: Session, row: FindingRow, now: float) -> None:
    row.clear_count += 1
    row.consecutive = 0


def set_finding_state(session: Session, row: FindingRow, state: str, now: float, flush: bool = True) -> None:
    row.state = state
    if state == "active":
        row.activated_at = now
    elif state == "resolved":
        row.resolved_at = now
    if flush:
        session.flush()


def save_diagnosis(session: Session, target_id: int, model: str, verdict: str, now: float, details: dict,
                   rows: dict[tuple[int, str], DiagnosisRow] | None = None) -> None:
    """Insert or update a target/model's latest diagnosis. ``rows``: every stored diagnosis by
    (target id, model) when the caller saves a whole round (:func:`diagnosis_rows`, one query);
    without it the row is looked up and the change flushed at once."""
    row = session.get(DiagnosisRow, (target_id, model)) if rows is None else rows.get((target_id, model))
    digest = details_digest(details)
    if row is None:
        row = DiagnosisRow(target_id=target_id, model=model, verdict=verdict, evaluated_at=now, details=details,
                           digest=digest, digest_at=now)
        session.add(row)
        if rows is not None:
            rows[(target_id, model)] = row
    else:
        row.verdict, row.evaluated_at, row.details, row.digest, row.digest_at = verdict, now, details, digest, now
    if rows is None:
        session.flush()


def diagnosis_rows(session: Session) -> dict[tuple[int, str], DiagnosisRow]:
    """Every stored latest diagnosis by (target id, model), for a round's saves (their details,
    which the round replaces, are not loaded)."""
    return {(row.target_id, row.model): row
            for row in session.scalars(select(DiagnosisRow).options(defer(DiagnosisRow.details)))}


def details_digest(details: dict[str, Any]) -> str:
    """What a diagnosis' details are, in 32 hex digits (:func:`latest_diagnoses`)."""
    return hashlib.blake2b(json.dumps(details).encode(), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class LatestDiagnosis:
    """A target's and model's stored latest evaluation; ``details`` is shared between readers
    (:func:`latest_diagnoses`) and must not be changed. ``version`` stands for the details:
    their digest, or the stored text where the row has no digest of this evaluation."""

    target: str
    model: str
    verdict: str
    evaluated_at: float
    details: dict[str, Any]
    version: str = field(default="", repr=False, compare=False)


#: a version of stored details -> their decoded value, for the rows of the last whole-fleet read
#: (what is made is the stored text, or the value already decoded)
DECODED_DETAILS = KeptParts[str, str | dict[str, Any], dict[str, Any]](
    lambda made: made if isinstance(made, dict) else json.loads(made))

_DIAGNOSIS_HEAD = (Target.name, DiagnosisRow.model, DiagnosisRow.verdict, DiagnosisRow.evaluated_at,
                   DiagnosisRow.target_id, DiagnosisRow.digest, DiagnosisRow.digest_at)
#: rows whose details one statement fetches
DETAILS_PER_FETCH = 500


def _digest_of(evaluated_at: float, digest: str | None, digest_at: float | None) -> str | None:
    """The row's digest if it was written with this evaluation (an older writer leaves it behind)."""
    return digest if digest is not None and digest_at == evaluated_at else None


def latest_diagnoses(session: Session, target_id: int | None = None) -> list[LatestDiagnosis]:
    """The latest evaluation of every target and model (of ``target_id`` only). The details
    change once per diagnosis round, but fetching and decoding every target's (4-5 KB each)
    for every status page and ``/api/v1/diagnoses`` read would be most of what those reads
    cost at 1,000 targets. So the rows are read without them first; only the details whose
    digest the last whole-fleet read did not decode are fetched (with the rest of their row
    again, so a row is never half of one evaluation and half of the next). A row whose digest
    is not of its evaluation (written by a version that predates digests) is fetched and keyed
    by its text. Only a whole-fleet read replaces what is kept, so the cache never outgrows
    the table."""
    head = select(*_DIAGNOSIS_HEAD).join(Target, Target.id == DiagnosisRow.target_id)
    if target_id is not None:
        head = head.where(DiagnosisRow.target_id == target_id)
    kept = DECODED_DETAILS.kept  # held: a read in another thread replaces it, never changes it
    rows: list[tuple] = []  # (name, model, verdict, evaluated_at, version, made)
    missing: dict[tuple[int, str], int] = {}  # (target id, model) -> index in rows
    for name, model, verdict, at, tid, digest, digest_at in session.execute(head.order_by(Target.name,
                                                                                          DiagnosisRow.model)):
        current = _digest_of(at, digest, digest_at)
        details = None if current is None else kept.get(current)
        if details is None:
            missing[(tid, model)] = len(rows)
        rows.append((name, model, verdict, at, digest, details))
    keys = list(missing)
    for i in range(0, len(keys), DETAILS_PER_FETCH):
        full = select(*_DIAGNOSIS_HEAD, cast(DiagnosisRow.details, Text)).join(
            Target, Target.id == DiagnosisRow.target_id).where(
            tuple_(DiagnosisRow.target_id, DiagnosisRow.model).in_(keys[i:i + DETAILS_PER_FETCH]))
        for name, model, verdict, at, tid, digest, digest_at, text_ in session.execute(full):
            rows[missing.pop((tid, model))] = (name, model, verdict, at, _digest_of(at, digest, digest_at) or text_,
                                               text_)
    gone = set(missing.values())  # deleted between the two reads (their target was removed)
    rows = [row for i, row in enumerate(rows) if i not in gone]
    decoded = DECODED_DETAILS.parts(((version, made) for *_, version, made in rows), keep=target_id is None)
    return [LatestDiagnosis(name, model, verdict, at, details, version)
            for (name, model, verdict, at, version, _), details in zip(rows, decoded, strict=True)]


def open_finding_states(session: Session, target_id: int | None = None
                        ) -> dict[tuple[str, str, str], tuple[str, float | None]]:
    """(target, model, regime) -> (state, activated_at) of every pending or active finding
    (of ``target_id`` only), without their details."""
    query = select(Target.name, FindingRow.model, FindingRow.regime, FindingRow.state, FindingRow.activated_at
                   ).join(Target, Target.id == FindingRow.target_id).where(FindingRow.state.in_(("pending", "active")))
    if target_id is not None:
        query = query.where(FindingRow.target_id == target_id)
    return {(name, model, regime): (state, activated_at)
            for name, model, regime, state, activated_at in session.execute(query)}


def finding_history(session: Session, target_id: int | None = None, since: float | None = None,
                    states: tuple[str, ...] = ("pending", "active", "resolved"), limit: int = 500
                    ) -> list[tuple[str, FindingRow]]:
    query = select(Target.name, FindingRow).join(Target, Target.id == FindingRow.target_id).where(
        FindingRow.state.in_(states))
    if target_id is not None:
        query = query.where(FindingRow.target_id == target_id)
    if since is not None:
        query = query.where(FindingRow.last_seen >= since)
    return [(name, row) for name, row in session.execute(query.order_by(FindingRow.first_seen.desc()).limit(limit))]


# --------------------------------------------------------------------------- alerts

def open_alerts(session: Session) -> list[AlertRow]:
    return list(session.scalars(select(AlertRow).where(AlertRow.state.in_(("pending", "firing")))))


def get_alert(session: Session, fp: str) -> AlertRow | None:
    return session.get(AlertRow, fp)


def start_alert(session: Session, row: AlertRow | None, fp: str, labels: dict, annotations: dict, gk: str,
                now: float, value: float | None) -> AlertRow:
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


def create_silence(session: Session, silence_id: str, matchers: list[dict], starts_at: float, ends_at: float,
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


def save_receiver(session: Session, name: str, config: dict, source: str, now: float) -> ReceiverRow:
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


def sync_config_receivers(session: Session, receivers: Sequence[dict], now: float) -> None:
    wanted = {r["name"]: r for r in receivers}
    for row in list_receivers(session):
        if row.name not in wanted and row.source == "config":
            session.delete(row)
    for name, config in wanted.items():
        save_receiver(session, name, config, "config", now)
