"""Writing scrapes. Callers own the transaction boundary.

Hot path: :class:`SampleWriter` writes a batch of scrapes with one multi-row insert
per table (SQLAlchemy Core "executemany"/"insertmanyvalues", ``COPY`` on PostgreSQL), in
one transaction; a scrape's samples are one ``scrape_samples`` row.
Every scrape in the batch is therefore written completely or not at all. If the batch
fails (it should not), each scrape is retried in a transaction of its own so one bad
scrape can never drop the others. A scrape that would take its target past its
``stored_series_limit``, or whose new series' labels are longer than the columns keep, is
refused alone (:class:`Refused`): stored as a failed scrape, the rest of the batch as it is."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import islice

from sqlalchemy import (
    Engine,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from app.core.quantiles import to_millis
from app.store import levels as lv
from app.store.db import NOT_A_CHANGE
from app.store.encoding import (
    encode_counts,
    encode_scrape,
    snapshot_blob,
)
from app.store.models import (
    INFO_NAME_WIDTH,
    MODEL_WIDTH,
    RANK_WIDTH,
    Series,
    TargetInfo,
)
from app.store.record import ScrapeRecord
from app.store.repository import bounds_key, encode_floats, insert_new_levels, level_row, reopen_levels

log = logging.getLogger(__name__)


class DatabaseUnavailable(Exception):
    """The database could not be reached; nothing of the batch was written."""


SeriesKey = tuple[int, str, str, str, str]  # target_id, signal, model, rank, bounds_key
InfoKey = tuple[int, str, str, str]  # target_id, name, model, rank
INFO_REFRESH_SECONDS = 300.0  # an unchanged info row is rewritten (its ts refreshed) this often
#: the widths of the identity columns a page's labels fill (app/store/models.py)
_WIDTHS = {"model": MODEL_WIDTH, "rank": RANK_WIDTH, "info name": INFO_NAME_WIDTH}


class Refused(Exception):
    """A scrape the store does not take: ``error_class`` and a message naming the limit."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class

    def record(self, record: ScrapeRecord) -> ScrapeRecord:
        """``record`` as stored instead: down, nothing kept, this refusal its error."""
        return replace(record, up=False, samples_kept=0, error_class=self.error_class, error=str(self)[:1000],
                       canonical=None)


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
        return level_row(sid, self.kind, lv.LEVELS[0], self.bucket_ms, self.run.chunk(), counts)


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
    nothing); a failed transaction drops them all (they may hold samples not stored).

    What it caches of a target (series ids, open intervals, infos) is at most one entry per
    series and info row the target has stored, which its ``stored_series_limit`` bounds;
    ``on_refused`` is told of each scrape it refused, after the commit that stored it."""

    def __init__(self, engine: Engine, on_refused: Callable[[ScrapeRecord], None] | None = None) -> None:
        self.engine = engine
        self.on_refused = on_refused
        self._series: dict[SeriesKey, int] = {}
        self._bounds_keys: dict[tuple[float, ...], str] = {}
        self._bounds_by_id: dict[int, tuple[tuple[float, ...], str]] = {}
        # last written engine config per (target, name, model, rank): info pages rarely
        # change, and an UPDATE per info per scrape would be a fifth of the ingest CPU
        self._infos: dict[InfoKey, tuple[dict, float]] = {}
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
        """The series key's ``bounds_key`` of a histogram's bounds. An adapter hands the same
        tuple object every scrape of a page shape (its layouts are memoized), so the first
        lookup is by identity, without hashing ~30 floats. The entry holds the tuple, so its id
        cannot be reused while it is there; both maps bounded, as adapters without a plan make
        new tuples each scrape, and a target may change its bounds every scrape."""
        hit = self._bounds_by_id.get(id(bounds))
        if hit is not None and hit[0] is bounds:
            return hit[1]
        key = self._bounds_keys.get(bounds)
        if key is None:
            if len(self._bounds_keys) >= 4096:
                self._bounds_keys.clear()
            key = self._bounds_keys[bounds] = bounds_key(encode_floats(bounds))
        if len(self._bounds_by_id) >= 4096:
            self._bounds_by_id.clear()
        self._bounds_by_id[id(bounds)] = (bounds, key)
        return key

    def _write_transaction(self, records: Sequence[ScrapeRecord]) -> None:
        new_series: dict[SeriesKey, int] = {}
        new_infos: dict[InfoKey, tuple[dict, float]] = {}
        refused: list[ScrapeRecord] = []
        with self.engine.begin() as conn:
            conn.execution_options(**{NOT_A_CHANGE: True})  # reaches reused answers by their age
            scrape_rows, sample_rows, infos = [], [], []
            level_rows: list[dict] = []
            feed = self._feed
            for r in records:
                c = r.canonical
                sids: list[int] = []
                if c is not None:
                    try:
                        sids = self._series_ids(conn, r, new_series, new_infos)
                    except Refused as refusal:
                        r, c = refusal.record(r), None
                        refused.append(r)
                scrape_rows.append((r.target_id, r.ts, r.up, r.duration, r.bytes, r.samples_seen, r.samples_kept,
                                    r.malformed, r.engine, r.error_class, r.error))
                if c is None:
                    continue
                ms = to_millis(r.ts)
                histograms, scalars = [], []
                for h, sid in zip(c.histograms, sids):
                    counts = encode_counts(h.counts)
                    histograms.append((sid, snapshot_blob(counts, h.sum, h.count)))
                    feed(sid, "histogram", r.ts, ms, (*h.counts, h.sum, h.count), counts, level_rows)
                for s, sid in zip(c.scalars, islice(sids, len(c.histograms), None)):
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
                reopen_levels(conn, min(row[1] for row in sample_rows))
                put_rows(conn, _SAMPLE_COLUMNS, sample_rows)
            if level_rows:
                insert_new_levels(conn, level_rows)
            for target_id, info, ts in infos:
                _upsert_info(conn, target_id, info.name, info.model, info.rank, info.labels, ts)
        self._series.update(new_series)
        self._infos.update(new_infos)
        if self.on_refused is not None:
            for r in refused:
                self.on_refused(r)

    def _series_ids(self, conn: Connection, r: ScrapeRecord, new_series: dict[SeriesKey, int],
                    new_infos: dict[InfoKey, tuple[dict, float]]) -> list[int]:
        """The series ids of a record's histograms, then of its scalars. A series (or info)
        that neither the cache nor this transaction knows goes through :meth:`_admit`."""
        c, tid, key_of, known = r.canonical, r.target_id, self._bounds, self._series
        assert c is not None
        keys = [(tid, h.signal, h.model, h.rank, key_of(h.bounds)) for h in c.histograms]
        keys += [(tid, s.signal, s.model, s.rank, "") for s in c.scalars]
        sids = [known.get(k) or new_series.get(k) for k in keys]
        unknown_infos = {key for i in c.infos
                         if (key := (tid, i.name, i.model, i.rank)) not in self._infos and key not in new_infos}
        if None in sids or unknown_infos:
            self._admit(conn, r, keys, sids, unknown_infos, new_series)
            sids = [known.get(k) or new_series.get(k) for k in keys]
        return sids  # type: ignore[return-value]  # every key resolved by _admit

    def _admit(self, conn: Connection, r: ScrapeRecord, keys: list[SeriesKey], sids: list[int | None],
               infos: set[InfoKey], new_series: dict[SeriesKey, int]) -> None:
        """Resolve the record's series not cached (``sids`` None) from the database, and insert
        those it does not have, unless the target's series and info rows would then be more
        than ``r.stored_series_limit``, or a new one's labels wider than its columns: then
        :class:`Refused`, and nothing of the record is written. Reads the target's series and
        info identities (at most its limit of rows): run on a new model, a restart, a refusal."""
        c, tid = r.canonical, r.target_id
        assert c is not None
        kinds = ["histogram"] * len(c.histograms) + [s.kind for s in c.scalars]
        bounds = dict(zip(keys, (h.bounds for h in c.histograms)))
        missing = {k: kind for k, sid, kind in zip(keys, sids, kinds) if sid is None}
        stored = {(tid, *row[1:]): row[0] for row in conn.execute(
            select(Series.id, Series.signal, Series.model, Series.rank, Series.bounds_key)
            .where(Series.target_id == tid))}
        stored_infos = {(tid, *row) for row in conn.execute(
            select(TargetInfo.name, TargetInfo.model, TargetInfo.rank).where(TargetInfo.target_id == tid))}
        new = [k for k in missing if k not in stored]
        fresh = [k for k in infos if k not in stored_infos]
        both: list[tuple] = [*new, *fresh]
        for what, at, among in (("model", 2, both), ("rank", 3, both), ("info name", 1, fresh)):
            longest = max((len(k[at]) for k in among), default=0)
            if longest > _WIDTHS[what]:
                raise Refused("label_too_long", f"a new series' {what} label has {longest:,} characters; "
                                                f"the store keeps at most {_WIDTHS[what]}")
        limit, have = r.stored_series_limit, len(stored) + len(stored_infos)
        if limit is not None and both and have + len(both) > limit:
            raise Refused("too_many_series", f"the page has {len(both):,} new series and the target "
                                             f"{have:,} stored, over its stored_series_limit of {limit:,}; "
                                             "nothing of it was stored: raise the limit, or delete the target to "
                                             "drop its series")
        new_series.update((k, stored[k]) for k in missing if k in stored)
        if new:
            rows = [{"target_id": tid, "signal": k[1], "kind": missing[k], "model": k[2], "rank": k[3],
                     "bounds": encode_floats(bounds[k]) if k in bounds else "", "bounds_key": k[4]} for k in new]
            ids = conn.scalars(insert(Series).returning(Series.id, sort_by_parameter_order=True), rows).all()
            new_series.update(zip(new, ids))

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
