"""How often a source's Prometheus scrapes the engines, and the diagnosis window that follows.

A window judges nothing it holds too few scrapes for: kube-prometheus-stack scrapes every
30 s, so a 1m window holds two scrapes and ``bandwidth_bound`` (four) is never judged. The
interval is the source's ``scrape_interval`` when configured; otherwise the server's
``/api/v1/targets`` tells it: the slowest ``scrapeInterval`` of the active targets whose
labels are those of a discovered engine (their ``target_labels`` values). Asked again every
:data:`REFRESH` seconds; a server without that endpoint (Mimir) leaves it unknown and the
source's status says to configure it. The diagnosis window of the source's targets is then
``config.fitted_window`` (at least ``window_intervals`` intervals).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from app.core.durations import format_duration
from app.promql.client import ActiveTarget, PromAPIError, PrometheusClient

#: Seconds between two look-ups of the scrape interval on the server (it changes with a
#: Prometheus configuration, not from round to round).
REFRESH = 600.0

TargetKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ScrapeInterval:
    """A source's scrape interval: ``seconds`` (None: unknown), where it came from (``config``
    or ``server``; empty when unknown) and a sentence for its status (how it was learned, or
    why it is unknown)."""

    seconds: float | None
    origin: str
    note: str


def configured(seconds: float) -> ScrapeInterval:
    return ScrapeInterval(seconds, "config", "the source's scrape_interval")


def from_targets(targets: Sequence[ActiveTarget], target_labels: Sequence[str],
                 engines: Collection[TargetKey]) -> ScrapeInterval:
    """The slowest interval of the active targets that carry a discovered engine's label values."""
    matched = [t for t in targets if tuple(t.labels.get(name, "") for name in target_labels) in engines]
    intervals = [t.scrape_interval for t in matched if t.scrape_interval]
    if not matched:
        return ScrapeInterval(None, "", "no active target of the server's /api/v1/targets has the target_labels "
                                        "values of a discovered engine; set the source's scrape_interval")
    if not intervals:
        return ScrapeInterval(None, "", "the server's /api/v1/targets does not say how often it scrapes the engines; "
                                        "set the source's scrape_interval")
    slowest, fastest = max(intervals), min(intervals)
    spread = "" if slowest == fastest else \
        f", from {format_duration(fastest)} to {format_duration(slowest)}: the slowest counts"
    return ScrapeInterval(slowest, "server", f"the server's /api/v1/targets, {len(intervals)} engine "
                                             f"target{'s' if len(intervals) != 1 else ''}{spread}")


def learn(client: PrometheusClient, target_labels: Sequence[str], engines: Collection[TargetKey]) -> ScrapeInterval:
    """Ask the server for its engines' scrape interval; a failure is an unknown interval whose
    note says why (classified text, never the server's)."""
    try:
        targets = client.active_targets()
    except PromAPIError as exc:
        return ScrapeInterval(None, "", f"the server's /api/v1/targets did not answer ({exc.kind}: {exc.message}); "
                                        "set the source's scrape_interval")
    return from_targets(targets, target_labels, engines)


def window_note(window: float, fitted: float, interval: ScrapeInterval, intervals: int) -> str:
    """What the status and the log say about the diagnosis window of a source's targets."""
    if interval.seconds is None:
        return f"diagnosis window {format_duration(window)} (diagnosis.window); scrape interval unknown: " \
               f"{interval.note}"
    every = f"scraped every {format_duration(interval.seconds)} ({interval.note})"
    if fitted > window:
        return (f"diagnosis window {format_duration(fitted)} instead of diagnosis.window {format_duration(window)}: "
                f"at least {intervals} scrape intervals, targets {every}")
    return f"diagnosis window {format_duration(window)} (diagnosis.window), targets {every}"
