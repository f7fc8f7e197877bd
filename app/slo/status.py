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
from dataclasses import dataclass

from app.durations import format_duration


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
