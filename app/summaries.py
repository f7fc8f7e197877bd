"""The summary round: per-target latency quantiles for the gauges on ``/metrics``.

Computed by a periodic job (``summary_interval``) rather than at scrape time, so a
Prometheus scraping this service every few seconds never triggers database work; the
collector (:class:`app.telemetry.DerivedLatencyCollector`) only exports the last result.
The math is the latency API's (:mod:`app.latency`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from app import latency
from app.latency import SignalSummary
from app.promsource.service import DISCOVERED_BY_SOURCES, SOURCE_KIND
from app.sources.base import TIME_SIGNALS
from app.store import repository

if TYPE_CHECKING:  # the telemetry sits above the features whose numbers it exports
    from app.promsource.service import SourceService
    from app.telemetry import DerivedLatencyCollector


def latency_summaries(sessions: sessionmaker[Session], window: float, end: float | None = None,
                      sources: SourceService | None = None) -> dict[tuple[str, str, str], SignalSummary]:
    """(target, model, signal) -> the summary of every time signal over ``[end - window, end]``;
    a Prometheus source's replicas from one set of queries per source (``sources``)."""
    end = time.time() if end is None else end
    summaries: dict[tuple[str, str, str], SignalSummary] = {}
    with sessions() as session:
        targets = [t for t in repository.list_targets(session) if t.gone_at is None]
        stored = [t for t in targets if t.source not in DISCOVERED_BY_SOURCES]
        # every stored target in one set of queries per chunk (store_windows), not one per target
        windows = latency.store_windows(session, [t.id for t in stored], end - window, end, TIME_SIGNALS)
        for target in stored:
            for model, model_window in windows[target.id].models.items():
                if not model_window.histograms:
                    continue
                for signal, summary in latency.summarize_histograms(model_window.histograms).items():
                    if signal in TIME_SIGNALS:
                        summaries[(target.name, model, signal)] = summary
        replicas = [t for t in targets if t.source == SOURCE_KIND]
    if sources is not None and replicas:
        names = {t.id: t.name for t in replicas}
        for target_id, target_window in sources.windows_of(replicas, end - window, end, TIME_SIGNALS).items():
            for model, model_window in target_window.models.items():
                for signal, summary in latency.summarize_histograms(model_window.histograms).items():
                    if signal in TIME_SIGNALS:
                        summaries[(names[target_id], model, signal)] = summary
    return summaries


def refresh_summaries(sessions: sessionmaker[Session], window: float, collector: DerivedLatencyCollector,
                      end: float | None = None, sources: SourceService | None = None) -> None:
    """Recompute the summaries and hand them to the collector in one assignment."""
    collector.summaries = latency_summaries(sessions, window, end, sources)
