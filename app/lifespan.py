"""Builds every long-lived resource of the service, starts it and tears it down again.

The :class:`Monitor` is the composition root: it wires the database, the one scheduler
(:mod:`app.runtime.scheduling`), the scrape service, the probe jobs and the outbox worker together,
and schedules each periodic round, which lives in its feature as a plain function:

* :func:`app.store.retention.prune` - retention,
* :func:`app.summaries.refresh_summaries` - latency gauges on ``/metrics``,
* :func:`app.diagnosis.rounds.evaluate_diagnoses` - the diagnosis round,
* :func:`app.alerts.rounds.evaluate_alerts` - the alerting round,
* :func:`app.probe.canary.sync_canaries` - one canary job per target that enables it.

With more than one replica (:mod:`app.replicas.membership`) each one scrapes (and runs the canaries
of) only the targets it owns, re-read every heartbeat, and only the leader runs the
diagnosis, alert and retention rounds and delivers notifications.

Nothing is created at import time: ``create_app(settings)`` is cheap and a test can
build as many isolated apps as it likes. The Monitor is the typed state the routes reach
through ``app.state.monitor`` (:mod:`app.api.deps`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import IO, TypeVar

from fastapi import FastAPI
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from app import summaries
from app.alerts import repository as alert_repository
from app.alerts import rounds as alert_rounds
from app.alerts.config import AlertsConfig
from app.alerts.delivery import DeliveryWorker
from app.attribution import reads as events_reads
from app.attribution import repository as events_repository
from app.attribution import rounds as events_rounds
from app.attribution.events import ChangeEvent
from app.config import ConfigError, load_config
from app.diagnosis import capacity
from app.diagnosis import rounds as diagnosis_rounds
from app.diagnosis.config import DiagnosisConfig
from app.diagnosis.profile import prefill_seconds_per_token
from app.probe import canary
from app.probe import repository as probe_repository
from app.probe.canary import CanaryConfig
from app.probe.jobs import ProbeJobs
from app.promsource.mirror import SHARED_LAG
from app.promsource.service import SourceService
from app.replicas import membership as replicas
from app.runtime import malloc, scheduling
from app.runtime.changes import Changing
from app.scrape.discovery import DiscoveryService
from app.scrape.jobs import ScrapeSpec
from app.scrape.scheduler import ScrapeService
from app.settings import Settings
from app.slo import repository as slo_repository
from app.slo.config import SloObjective
from app.store import db, retention
from app.store.models import DISCOVERED_BY_SOURCES
from app.targets import repository as target_repository
from app.telemetry import Telemetry
from app.windows import WindowError, Windows
from app.windows.prometheus import PrometheusWindows
from app.windows.store import StoreWindows

log = logging.getLogger(__name__)
T = TypeVar("T")


class Monitor:
    """The running service: database, scheduler, scraper, probe jobs, outbox, telemetry."""

    #: the status page's numbers, from the last diagnosis round
    round_summaries = Changing[diagnosis_rounds.RoundSummaries]()
    #: ``GET /api/v1/latency``'s default window, from the last summary round
    fleet_summary = Changing[summaries.FleetSummary]()

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine: Engine = db.make_engine(settings.effective_database_url)
        self.sessions: sessionmaker[Session] = db.make_sessionmaker(self.engine)
        self.telemetry = Telemetry()
        self.scheduler = scheduling.make_scheduler()
        self.scraping = ScrapeService(
            self.engine, self.telemetry, self.scheduler, max_concurrency=settings.max_concurrent_scrapes,
            max_bytes=settings.max_page_bytes, connect_timeout=settings.connect_timeout,
            jitter=settings.scrape_jitter, write_interval=settings.write_batch_interval,
            on_engine_detected=self._engine_detected,
            owns=None if self.engine.dialect.name == "sqlite" else self._owns,  # SQLite: one replica
        )
        self.probe_jobs = ProbeJobs(self.sessions, on_finished=self.telemetry.probes.observe)
        self.started_at = time.time()
        self.diagnosis_config = DiagnosisConfig()
        self.alerts_config = AlertsConfig()
        self.slos: list[SloObjective] = []
        self.delivery = DeliveryWorker(self.sessions, functools.partial(alert_rounds.load_receivers, self.sessions),
                                       settings.secret,
                                       on_attempt=self._delivery_attempted)
        self._delivery_task: asyncio.Task[None] | None = None
        self.sources = SourceService(on_view=self._source_view, mirror_lag=SHARED_LAG)
        self.telemetry.sources.bad_series = lambda: [(s.name, s.bad_series) for s in self.sources.statuses()]
        self.windows = Windows(StoreWindows(), PrometheusWindows(self.sources))  # every read of a window
        self.discovery = DiscoveryService(self.sessions, settings.allowed_target_hosts, self.reload_targets)
        replica_id = settings.replica_id or replicas.default_replica_id()
        self.membership = replicas.Membership(self.sessions, replica_id, settings.replica_expiry)
        self.lease = replicas.Lease(self.sessions, replica_id, settings.replica_expiry)
        self.leader_sessions = self.lease.fenced_sessions(self.sessions)  # leader rounds' transactions
        self.ownership = replicas.Ownership(replica_id, 1.5 * settings.replica_heartbeat)
        self._replica_threads_started: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._replica_threads = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="replica")
        self._sqlite_lock: IO[str] | None = None  # held while this process uses a SQLite file
        self._canaries: dict[str, tuple[ScrapeSpec, CanaryConfig]] | None = None  # as last scheduled
        self._reloading = asyncio.Lock()  # one reload_targets at a time (made again in start(), on its loop)

    @property
    def external_url(self) -> str:
        """This service's external URL for links (runbooks): ``alerts.external_url`` of the
        targets YAML, else ``LLM_LATENCY_PUBLIC_URL``; "" when neither is set (links are then
        paths on this service)."""
        return (self.alerts_config.external_url or self.settings.public_url).rstrip("/")

    # ------------------------------------------------------------------ startup
    def prepare_database(self) -> None:
        """SQLite upgrades itself; a server database must be migrated explicitly
        (``llm-latency db upgrade``), so a rollout never migrates by surprise."""
        url = self.settings.effective_database_url
        if self.engine.dialect.name == "sqlite":
            if self._sqlite_lock is None:  # one process per SQLite file, refused before it migrates
                path = db.sqlite_path(url)
                created = path is not None and not path.exists()
                self._sqlite_lock = replicas.lock_sqlite_file(url, self.membership.id)
                if path is not None:  # said once, at start-up: where the data lives
                    log.info("%s the SQLite database %s", "created" if created else "using", path)
            db.upgrade(url)
            return
        head = db.head_revision()
        current = db.current_revision(self.engine)
        if current != head:
            raise RuntimeError(
                f"database schema is at revision {current or 'none'}, the service needs {head}: "
                "run `llm-latency db upgrade` first"
            )

    def load_config_targets(self) -> None:
        if self.settings.config_file is None:
            return
        config = load_config(self.settings.config_file, self.settings.allowed_target_hosts)
        self.diagnosis_config = config.diagnosis
        self.alerts_config = config.alerts
        self.slos = config.slos
        self.delivery.max_age = config.alerts.max_delivery_age
        self.sources.configure(config.sources)
        self.discovery.configure(config, self.settings.config_file.parent)
        with self.sessions.begin() as session:
            target_repository.sync_config_targets(session, [t.model_dump(mode="json") for t in config.targets])
            alert_repository.sync_config_receivers(session,
                                                   [r.model_dump(mode="json") for r in config.alerts.receivers],
                                             time.time())

    def target_specs(self) -> list[ScrapeSpec]:
        s = self.settings
        with self.sessions() as session:
            return [
                ScrapeSpec(t.id, t.name, t.url, t.engine, t.scrape_interval or s.default_scrape_interval,
                           min(t.scrape_timeout or s.default_scrape_timeout,
                               t.scrape_interval or s.default_scrape_interval), dict(t.labels),
                           t.sample_limit or s.default_sample_limit, t.series_limit or s.default_series_limit,
                           t.stored_series_limit or s.default_stored_series_limit)
                for t in target_repository.list_targets(session)
                if t.source not in DISCOVERED_BY_SOURCES and t.gone_at is None
            ]

    async def reload_targets(self) -> None:
        """Scrape (and run the canaries of) the targets this replica owns, as of now. One
        reload at a time: the heartbeat's, discovery's and an API write's run concurrently on
        the loop, and a reload that read the targets before a write committed and synced after
        the write's own reload dropped the new target's scraper again (a `scrape now` right
        after creating the target then found none)."""
        async with self._reloading:
            specs = await self._in_replica_thread(self.target_specs)
            owned, taken_over = self.ownership.update([s.name for s in specs], self.membership.live, time.time())
            self.scraping.sync_targets([s for s in specs if s.name in owned], immediate=taken_over)
            await self._sync_canaries()

    async def _sync_canaries(self) -> None:
        """The canary jobs of the owned targets that enable one; only when they changed, since
        re-adding a job restarts its interval (this runs every heartbeat)."""
        configs = await self._in_replica_thread(functools.partial(canary.canary_configs, self.sessions))
        owned = self.ownership.owned
        wanted = {name: config for name, config in configs.items() if name in owned}
        if wanted != self._canaries:
            canary.sync_canaries(self.scheduler, self.sessions, wanted, on_result=self.telemetry.probes.observe)
            self._canaries = wanted

    def _heartbeat_main(self, loop: asyncio.AbstractEventLoop) -> None:
        """The heartbeat thread: every ``replica_heartbeat`` renew this replica's heartbeat and
        have the event loop re-read the targets and the live replicas and scrape what this
        replica owns now (sooner when a hand-over is due). A thread, not a task: a busy event
        loop (hundreds of pages to parse) is late with its scrapes but still alive, and must
        not look dead to the others, who would then scrape its targets too."""
        pending: concurrent.futures.Future[None] | None = None
        while True:
            try:
                self.membership.beat()
            except Exception:
                log.exception("replica heartbeat failed")
            if pending is None or pending.done():  # never queue a second reload behind a slow one
                pending = asyncio.run_coroutine_threadsafe(self._reload_logged(), loop)
            delay = self.settings.replica_heartbeat
            handover = self.ownership.next_change_at()
            if handover is not None:
                delay = min(delay, max(0.05, handover - time.time()))
            if self._stopping.wait(delay):
                return

    async def _reload_logged(self) -> None:
        try:
            await self.reload_targets()
        except Exception:
            log.exception("updating the owned targets failed")

    def _lease_main(self) -> None:
        """The lease thread: renew (or try to take) the leader lease every heartbeat, apart
        from the heartbeat itself (a renewal may wait a moment for a leader round's commit)."""
        while True:
            try:
                self.lease.renew()
            except Exception:
                log.exception("renewing the leader lease failed")
            if self._stopping.wait(self.settings.replica_heartbeat):
                return

    async def _in_replica_thread(self, func: Callable[[], T]) -> T:
        """Ownership updates read the database in threads of their own: rounds that fill the
        default pool must not hold up a hand-over."""
        return await asyncio.get_running_loop().run_in_executor(self._replica_threads, func)

    def _leader_only(self, func: Callable[[sessionmaker[Session]], object]) -> Callable[[], object]:
        """A round only the lease holder runs, every transaction of it fenced by the lease."""
        def run() -> object:
            if not self.lease.held:
                return None
            try:
                return func(self.leader_sessions)
            except replicas.NotLeader as exc:
                log.info("round stopped: %s", exc)
                return None
        run.__name__ = getattr(func, "__name__", "leader_round")
        return run

    def _engine_detected(self, target_id: int, engine: str) -> None:
        def store() -> None:
            with self.sessions.begin() as session:
                target_repository.set_detected_engine(session, target_id, engine)
        asyncio.get_running_loop().run_in_executor(None, store)

    def _source_view(self, target: str, up: bool, ts: float) -> None:
        """A source's replica as its Prometheus saw it this round: ``llm_latency_target_up``."""
        self.telemetry.targets.record(target, up=up, ts=ts)

    def _owns(self, target: str) -> bool:
        """The scrape path's ownership check, right before a scrape and before its result is
        queued (:meth:`app.replicas.membership.Ownership.holds`; fenced by the heartbeat's age)."""
        return self.ownership.holds(target, self.membership.view, time.time())

    def forget_target(self, target_id: int) -> None:
        """Before a target is deleted: drop what the running service caches about it."""
        self.scraping.forget_target(target_id)

    # ------------------------------------------------------------------ periodic rounds (app.runtime.scheduling)
    # Each round lives in its feature; these bind it to this service's parts for tests and
    # benchmarks that drive a round themselves (``now`` explicit) and for the scheduler.
    def refresh_summaries(self) -> None:
        summaries.refresh_summaries(self.sessions, self.settings.latency_window, self.telemetry.derived,
                                    windows=self.windows, keep=self._keep_fleet_summary)

    def _summaries_round(self) -> None:
        """The scheduled summary round, after which the memory freed by the rounds and the
        requests goes back to the system (``app.runtime.malloc``; this round runs the most regularly)."""
        self.refresh_summaries()
        malloc.release()

    def _keep_fleet_summary(self, kept: summaries.FleetSummary) -> None:
        self.fleet_summary = kept

    def evaluate_diagnoses(self, now: float | None = None,
                           sessions: sessionmaker[Session] | None = None) -> list[diagnosis_rounds.RoundResult]:
        results = diagnosis_rounds.evaluate_diagnoses(sessions or self.sessions, self.diagnosis_config,
                                                      self.telemetry.diagnosis, now, windows=self.windows,
                                                      keep=self._keep_round_summaries)
        self.telemetry.capacity.assessments = capacity.assess_all(
            self.telemetry.diagnosis.diagnoses, self.diagnosis_config.thresholds, self.telemetry.slo.statuses)
        return results

    def detect_changes(self, now: float | None = None,
                       sessions: sessionmaker[Session] | None = None) -> list[ChangeEvent]:
        """The change events round (:mod:`app.attribution.rounds`) over the last ``changes_interval``."""
        return events_rounds.detect_events(sessions or self.sessions, self.windows, self.settings.changes_interval,
                                           now, telemetry=self.telemetry.changes)

    def _keep_round_summaries(self, kept: diagnosis_rounds.RoundSummaries) -> None:
        self.round_summaries = kept

    def next_diagnosis_at(self) -> float:
        """When the next diagnosis round starts (unix seconds), so the status page can tell a
        target that was never evaluated how long it waits: the scheduler's next run of the
        job, or one interval after the service started if the job is not scheduled yet."""
        next_run = scheduling.next_run_at(self.scheduler, scheduling.DIAGNOSIS_JOB)
        return next_run if next_run is not None else self.started_at + self.diagnosis_config.interval

    def evaluate_alerts(self, now: float | None = None,
                        sessions: sessionmaker[Session] | None = None) -> dict[str, int]:
        generator = (self.settings.public_url.rstrip("/") or f"http://{self.settings.host}:{self.settings.port}")
        return alert_rounds.evaluate_alerts(sessions or self.sessions, self.alerts_config,
                                            generator_url=f"{generator}/api/v1/alerts",
                                            eval_interval=self.settings.alert_interval, telemetry=self.telemetry,
                                            now=now, windows=self.windows, slos=self.slos,
                                            retention=self.settings.retention, what_changed=self.what_changed)

    def what_changed(self, session: Session, target_name: str, now: float, since: float) -> str | None:
        """A firing alert's ``what_changed`` annotation: its target's attribution in one sentence,
        over the time since its condition began (and the diagnosis window before: the change that
        made it true), 2 minutes to an hour, against the same time before it or before the last
        change event in it, ending where the round's read of the target ends (a source's raw
        samples: their last refresh, so it reads no query where they hold both windows); None
        when it cannot be read now."""
        target = target_repository.get_target(session, target_name)
        if target is None:
            return None
        window = min(3600.0, max(120.0, now - since + self.diagnosis_config.window))
        end = self.windows.shared_end(target, now)  # where the round's read ends: its condition's numbers
        try:
            found = events_reads.what_changed(self.windows, session, target, end,
                                              prefill_seconds_per_token(target.hardware), window=window,
                                              lookback=window, fallbacks=("previous",))
        except WindowError:
            return None
        return found.summary if found is not None else None

    def _prune_slo_increments(self, session: Session, before: float) -> int:
        """SLO increments are kept for their SLO's period, not the samples' retention."""
        return slo_repository.prune(session, {s.name: s.period for s in self.slos}, before + self.settings.retention)

    def _delivery_attempted(self, receiver: str, ok: bool, latency: float) -> None:
        self.telemetry.deliveries.labels(receiver, "ok" if ok else "error").inc()

    async def _delivery_loop(self) -> None:
        while True:
            try:
                if self.lease.held:  # the outbox's row claims keep a second sender off a row anyway
                    await self.delivery.run_once()
            except Exception:
                log.exception("delivering notifications failed")
            await asyncio.sleep(self.settings.delivery_interval)

    async def start(self) -> None:
        malloc.configure()  # large buffers are mapped and unmapped, not left as holes in the heap
        self._reloading = asyncio.Lock()  # this loop's: a lock that waited once belongs to its loop
        try:
            await asyncio.to_thread(self.prepare_database)
            await asyncio.to_thread(self.load_config_targets)
        except BaseException:
            self.engine.dispose()  # refuse to start without leaking connections
            if self._sqlite_lock is not None:
                self._sqlite_lock.close()
                self._sqlite_lock = None
            raise
        await self._in_replica_thread(self.membership.beat)
        try:
            await self._in_replica_thread(self.lease.renew)
        except Exception:  # e.g. the lease row is locked by a commit: the lease loop tries again
            log.exception("taking the leader lease failed")
        self.scheduler.start()
        await self.scraping.start([])
        await self.reload_targets()
        await self.discovery.start(self.scheduler)
        s = self.settings

        def prune_round(sessions: sessionmaker[Session]) -> object:
            return retention.prune(sessions, s.retention, raw_retention=s.raw_retention,
                                   also={"probe_runs": probe_repository.prune,  # features' own tables
                                         "slo_increments": self._prune_slo_increments,
                                         "change_events": events_repository.prune})

        observe = self.telemetry.observe_round  # every round's duration and overruns in /metrics
        scheduling.watch_skips(self.scheduler, self.telemetry.round_skipped)
        scheduling.add_round(self.scheduler, scheduling.PRUNE_JOB, self._leader_only(prune_round), s.prune_interval,
                             observe)
        scheduling.add_round(self.scheduler, scheduling.DOWNSAMPLE_JOB, self._leader_only(retention.downsample),
                             s.downsample_interval, observe)
        phases = scheduling.PHASES  # the three rounds that read every target's window, out of step
        scheduling.add_round(self.scheduler, scheduling.SUMMARIES_JOB, self._summaries_round, s.summary_interval,
                             observe, phases[scheduling.SUMMARIES_JOB])
        scheduling.add_round(self.scheduler, scheduling.DIAGNOSIS_JOB,
                             self._leader_only(lambda sessions: self.evaluate_diagnoses(sessions=sessions)),
                             self.diagnosis_config.interval, observe, phases[scheduling.DIAGNOSIS_JOB])
        scheduling.add_round(self.scheduler, scheduling.ALERTS_JOB,
                             self._leader_only(lambda sessions: self.evaluate_alerts(sessions=sessions)),
                             s.alert_interval, observe, phases[scheduling.ALERTS_JOB])
        scheduling.add_round(self.scheduler, scheduling.CHANGES_JOB,
                             self._leader_only(lambda sessions: self.detect_changes(sessions=sessions)),
                             s.changes_interval, observe, phases[scheduling.CHANGES_JOB])
        await self.delivery.start()
        self._delivery_task = asyncio.create_task(self._delivery_loop(), name="outbox")
        self._replica_threads_started = [
            threading.Thread(target=self._heartbeat_main, args=(asyncio.get_running_loop(),), daemon=True,
                             name="replica-heartbeat"),
            threading.Thread(target=self._lease_main, daemon=True, name="leader-lease")]
        for thread in self._replica_threads_started:
            thread.start()

    async def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.pause()  # no new round or scrape starts while the rest winds down
        await self.probe_jobs.shutdown()  # running probes record their cancellation
        self._stopping.set()
        if self._delivery_task is not None:
            self._delivery_task.cancel()
            try:
                await self._delivery_task
            except asyncio.CancelledError:
                pass
        await self.delivery.close()
        self.sources.close()
        await self.scraping.stop()
        await self.discovery.close()
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self._replica_threads_started:  # started: hand targets and the lease over now, not after the expiry
            for thread in self._replica_threads_started:
                await asyncio.to_thread(thread.join, 30)
            try:
                await self._in_replica_thread(self.lease.release)
                await self._in_replica_thread(self.membership.leave)
            except Exception:
                log.exception("leaving the replicas table failed (the others take over after the expiry)")
        self._replica_threads.shutdown(wait=False)
        await self._wait_for_connections_returned()
        self.engine.dispose()
        # Work handed to a thread just before the stop (a delivery poll, a round, a detected
        # engine's write) may reach the database only now, after the wait saw no connection in
        # use: the pool dispose() left would keep its connection open until the garbage collector
        # found it. From now on a connection is closed when it is returned.
        event.listen(self.engine, "checkin", _close_on_return)
        if self._sqlite_lock is not None:
            self._sqlite_lock.close()
            self._sqlite_lock = None

    async def _wait_for_connections_returned(self, timeout: float = 30.0) -> None:
        """Wait (bounded) until worker threads that are still finishing a round, a delivery or a
        write have returned their database connections. ``Engine.dispose`` closes only the
        connections in the pool; one returned after it goes back to a pool nobody closes and
        is left open until the garbage collector finds it."""
        checked_out = getattr(self.engine.pool, "checkedout", None)
        if checked_out is None:
            return
        deadline = time.monotonic() + timeout
        while checked_out() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if checked_out() > 0:
            log.warning("stopping with %d database connections still in use", checked_out())


def _close_on_return(dbapi_connection: object, record: ConnectionPoolEntry) -> None:
    """A stopped service's connection is closed when it is returned, never kept in a pool."""
    if dbapi_connection is not None:
        record.invalidate()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    monitor: Monitor = app.state.monitor
    await monitor.start()
    try:
        yield
    finally:
        await monitor.stop()


__all__ = ["ConfigError", "Monitor", "lifespan"]
