"""The summary round: per-target latency quantiles for the gauges on ``/metrics`` and the
fleet view's answer over ``latency_window``.

Computed by a periodic job (``summary_interval``) rather than at scrape or request time, so
a Prometheus scraping this service every few seconds, or many clients asking for the fleet's
default window, never trigger database work; the collector
(:class:`app.telemetry.DerivedLatencyCollector`) and ``GET /api/v1/latency`` only read the
last result (:class:`FleetSummary`). The math is the latency API's (:mod:`app.latency`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from app import latency
from app.latency import SignalSummary
from app.promsource.service import DISCOVERED_BY_SOURCES, SOURCE_KIND
from app.sources.base import TIME_SIGNALS
from app.store import repository
from app.store.models import Target

if TYPE_CHECKING:  # the telemetry sits above the features whose numbers it exports
    from app.promsource.service import SourceService
    from app.telemetry import DerivedLatencyCollector


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """The fleet view's answer (:func:`fleet_report`) over ``[start, end]``, as the last summary
    round computed it: ``GET /api/v1/latency`` for its default window returns this instead
    of re-reading every target's samples per request."""

    start: float
    end: float
    body: dict[str, Any]
    took: float = 0.0  # seconds the round ran (:func:`answers`)


def answers(start: float, end: float, seconds: float, now: float, interval: float, took: float) -> bool:
    """Whether a round's result over ``[start, end]`` answers a request for the last
    ``seconds`` at ``now``: same window length, computed within the last two of its rounds
    (else the request reads samples itself). A round lasts its ``interval``, or what it
    ``took`` when it ran longer: under load a late round's answer, which says its
    ``start``/``end``, is still served. Recomputing it for every request instead (all
    targets each time) is what made a saturated process slower still (bench/load.py)."""
    return math.isclose(end - start, seconds, abs_tol=1e-3) and now - end <= 2 * max(interval, took)


def fleet_members(session: Session) -> tuple[list[Target], list[Target]]:
    """(targets summed, targets left out): a target whose latest scrape says ``load_balanced``
    is left out, since its numbers would mix replicas."""
    latest = repository.latest_scrapes(session)
    targets: list[Target] = []
    excluded: list[Target] = []
    for target in repository.list_targets(session):
        scrape = latest.get(target.id)
        (excluded if scrape is not None and scrape.error_class == "load_balanced" else targets).append(target)
    return targets, excluded


def fleet_report(session: Session, seconds: float, end: float) -> dict[str, Any]:
    """The body of ``GET /api/v1/latency`` (without ``window``): every target's histograms
    summed by ``le`` over ``[end - seconds, end]``, read in a fixed number of set-based
    queries whatever the number of targets."""
    targets, excluded = fleet_members(session)
    report = latency.latency_report(session, [t.id for t in targets], seconds, end)
    extra = {"excluded_load_balanced": [t.name for t in excluded]} if excluded else {}
    return {"targets": [t.name for t in targets], **extra, **report}


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
                      end: float | None = None, sources: SourceService | None = None,
                      keep: Callable[[FleetSummary], None] | None = None) -> None:
    """Recompute the summaries and hand them to the collector in one assignment; ``keep`` is
    given the fleet view's answer over the same window."""
    began = time.monotonic()
    end = time.time() if end is None else end
    collector.summaries = latency_summaries(sessions, window, end, sources)
    if keep is not None:
        with sessions() as session:
            body = fleet_report(session, window, end)
        keep(FleetSummary(end - window, end, body, time.monotonic() - began))
