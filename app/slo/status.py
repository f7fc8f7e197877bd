"""An SLO's state now: SLI per window, burn rates, budget left, time to exhaustion, coverage.

One computation (:func:`slo_statuses`) serves ``GET /api/v1/slos``, the ``llm_latency_slo_*``
gauges on ``/metrics`` and the burn-rate alerts, so the three never disagree.

Built-in SLOs are evaluated **per target** (each target's good and total requests, its own
burn rates and its own alerts, label ``target``) and **aggregated over the matched targets**
for the SLO's total (sum of good / sum of total: every request counts once, whichever replica
served it). Burn rate = (1 - SLI) / (1 - objective): 1 spends the budget exactly over the
period. The numbers are sums of the rows the recording round wrote (:mod:`app.slo.record`),
so a 28-day window costs one indexed SUM, not a read of every stored snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.core.durations import format_duration
from app.slo import buckets, record
from app.slo import repository as slo_repository
from app.slo.config import SloObjective
from app.store import repository
from app.store.models import DISCOVERED_BY_SOURCES, Target
from app.targets import repository as target_repository


@dataclass(frozen=True, slots=True)
class SloWindow:
    """Good and total requests over one window ending now, and what they mean."""

    window: float  # seconds
    good: float
    total: float
    covered: float  # seconds of the window with recorded data (less right after start or with a short retention)

    @property
    def label(self) -> str:
        return format_duration(self.window)

    @property
    def sli(self) -> float | None:
        """The share of good requests; None without requests."""
        return self.good / self.total if self.total > 0 else None

    def burn_rate(self, objective: float) -> float | None:
        """How fast the budget burns: 1 = exactly spent over the period."""
        sli = self.sli
        return None if sli is None else max(0.0, 1.0 - sli) / (1.0 - objective)


@dataclass(frozen=True, slots=True)
class BurnAlertState:
    """One burn-rate alert (``kind`` page or ticket) evaluated now: fires when both windows'
    burn rates exceed ``factor``."""

    kind: str
    severity: str
    long: SloWindow
    short: SloWindow
    factor: float
    long_burn: float | None
    short_burn: float | None

    @property
    def firing(self) -> bool:
        return (self.long_burn is not None and self.short_burn is not None
                and self.long_burn > self.factor and self.short_burn > self.factor)


@dataclass(frozen=True, slots=True)
class SloTargetStatus:
    """One matched target's part of an SLO. ``error``: why it is not evaluated (its histogram
    has no bucket at the threshold, or no histogram of the signal yet)."""

    target: str
    labels: dict[str, str]
    period: SloWindow | None
    windows: tuple[SloWindow, ...]
    alerts: tuple[BurnAlertState, ...]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SloStatus:
    """An SLO now, aggregated over its matched targets (``targets`` has each one's part).

    ``coverage`` is the share of ``period`` with recorded data (1.0 once the service has
    recorded a whole period); ``note`` says why it is below 1 (a period longer than the
    samples' retention, or than a source's data), and every number is then over what exists.
    """

    name: str
    signal: str
    threshold: float
    objective: float
    period_seconds: float
    period: SloWindow
    windows: tuple[SloWindow, ...]
    targets: tuple[SloTargetStatus, ...]
    coverage: float
    note: str | None
    errors: tuple[str, ...]

    @property
    def sli(self) -> float | None:
        return self.period.sli

    @property
    def budget_remaining(self) -> float | None:
        """The share of the error budget not spent yet (negative: overspent): 1 - the burn rate
        over the period, as Sloth and Pyrra compute it; with ``coverage`` < 1 over the part of
        the period that has data."""
        burn = self.period.burn_rate(self.objective)
        return None if burn is None else 1.0 - burn

    def burn_rates(self) -> dict[str, float | None]:
        """Burn rate per window label (``5m``, ``1h``, ...)."""
        return {w.label: w.burn_rate(self.objective) for w in self.windows}

    @property
    def current_burn(self) -> float | None:
        """The burn rate "now": over the shortest window with requests."""
        for window in self.windows:
            burn = window.burn_rate(self.objective)
            if burn is not None:
                return burn
        return None

    @property
    def time_to_exhaustion(self) -> float | None:
        """Seconds until the budget left is spent at the current burn rate; 0 when it is
        spent already, None when nothing burns (or nothing is known)."""
        remaining, burn = self.budget_remaining, self.current_burn
        if remaining is None or burn is None:
            return None
        if remaining <= 0:
            return 0.0
        if burn <= 0:
            return None
        seconds = remaining * self.period_seconds / burn
        return seconds if math.isfinite(seconds) else None


def _window(window: float, sums: tuple[float, float, float | None] | None, now: float) -> SloWindow:
    if sums is None:
        return SloWindow(window, 0.0, 0.0, 0.0)
    good, total, oldest = sums
    covered = 0.0 if oldest is None else min(window, now - oldest)
    return SloWindow(window, good, total, covered)


def _aggregate(window: float, parts: Sequence[SloWindow]) -> SloWindow:
    return SloWindow(window, sum(p.good for p in parts), sum(p.total for p in parts),
                     max((p.covered for p in parts), default=0.0))


def target_errors(session: Session, slo: SloObjective, targets: Sequence[Target]) -> dict[int, str]:
    """Targets the SLO cannot be evaluated on, and why: no histogram of the signal scraped
    yet, or one without a bucket at the threshold (the SLI would be interpolated: refused)."""
    series = repository.find_series(session, [t.id for t in targets], [slo.signal])
    errors = {}
    for target in targets:
        mine = [s for s in series if s.target_id == target.id and s.kind == "histogram"]
        if not mine:
            errors[target.id] = f"no {slo.signal} histogram scraped from {target.name} yet"
            continue
        for ref in mine:
            problem = buckets.not_a_bound(ref.bounds, slo.threshold, f"{target.name}'s {slo.signal} histogram")
            if problem is not None:
                errors[target.id] = problem + " - this target is not evaluated"
                break
    return errors


def _burn_alerts(slo: SloObjective, windows: dict[float, SloWindow]) -> tuple[BurnAlertState, ...]:
    return tuple(BurnAlertState(alert.kind, slo.severities[alert.kind], windows[alert.long], windows[alert.short],
                                alert.factor, windows[alert.long].burn_rate(slo.objective),
                                windows[alert.short].burn_rate(slo.objective))
                 for alert in slo.burn_alerts)


#: per SLO name: per target id, (good, total, oldest) per span (the SLO's windows, then its period)
SloSums = dict[str, dict[int, list[tuple[float, float, float | None]]]]
#: per SLO name: per target id, why it is not evaluated
SloErrors = dict[str, dict[int, str]]


def slo_status(session: Session, slo: SloObjective, now: float, retention: float,
               targets: Sequence[Target] | None = None,
               source_sums: Mapping[int, Sequence[tuple[float, float, float | None]]] | None = None,
               source_errors: Mapping[int, str] | None = None) -> SloStatus:
    """The SLO now. ``source_sums``: per target a Prometheus source reads, (good, total,
    oldest) over each of :meth:`SloObjective.windows` then the period, as
    :meth:`app.windows.base.WindowReader.slo_sums` answers them; the other targets' come from
    ``slo_increments``. ``source_errors``: targets whose source could not answer."""
    chosen = record.matched_targets(session, slo, targets)
    own = [t for t in chosen if t.source not in DISCOVERED_BY_SOURCES]
    windows = slo.windows()
    spans = [*windows, slo.period]
    errors = target_errors(session, slo, own)
    errors.update(source_errors or {})
    sums = slo_repository.window_sums(session, slo.name, slo.signal, slo.threshold,
                                      [t.id for t in own if t.id not in errors], spans, now)
    sums.update({k: list(v) for k, v in (source_sums or {}).items() if k not in errors})
    parts = []
    for target in chosen:
        error = errors.get(target.id)
        if error is None and target.source in DISCOVERED_BY_SOURCES and target.id not in sums:
            error = "its Prometheus source has not answered this SLO's queries"
        per = sums.get(target.id)
        by_window = {span: _window(span, per[i] if per else None, now) for i, span in enumerate(spans)}
        parts.append(SloTargetStatus(target.name, dict(target.labels), by_window[slo.period],
                                     tuple(by_window[w] for w in windows),
                                     () if error else _burn_alerts(slo, by_window), error))
    evaluated = [p for p in parts if p.error is None]
    period = _aggregate(slo.period, [p.period for p in evaluated if p.period is not None])
    total_windows = tuple(_aggregate(w, [p.windows[i] for p in evaluated]) for i, w in enumerate(windows))
    coverage = min(1.0, period.covered / slo.period)
    note = None
    if coverage < 0.999 and evaluated:
        note = (f"data covers {format_duration(round(period.covered))} of the {format_duration(slo.period)} period; "
                "SLI and budget are over what exists")
        if slo.period > retention:
            note += (f" (samples are kept {format_duration(retention)}, the SLO's recorded increments for its whole "
                     "period, so coverage grows as the service runs)")
        if any(t.source in DISCOVERED_BY_SOURCES for t in chosen):
            note += " (a Prometheus source's numbers cover what its server still holds)"
    return SloStatus(slo.name, slo.signal, slo.threshold, slo.objective, slo.period, period, total_windows,
                     tuple(parts), coverage, note, tuple(f"{p.target}: {p.error}" for p in parts if p.error))


def slo_statuses(session: Session, slos: Sequence[SloObjective], now: float, retention: float,
                 source_sums: Mapping[str, Mapping[int, Sequence[tuple[float, float, float | None]]]] | None = None,
                 source_errors: Mapping[str, Mapping[int, str]] | None = None) -> list[SloStatus]:
    """Every SLO now (see :func:`slo_status`); the sources' numbers per SLO name."""
    targets = target_repository.list_targets(session)
    return [slo_status(session, slo, now, retention, targets, (source_sums or {}).get(slo.name),
                       (source_errors or {}).get(slo.name)) for slo in slos]
