"""Builds every long-lived resource of the service, starts it and tears it down again.

The :class:`Monitor` is the composition root: it wires the database, the one scheduler
(:mod:`app.scheduling`), the scrape service, the probe jobs and the outbox worker together,
and schedules each periodic round, which lives in its feature as a plain function:

* :func:`app.store.retention.prune` - retention,
* :func:`app.summaries.refresh_summaries` - latency gauges on ``/metrics``,
* :func:`app.diagnosis.rounds.evaluate_diagnoses` - the diagnosis round,
* :func:`app.alerts.rounds.evaluate_alerts` - the alerting round,
* :func:`app.probe.canary.sync_canaries` - one canary job per target that enables it.

Nothing is created at import time: ``create_app(settings)`` is cheap and a test can
build as many isolated apps as it likes. The Monitor is the typed state the routes reach
through ``app.state.monitor`` (:mod:`app.api.deps`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app import scheduling, summaries
from app.alerts import rounds as alert_rounds
from app.alerts.config import AlertsConfig
from app.alerts.delivery import DeliveryWorker
from app.config import ConfigError, DiagnosisConfig, load_config
from app.diagnosis import rounds as diagnosis_rounds
from app.probe import canary
from app.probe import repository as probe_repository
from app.probe.jobs import ProbeJobs
from app.promsource.service import DISCOVERED_BY_SOURCES, SourceService
from app.scrape.discovery import DiscoveryService
from app.scrape.jobs import TargetSpec
from app.scrape.scheduler import ScrapeService
from app.settings import Settings
from app.store import db, repository, retention
from app.telemetry import Telemetry

log = logging.getLogger(__name__)


class Monitor:
    """The running service: database, scheduler, scraper, probe jobs, outbox, telemetry."""

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
        )
        self.probe_jobs = ProbeJobs(self.sessions, on_finished=self.telemetry.probes.observe)
        self.started_at = time.time()
        self.diagnosis_config = DiagnosisConfig()
        self.alerts_config = AlertsConfig()
        self.delivery = DeliveryWorker(self.sessions, functools.partial(alert_rounds.load_receivers, self.sessions),
                                       settings.secret,
                                       on_attempt=self._delivery_attempted)
        self._delivery_task: asyncio.Task[None] | None = None
        self.sources = SourceService(on_view=self._source_view)
        self.discovery = DiscoveryService(self.sessions, settings.allowed_target_hosts, self.reload_targets)

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
        self.delivery.max_age = config.alerts.max_delivery_age
        self.sources.configure(config.sources)
        self.discovery.configure(config, self.settings.config_file.parent)
        with self.sessions.begin() as session:
            repository.sync_config_targets(session, [t.model_dump(mode="json") for t in config.targets])
            repository.sync_config_receivers(session, [r.model_dump(mode="json") for r in config.alerts.receivers],
                                             time.time())

    def target_specs(self) -> list[TargetSpec]:
        s = self.settings
        with self.sessions() as session:
            return [
                TargetSpec(t.id, t.name, t.url, t.engine, t.scrape_interval or s.default_scrape_interval,
                           min(t.scrape_timeout or s.default_scrape_timeout,
                               t.scrape_interval or s.default_scrape_interval), dict(t.labels))
                for t in repository.list_targets(session)
                if t.source not in DISCOVERED_BY_SOURCES and t.gone_at is None
            ]

    async def reload_targets(self) -> None:
        specs = await asyncio.to_thread(self.target_specs)
        self.scraping.sync_targets(specs)
        await self._sync_canaries()

    async def _sync_canaries(self) -> None:
        wanted = await asyncio.to_thread(canary.canary_configs, self.sessions)
        canary.sync_canaries(self.scheduler, self.sessions, wanted, on_result=self.telemetry.probes.observe)

    def _engine_detected(self, target_id: int, engine: str) -> None:
        def store() -> None:
            with self.sessions.begin() as session:
                repository.set_detected_engine(session, target_id, engine)
        asyncio.get_running_loop().run_in_executor(None, store)

    def _source_view(self, target: str, up: bool, ts: float) -> None:
        """A source's replica as its Prometheus saw it this round: ``llm_latency_target_up``."""
        self.telemetry.target_up.labels(target).set(1.0 if up else 0.0)
        self.telemetry.last_scrape.labels(target).set(ts)

    def forget_target(self, target_id: int) -> None:
        """Before a target is deleted: drop what the running service caches about it."""
        self.scraping.forget_target(target_id)

    # ------------------------------------------------------------------ periodic rounds (app.scheduling)
    # Each round lives in its feature; these bind it to this service's parts for tests and
    # benchmarks that drive a round themselves (``now`` explicit) and for the scheduler.
    def refresh_summaries(self) -> None:
        summaries.refresh_summaries(self.sessions, self.settings.latency_window, self.telemetry.derived,
                                    sources=self.sources)

    def evaluate_diagnoses(self, now: float | None = None) -> list[diagnosis_rounds.RoundResult]:
        return diagnosis_rounds.evaluate_diagnoses(self.sessions, self.diagnosis_config, self.telemetry.diagnosis, now,
                                                   sources=self.sources)

    def next_diagnosis_at(self) -> float:
        """When the next diagnosis round starts (unix seconds), so the status page can tell a
        target that was never evaluated how long it waits: the scheduler's next run of the
        job, or one interval after the service started if the job is not scheduled yet."""
        next_run = scheduling.next_run_at(self.scheduler, scheduling.DIAGNOSIS_JOB)
        return next_run if next_run is not None else self.started_at + self.diagnosis_config.interval

    def evaluate_alerts(self, now: float | None = None) -> dict[str, int]:
        generator = (self.settings.public_url.rstrip("/") or f"http://{self.settings.host}:{self.settings.port}")
        return alert_rounds.evaluate_alerts(self.sessions, self.alerts_config,
                                            generator_url=f"{generator}/api/v1/alerts",
                                            eval_interval=self.settings.alert_interval, telemetry=self.telemetry,
                                            now=now, sources=self.sources)

    def _delivery_attempted(self, receiver: str, ok: bool, latency: float) -> None:
        self.telemetry.deliveries.labels(receiver, "ok" if ok else "error").inc()

    async def _delivery_loop(self) -> None:
        while True:
            try:
                await self.delivery.run_once()
            except Exception:
                log.exception("delivering notifications failed")
            await asyncio.sleep(self.settings.delivery_interval)

    async def start(self) -> None:
        try:
            await asyncio.to_thread(self.prepare_database)
            await asyncio.to_thread(self.load_config_targets)
        except BaseException:
            self.engine.dispose()  # refuse to start without leaking connections
            raise
        self.scheduler.start()
        await self.scraping.start(await asyncio.to_thread(self.target_specs))
        await self.discovery.start(self.scheduler)
        s = self.settings
        prune = functools.partial(retention.prune, self.sessions, s.retention,
                                  also={"probe_runs": probe_repository.prune})  # the probe feature's own tables
        scheduling.add_round(self.scheduler, scheduling.PRUNE_JOB, prune, s.prune_interval)
        scheduling.add_round(self.scheduler, scheduling.SUMMARIES_JOB, self.refresh_summaries, s.summary_interval)
        scheduling.add_round(self.scheduler, scheduling.DIAGNOSIS_JOB, self.evaluate_diagnoses,
                             self.diagnosis_config.interval)
        scheduling.add_round(self.scheduler, scheduling.ALERTS_JOB, self.evaluate_alerts, s.alert_interval)
        await self._sync_canaries()
        await self.delivery.start()
        self._delivery_task = asyncio.create_task(self._delivery_loop(), name="outbox")

    async def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.pause()  # no new round or scrape starts while the rest winds down
        await self.probe_jobs.shutdown()  # running probes record their cancellation
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
        await self._wait_for_connections_returned()
        self.engine.dispose()

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


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    monitor: Monitor = app.state.monitor
    await monitor.start()
    try:
        yield
    finally:
        await monitor.stop()


__all__ = ["ConfigError", "Monitor", "lifespan"]
