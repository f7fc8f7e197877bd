"""Scraping jobs: one APScheduler interval job per target, plus the batch writer.

The scheduler itself belongs to the service (:mod:`app.runtime.scheduling`); the scrape service adds,
replaces and removes its ``scrape:<target>`` jobs on it.

Each target's first run is offset by a stable fraction of its interval derived from its
name (as Prometheus spreads its scrapes), so 500 targets with a 15 s interval do not
all fire in the same millisecond; ``scrape_jitter`` adds a little per-run randomness on
top. Jobs never overlap (``max_instances=1``) and a missed run is coalesced rather than
replayed.

Scrape results go into an in-memory list that a single flusher writes every
``write_batch_interval`` in one database transaction, off the event loop thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import gc
import logging
import time
import zlib
from collections.abc import Callable
from typing import Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import Counter, Gauge, Histogram
from sqlalchemy import Engine

from app.scrape.client import DEFAULT_MAX_PAGE_BYTES, PageFetcher
from app.scrape.jobs import ScrapeSpec, TargetScraper
from app.store.record import ScrapeRecord
from app.store.writer import DatabaseUnavailable, SampleWriter


class ScrapeTelemetry(Protocol):
    """What the scrape path records in the service's telemetry (:class:`app.telemetry.Telemetry`,
    which sits above it: it also collects probe and diagnosis results)."""

    writes: Counter
    write_seconds: Histogram
    queue_depth: Gauge
    not_owned: Counter

    def record_scrape(self, target: str, up: bool, error_class: str | None, duration: float, size: int,
                      kept: int, malformed: int, ts: float) -> None: ...

    def record_refused(self, target: str, ts: float) -> None: ...

    def forget_target(self, target: str) -> None: ...

log = logging.getLogger(__name__)
MAX_PENDING = 200_000  # scrapes held in memory while the database is unreachable


def tune_collector() -> None:
    """Scraping allocates many short-lived objects (samples, rows); with CPython's default
    generation-0 threshold (700) the cyclic collector takes about a tenth of ingest CPU
    (``bench/ingest.py``). A higher threshold, plus ``gc.freeze()`` of the long-lived state
    (parsers' caches, series ids) after the first write, cuts that to a few percent."""
    gc.set_threshold(50_000, 20, 100)


class ScrapeService:
    def __init__(self, engine: Engine, telemetry: ScrapeTelemetry, scheduler: AsyncIOScheduler, *,
                 max_concurrency: int = 64,
                 max_bytes: int = DEFAULT_MAX_PAGE_BYTES, connect_timeout: float = 3.0, jitter: float = 0.05,
                 write_interval: float = 0.5,
                 on_engine_detected: Callable[[int, str], None] | None = None,
                 owns: Callable[[str], bool] | None = None) -> None:
        self.telemetry = telemetry
        self.fetcher = PageFetcher(max_concurrency, max_bytes, connect_timeout)
        self.writer = SampleWriter(engine, self._refused)
        self.scheduler = scheduler  # the service's (app.runtime.scheduling); started and shut down by its owner
        self.scrapers: dict[str, TargetScraper] = {}
        self.jitter = jitter
        self.write_interval = write_interval
        self.on_engine_detected = on_engine_detected
        self.owns = owns  # replicas: may this replica scrape (and write) the target now? None: always
        self._pending: list[ScrapeRecord] = []
        self._flush_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._inflight = 0
        self._frozen = False
        self._reported_engines: dict[str, str] = {}  # target -> engine already stored as detected
        self._names: dict[int, str] = {}  # target id -> name, of the scheduled targets
        self._refusals = 0  # scrapes the writer refused (app.store.writer.Refused), ever

    # ------------------------------------------------------------------ lifecycle
    async def start(self, targets: list[ScrapeSpec]) -> None:
        tune_collector()
        await self.fetcher.start()
        self.sync_targets(targets)
        self._flush_task = asyncio.create_task(self._flush_loop(), name="scrape-writer")

    async def stop(self, grace: float = 5.0) -> None:
        """Stop scheduling scrapes, let in-flight ones finish (up to ``grace`` s), write everything."""
        self._stopping = True
        for name in list(self.scrapers):
            self._unschedule(name)
        deadline = time.monotonic() + grace
        while self._inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._flush_task is not None:
            self._flush_task.cancel()
            try:
                await self._flush_task
            except asyncio.CancelledError:
                pass
        await self.flush()  # nothing scraped is lost on a clean shutdown
        await self.fetcher.close()

    # ------------------------------------------------------------------ targets
    def sync_targets(self, targets: list[ScrapeSpec], immediate: set[str] | frozenset[str] = frozenset()) -> None:
        """Make the scheduled jobs match ``targets`` (add, replace changed, remove gone).
        A new target named in ``immediate`` (taken over from a dead replica) is scraped at
        once instead of at its usual offset in the interval."""
        wanted = {t.name: t for t in targets}
        for name in list(self.scrapers):
            if name not in wanted or wanted[name] != self.scrapers[name].spec:
                self._remove(name)
        for name, spec in wanted.items():
            if name not in self.scrapers:
                self._add(spec, now=name in immediate)

    def _add(self, spec: ScrapeSpec, now: bool = False) -> None:
        scraper = TargetScraper(spec, self.fetcher, functools.partial(self._accept, spec.name), self._on_result)
        self.scrapers[spec.name] = scraper
        self._names[spec.id] = spec.name
        offset = 0.0 if now else (zlib.crc32(spec.name.encode()) % 10_000) / 10_000 * spec.interval
        first = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset)
        self.scheduler.add_job(
            self._run_job, IntervalTrigger(seconds=spec.interval, start_date=first, jitter=self.jitter * spec.interval),
            id=f"scrape:{spec.name}", name=f"scrape {spec.name}", max_instances=1, coalesce=True,
            misfire_grace_time=max(1, int(spec.interval)), replace_existing=True, next_run_time=first,
            args=(scraper,),
        )

    async def _run_job(self, scraper: TargetScraper) -> None:
        if self.owns is not None and not self.owns(scraper.spec.name):
            self.telemetry.not_owned.labels("scrape").inc()
            return  # handed over: the event loop has not removed the job yet (app.replicas.membership.Ownership.holds)
        self._inflight += 1
        try:
            await scraper.run()
        finally:
            self._inflight -= 1

    def _remove(self, name: str) -> None:
        scraper = self.scrapers.pop(name, None)
        self._reported_engines.pop(name, None)
        self._unschedule(name)
        if scraper is not None:
            self._names.pop(scraper.spec.id, None)
            self.telemetry.forget_target(name)

    def _unschedule(self, name: str) -> None:
        try:
            self.scheduler.remove_job(f"scrape:{name}")
        except Exception:  # JobLookupError: not scheduled, or the scheduler is shut down already
            pass

    def forget_target(self, target_id: int) -> None:
        """Drop what the writer caches about a deleted target (its series ids), so a new
        target that reuses the id starts clean."""
        self.writer.forget_target(target_id)

    def _accept(self, name: str, record: ScrapeRecord) -> None:
        """Queue a scrape for writing, unless its target was handed over while it ran: then the
        new owner scrapes it, and this record (started before, finished after) must not be
        written beside the new owner's."""
        if self.owns is not None and not self.owns(name):
            self.telemetry.not_owned.labels("write").inc()
            return
        self._pending.append(record)

    def _refused(self, record: ScrapeRecord) -> None:
        """The writer stored ``record`` as refused (from its thread, inside :meth:`flush`)."""
        self._refusals += 1
        name = self._names.get(record.target_id)
        if name is not None:
            self.telemetry.record_refused(name, record.ts)

    def _on_result(self, spec: ScrapeSpec, record: ScrapeRecord) -> None:
        self.telemetry.record_scrape(spec.name, record.up, record.error_class, record.duration, record.bytes,
                                     record.samples_kept, record.malformed, record.ts)
        self.telemetry.queue_depth.set(len(self._pending))
        if record.engine and self.on_engine_detected is not None and spec.engine == "auto":
            if self._reported_engines.get(spec.name) != record.engine:
                self._reported_engines[spec.name] = record.engine
                self.on_engine_detected(spec.id, record.engine)

    async def scrape_now(self, name: str) -> ScrapeRecord:
        """Run one scrape of ``name`` immediately (API 'scrape now', tests, the diagnose command)."""
        return await self.scrapers[name].run()

    # ------------------------------------------------------------------ writing
    async def _flush_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.write_interval)
            try:
                await self.flush()
            except Exception:  # keep the writer alive; records stay queued for the next try
                log.exception("flushing scrapes failed")

    async def flush(self) -> int:
        async with self._flush_lock:
            if not self._pending:
                return 0
            batch, self._pending[:] = list(self._pending), []
            started, refusals = time.perf_counter(), self._refusals
            try:
                written = await asyncio.to_thread(self.writer.write, batch)
            except DatabaseUnavailable:
                # Keep the scrapes and try again next flush; bounded so an outage of
                # hours cannot exhaust memory (oldest dropped first, and counted).
                self._pending[:0] = batch
                overflow = len(self._pending) - MAX_PENDING
                if overflow > 0:
                    del self._pending[:overflow]
                    self.telemetry.writes.labels("dropped").inc(overflow)
                raise
            if not self._frozen:
                gc.freeze()  # what exists after the first write is long-lived
                self._frozen = True
            self.telemetry.write_seconds.observe(time.perf_counter() - started)
            refused = self._refusals - refusals
            self.telemetry.writes.labels("ok").inc(written - refused)
            if written < len(batch):
                self.telemetry.writes.labels("error").inc(len(batch) - written)
            self.telemetry.queue_depth.set(len(self._pending))
            return written
