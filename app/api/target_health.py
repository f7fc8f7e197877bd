"""What the status page says of a target's health, and where a target comes from.

A target the service scrapes is as its last scrape left it. A target read through a Prometheus
source (a replica or a service of one) is never scraped by the service: it is as its source's
last round saw it - Prometheus' own ``up`` of a replica, how many replicas of a service are up -
at the time of that round, and while the source fails its state is unknown and what the page
shows of it is stale (never "up" beside "stale").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.store import repository
from app.store.models import (
    DISCOVERED_BY_SOURCES,
    DISCOVERED_SOURCES,
    SERVICE_KIND,
    SOURCE_KIND,
    ScrapeView,
    TargetView,
)
from app.targets import repository as target_repository
from app.windows.base import SourceStatus


@dataclass(slots=True)
class Health:
    """A target's health badge and what its page says beside it."""

    state: str           # "up" | "down" | "unknown"
    label: str           # text of the badge
    error_class: str | None = None
    error: str | None = None
    ts: float | None = None
    age: float | None = None
    stale: bool = False
    duration: float | None = None
    round_at: float | None = None  # a source's target: when its source's last round ran (not a scrape)


def scrape_health(scrape: ScrapeView | None, interval: float, now: float) -> Health:
    if scrape is None:
        return Health("unknown", "no scrape yet")
    age = now - scrape.ts
    stale = age > 3 * interval + 30
    if scrape.up:
        label = "up" if scrape.error_class is None else f"up ({scrape.error_class})"
        return Health("up", label, scrape.error_class, scrape.error, scrape.ts, age, stale, scrape.duration)
    return Health("down", f"down: {scrape.error_class or 'error'}", scrape.error_class, scrape.error, scrape.ts, age,
                  stale, scrape.duration)


def source_health(target: TargetView, view: ScrapeView | None, status: SourceStatus | None,
                  replicas: tuple[int, int] = (0, 0)) -> Health:
    """A target read through a Prometheus source, as its source's last round saw it (``round_at``):
    a replica up or down by Prometheus' own ``up`` (``view``: the last change the source reported),
    a service by how many of its live replicas (``replicas``: up, all) are up. While the source
    fails, neither: the state now is unknown, and what the page shows is stale."""
    if target.gone_at is not None:
        return Health("unknown", "gone")  # its series stopped: not read any more
    if status is None:
        return Health("unknown", "source not configured", stale=True)
    if status.failing:
        # its banner names the error; the badge says only that nothing is known now
        return Health("unknown", "source failing", stale=True, round_at=status.last_error_at)
    at = status.last_success
    if target.source == SERVICE_KIND:
        up, total = replicas
        if total == 0:
            return Health("unknown", "no live replicas", round_at=at)
        if up == 0:
            return Health("down", f"down: 0/{total} replicas up", "down",
                          f"Prometheus reports up == 0 for all {total} replicas", round_at=at)
        if up < total:
            return Health("up", f"up: {up}/{total} replicas", "replicas_down",
                          f"{total - up} of {total} replicas report up == 0", round_at=at)
        return Health("up", f"up: {total}/{total} replicas", round_at=at)
    if view is None:
        return Health("unknown", "not read yet", round_at=at)
    if view.up:
        return Health("up", "up", ts=view.ts, round_at=at)
    return Health("down", "down", view.error_class, view.error, view.ts, round_at=at)


def target_health(target: TargetView, view: ScrapeView | None, statuses: Mapping[str, SourceStatus],
                  replicas: Mapping[int, tuple[int, int]], interval: float, now: float) -> Health:
    """:func:`source_health` of a target a Prometheus source reads, else :func:`scrape_health`."""
    if target.source in DISCOVERED_BY_SOURCES:
        return source_health(target, view, statuses.get(target.origin or ""), replicas.get(target.id, (0, 0)))
    return scrape_health(view, interval, now)


def replica_counts(targets: Iterable[TargetView], latest: Mapping[int, ScrapeView]) -> dict[int, tuple[int, int]]:
    """Per service of a Prometheus source (by id): its live replicas among ``targets`` that are up,
    and all of them (the replicas that share its ``service_labels`` values, which it names)."""
    targets = list(targets)
    names = {t.origin: tuple(sorted(t.labels or {})) for t in targets if t.source == SERVICE_KIND}
    counts: dict[tuple, list[int]] = {}
    for t in targets:
        keys = names.get(t.origin)
        if t.source != SOURCE_KIND or keys is None or t.gone_at is not None:
            continue
        count = counts.setdefault((t.origin, tuple((k, (t.labels or {}).get(k, "")) for k in keys)), [0, 0])
        view = latest.get(t.id)
        count[0] += view is not None and bool(view.up)
        count[1] += 1
    return {t.id: (up, total) for t in targets if t.source == SERVICE_KIND
            for up, total in [counts.get((t.origin, tuple(sorted((t.labels or {}).items()))), [0, 0])]}


def stale_source(target: TargetView, failing: dict[str, SourceStatus]) -> SourceStatus | None:
    """The failing source a target is read from: its verdicts are the last ones, not current."""
    return failing.get(target.origin or "") if target.source in DISCOVERED_BY_SOURCES else None


def discovered_by(target: TargetView) -> str | None:
    """``Prometheus source prod``, ``file_sd targets.json``: where a discovered target comes from."""
    if target.source not in DISCOVERED_SOURCES:
        return None
    kind = "Prometheus source" if target.source == SOURCE_KIND else \
        "service of Prometheus source" if target.source == SERVICE_KIND else target.source
    return f"{kind} {target.origin}" if target.origin else kind


def engine_origin(target: TargetView) -> str:
    """Where the engine shown for a target comes from: the config or the API, or detection."""
    if target.source == SOURCE_KIND:
        return "detected from the names of its series in Prometheus"
    if target.source == SERVICE_KIND:
        return "detected from the names of its replicas' series in Prometheus"
    if target.engine != "auto":
        return "configured"
    return "detected from its metric names" if target.detected_engine else "not detected yet"


def service_members(session, service: TargetView) -> list[dict[str, Any]]:
    """The live replicas a service of a Prometheus source sums: those of its source with its
    ``service_labels`` values (its labels), by name, each up or down as the source last saw it."""
    wanted = (service.labels or {}).items()
    replicas = sorted((t for t in target_repository.target_rows(session)
                       if t.source == SOURCE_KIND and t.origin == service.origin and t.gone_at is None
                       and all((t.labels or {}).get(k, "") == v for k, v in wanted)), key=lambda t: t.name)
    latest = repository.latest_scrapes(session, [t.id for t in replicas]) if replicas else {}
    return [{"name": t.name, "up": (view := latest.get(t.id)) is not None and bool(view.up)} for t in replicas]
