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
from app.latency import HISTOGRAM_SIGNALS, WindowSummary
from app.runtime.scheduling import SUMMARIES_JOB, target_boundary
from app.sources.base import TIME_SIGNALS
from app.store import repository
from app.store.models import DISCOVERED_BY_SOURCES, SOURCE_KIND, TargetView
from app.targets import repository as target_repository
from app.window import TargetWindow, merge_windows
from app.windows import default_windows
from app.windows.base import WindowReader

if TYPE_CHECKING:  # the telemetry sits above the features whose numbers it exports
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
    ``took`` when it ran longer, plus one more ``took``: a round that overran makes the
    scheduler skip the run that would have overlapped it, so the next answer comes a slot
    later and lasts as long again. Under load a late round's answer, which says its
    ``start``/``end``, is still served: recomputing it for every request (all targets each
    time) would make a saturated process slower still."""
    return math.isclose(end - start, seconds, abs_tol=1e-3) and now - end <= 2 * max(interval, took) + took


def fleet_members(session: Session) -> tuple[list[TargetView], list[TargetView]]:
    """(targets summed, targets left out): a target whose latest scrape says ``load_balanced``
    is left out, since its numbers would mix replicas."""
    latest = repository.latest_scrapes(session)
    targets: list[TargetView] = []
    excluded: list[TargetView] = []
    for target in target_repository.target_rows(session):
        scrape = latest.get(target.id)
        (excluded if scrape is not None and scrape.error_class == "load_balanced" else targets).append(target)
    return targets, excluded


def scraped(targets: list[TargetView]) -> list[TargetView]:
    """The targets this service scrapes: the fleet view sums those (a Prometheus source's
    replicas and services are listed with no numbers; their server holds the fleet's own)."""
    return [t for t in targets if t.source not in DISCOVERED_BY_SOURCES]


def fleet_report(session: Session, windows: WindowReader, seconds: float, end: float) -> dict[str, Any]:
    """The body of ``GET /api/v1/latency`` (without ``window``): every target's histograms
    summed by ``le`` over ``[end - seconds, end]``, read together (the store: a fixed number of
    set-based queries per chunk of targets whatever the number of targets)."""
    targets, excluded = fleet_members(session)
    read = windows.windows(session, scraped(targets), end - seconds, end, HISTOGRAM_SIGNALS).found
    return fleet_body(targets, excluded, read, end - seconds, end)


def fleet_body(targets: list[TargetView], excluded: list[TargetView], windows: dict[int, TargetWindow], start: float,
               end: float) -> dict[str, Any]:
    """The fleet view from each member's own window (:func:`app.window.merge_windows`: the
    targets summed by ``le``, as ``sum by (le)`` over all their series is), so the summary
    round derives it from the windows it reads for the per-target gauges, and a request
    for another window gets the same computation."""
    merged = merge_windows({t.name: windows.get(t.id) or TargetWindow(start, end) for t in targets}, start, end)
    extra = {"excluded_load_balanced": [t.name for t in excluded]} if excluded else {}
    return {"targets": [t.name for t in targets], **extra, **latency.report_from_window(merged)}


def _time_summaries(name: str, window: TargetWindow, out: dict[tuple[str, str, str], WindowSummary]) -> None:
    with target_boundary(SUMMARIES_JOB, name):
        found = {(name, model, signal): summary for model, model_window in window.models.items()
                 if model_window.histograms
                 for signal, summary in latency.summarize_histograms(
                     {s: h for s, h in model_window.histograms.items() if s in TIME_SIGNALS}).items()}
        out.update(found)


def refresh_summaries(sessions: sessionmaker[Session], window: float, collector: DerivedLatencyCollector,
                      end: float | None = None, windows: WindowReader | None = None,
                      keep: Callable[[FleetSummary], None] | None = None) -> None:
    """One summary round: (target, model, signal) -> the summary of every time signal over
    ``[end - window, end]`` for the collector, in one assignment, and, for ``keep``, the fleet
    view's answer over the same window, derived from the same windows: each scraped target's
    samples are read once per round. The fleet sums the targets this service scrapes; a
    Prometheus source's replicas get their gauges only, from one set of queries per source for
    the time signals, means first: their mean and count gauges (their server holds the fleet's
    own numbers, and each replica's quantiles: ``histogram_quantile`` over it, or the exported
    recording rules)."""
    reader = windows if windows is not None else default_windows()
    began = time.monotonic()
    end = time.time() if end is None else end
    start = end - window
    summaries: dict[tuple[str, str, str], WindowSummary] = {}
    with sessions() as session:
        members, excluded = fleet_members(session)
        everything = [*members, *excluded]
        current = [t for t in scraped(everything) if t.gone_at is None]
        read = {t.id for t in current} | ({t.id for t in scraped(members)} if keep is not None else set())
        found = reader.windows(session, [t for t in everything if t.id in read], start, end, HISTOGRAM_SIGNALS).found
        for target in current:
            _time_summaries(target.name, found.get(target.id) or TargetWindow(start, end), summaries)
        body = fleet_body(members, excluded, found, start, end) if keep is not None else None
        replicas = [t for t in everything if t.source == SOURCE_KIND and t.gone_at is None]
        del found
        if replicas:
            names = {t.id: t.name for t in replicas}
            # means first: their quantiles are their Prometheus' own, and asked of it when shown
            for target_id, target_window in reader.windows(session, replicas, start, end, TIME_SIGNALS,
                                                           histograms_only=True, buckets=()).found.items():
                _time_summaries(names[target_id], target_window, summaries)
    collector.summaries = summaries
    if keep is not None and body is not None:
        keep(FleetSummary(start, end, body, time.monotonic() - began))
