"""Builds every long-lived resource of the service and tears it down again.

Nothing is created at import time: ``create_app(settings)`` is cheap and a test can
build as many isolated apps as it likes. The :class:`Monitor` is the typed state the
routes reach through ``app.state.monitor``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app import latency
from app.alerts import engine as alerts_engine
from app.alerts.config import AlertsConfig, ReceiverConfig
from app.alerts.delivery import DeliveryWorker
from app.config import ConfigError, DiagnosisConfig, load_config
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.profile import HardwareProfile
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.probe import repository as probe_repository
from app.probe.canary import CanaryConfig, latest_single_request_baseline, run_canary
from app.promsource.service import DISCOVERED_BY_SOURCES, SourceService
from app.scrape.jobs import TargetSpec
from app.scrape.scheduler import ScrapeService
from app.settings import Settings
from app.sources.base import TIME_SIGNALS
from app.store import db, repository
from app.telemetry import Telemetry
from app.window import TargetWindow

log = logging.getLogger(__name__)
PROBE_BASELINE_MAX_AGE = 3600.0  # a single-request probe older than this is not evidence any more
DIAGNOSIS_JOB = "diagnosis"  # the scheduler job of the diagnosis rounds


class Monitor:
    """The running service: database, scraper, periodic jobs, telemetry."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine: Engine = db.make_engine(settings.effective_database_url)
        self.sessions: sessionmaker[Session] = db.make_sessionmaker(self.engine)
        self.telemetry = Telemetry()
        self.scraping = ScrapeService(
            self.engine, self.telemetry, max_concurrency=settings.max_concurrent_scrapes,
            max_bytes=settings.max_page_bytes, connect_timeout=settings.connect_timeout,
            jitter=settings.scrape_jitter, write_interval=settings.write_batch_interval,
            on_engine_detected=self._engine_detected,
        )
        self.started_at = time.time()
        self.diagnosis_config = DiagnosisConfig()
        self.alerts_config = AlertsConfig()
        self.delivery = DeliveryWorker(self.sessions, self.receivers, settings.secret,
                                       on_attempt=self._delivery_attempted)
        self._delivery_task: asyncio.Task | None = None
        self.sources = SourceService()

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
                for t in repository.list_targets(session) if t.source not in DISCOVERED_BY_SOURCES
            ]

    async def reload_targets(self) -> None:
        specs = await asyncio.to_thread(self.target_specs)
        self.scraping.sync_targets(specs)
        self.sync_canaries(await asyncio.to_thread(self.canary_configs))

    def canary_configs(self) -> dict[str, tuple[TargetSpec, CanaryConfig]]:
        with self.sessions() as session:
            return {t.name: (TargetSpec(t.id, t.name, t.url), CanaryConfig.model_validate(t.canary))
                    for t in repository.list_targets(session) if t.canary and t.canary.get("enabled")}

    def sync_canaries(self, wanted: dict[str, tuple[TargetSpec, CanaryConfig]]) -> None:
        """One periodic single-request probe job per target that enables it (off by default)."""
        scheduler = self.scraping.scheduler
        for job in scheduler.get_jobs():
            if job.id.startswith("canary:") and job.id.removeprefix("canary:") not in wanted:
                job.remove()
        for name, (spec, config) in wanted.items():
            def run(spec: TargetSpec = spec, config: CanaryConfig = config) -> None:
                run_canary(self.sessions, spec, config, on_result=self.telemetry.probes.observe)
            run.__name__ = f"canary_{name}"
            scheduler.add_job(self._in_thread(run), "interval", seconds=config.interval, id=f"canary:{name}",
                              max_instances=1, coalesce=True, replace_existing=True)

    def _engine_detected(self, target_id: int, engine: str) -> None:
        def store() -> None:
            with self.sessions.begin() as session:
                repository.set_detected_engine(session, target_id, engine)
        asyncio.get_running_loop().run_in_executor(None, store)

    # ------------------------------------------------------------------ periodic jobs
    def prune(self) -> dict[str, int]:
        before = time.time() - self.settings.retention
        with self.sessions.begin() as session:
            deleted = repository.prune(session, before)
            deleted["probe_runs"] = probe_repository.prune(session, before)
            return deleted

    def refresh_summaries(self) -> None:
        """Recompute the per-target quantile gauges exported on /metrics."""
        end = time.time()
        window = self.settings.latency_window
        summaries: dict[tuple[str, str, str], dict] = {}
        with self.sessions() as session:
            for target in repository.list_targets(session):
                loaded = latency.load_histograms(session, [target.id], TIME_SIGNALS, end - window, end)
                for model in sorted({s.model for s in loaded.series}):
                    for signal, summary in latency.summarize_signals(loaded, end - window, end, model).items():
                        if signal in TIME_SIGNALS:
                            summaries[(target.name, model, signal)] = summary
        self.telemetry.derived.summaries = summaries

    def evaluate_diagnoses(self, now: float | None = None) -> list:
        """One diagnosis round over every target: evaluate, advance lifecycles, persist."""
        now = time.time() if now is None else now
        config = self.diagnosis_config
        results = []
        # Prometheus sources first, outside any transaction. A target of a source that could not be
        # read has no window: it keeps its last verdict and no finding moves (nothing is missing-data).
        source_windows: dict[int, TargetWindow] = {}
        for source_round in self.sources.round(self.sessions, now, config.window, DIAGNOSIS_HISTOGRAMS):
            for source_target in source_round.targets:
                if source_target.window is not None:  # None: down now; its TargetDown alert says so
                    source_windows[source_target.id] = source_target.window
        saved: list[dict] = []  # each diagnosis as saved, converted once (a round may hold 1,000s)
        with self.sessions.begin() as session:
            # One query for which targets have probe runs at all, instead of two per target.
            probe_lookback = max(PROBE_BASELINE_MAX_AGE, config.window, config.thresholds.outside_lookback)
            probed = probe_repository.targets_with_finished_runs(session, now - probe_lookback)
            for target in repository.list_targets(session):
                if target.source in DISCOVERED_BY_SOURCES and target.id not in source_windows:
                    continue  # gone, or its source is failing: no evaluation, no lifecycle step
                hardware = HardwareProfile.model_validate(target.hardware) if target.hardware else None
                engine = target.detected_engine or (target.engine if target.engine != "auto" else "vllm")
                baseline = latest_single_request_baseline(session, target.id, now - PROBE_BASELINE_MAX_AGE) \
                    if target.id in probed else None
                for diagnosis in diagnosis_engine.evaluate_target(session, target.id, target.name, engine, now,
                                                                  config.window, config.thresholds, hardware,
                                                                  probe_baseline=baseline,
                                                                  data=source_windows.get(target.id),
                                                                  probed=target.id in probed):
                    transitions = diagnosis_engine.apply_lifecycle(session, target.id, diagnosis,
                                                                   config.thresholds, now)
                    data = diagnosis.to_dict()
                    repository.save_diagnosis(session, target.id, diagnosis.model, diagnosis.verdict, now, data)
                    results.append((diagnosis, transitions))
                    saved.append(data)
            states = {(name, row.model, row.regime): row.state
                      for name, row in repository.finding_history(session, states=("pending", "active"))}
        exported = []
        for (diagnosis, _), data in zip(results, saved, strict=True):
            # A copy: the saved row keeps the dict it was given.
            data = {**data, "findings": [{**finding, "state": states.get(
                (diagnosis.target, diagnosis.model, finding["regime"]), "pending")} for finding in data["findings"]]}
            exported.append(data)
        self.telemetry.diagnosis.diagnoses = exported
        return results

    def next_diagnosis_at(self) -> float:
        """When the next diagnosis round starts (unix seconds), so the status page can tell a
        target that was never evaluated how long it waits: the scheduler's next run of the
        job, or one interval after the service started if the job is not scheduled yet."""
        job = self.scraping.scheduler.get_job(DIAGNOSIS_JOB)
        if job is not None and job.next_run_time is not None:
            return job.next_run_time.timestamp()
        return self.started_at + self.diagnosis_config.interval

    def receivers(self) -> dict[str, ReceiverConfig]:
        with self.sessions() as session:
            return {row.name: ReceiverConfig.model_validate(row.config) for row in repository.list_receivers(session)}

    def evaluate_alerts(self, now: float | None = None) -> dict[str, int]:
        """One alerting round: conditions -> alert states -> outbox rows, in one transaction."""
        now = time.time() if now is None else now
        receivers = list(self.receivers().values())
        generator = (self.settings.public_url.rstrip("/") or f"http://{self.settings.host}:{self.settings.port}")
        with self.sessions.begin() as session:
            result = alerts_engine.evaluate(session, self.alerts_config, receivers, now,
                                            generator_url=f"{generator}/api/v1/alerts",
                                            eval_interval=self.settings.alert_interval)
            self.telemetry.diagnosis.alerts = [
                (row.alertname, row.labels.get("target", ""), row.labels.get("severity", ""), row.state)
                for row in repository.open_alerts(session)]
        self.telemetry.alert_notifications.inc(result["notifications"])
        return result

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
        await self.scraping.start(await asyncio.to_thread(self.target_specs))
        scheduler = self.scraping.scheduler
        scheduler.add_job(self._in_thread(self.prune), "interval", seconds=self.settings.prune_interval,
                          id="prune", max_instances=1, coalesce=True)
        scheduler.add_job(self._in_thread(self.refresh_summaries), "interval",
                          seconds=self.settings.summary_interval, id="summaries", max_instances=1, coalesce=True)
        scheduler.add_job(self._in_thread(self.evaluate_diagnoses), "interval",
                          seconds=self.diagnosis_config.interval, id=DIAGNOSIS_JOB, max_instances=1, coalesce=True)
        scheduler.add_job(self._in_thread(self.evaluate_alerts), "interval", seconds=self.settings.alert_interval,
                          id="alerts", max_instances=1, coalesce=True)
        self.sync_canaries(await asyncio.to_thread(self.canary_configs))
        await self.delivery.start()
        self._delivery_task = asyncio.create_task(self._delivery_loop(), name="outbox")

    @staticmethod
    def _in_thread(func):
        async def run() -> None:
            try:
                await asyncio.to_thread(func)
            except Exception:
                log.exception("periodic job %s failed", func.__name__)
        run.__name__ = func.__name__
        return run

    async def stop(self) -> None:
        if self._delivery_task is not None:
            self._delivery_task.cancel()
            try:
                await self._delivery_task
            except asyncio.CancelledError:
                pass
        await self.delivery.close()
        self.sources.close()
        await self.scraping.stop()
        self.engine.dispose()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    monitor: Monitor = app.state.monitor
    await monitor.start()
    try:
        yield
    finally:
        await monitor.stop()


__all__ = ["ConfigError", "Monitor", "lifespan"]
