"""The ``slos:`` section of the targets YAML: latency objectives with error budgets.

Example::

    slos:
      - name: chat-ttft
        signal: ttft            # ttft | itl | e2e | queue_time
        threshold: 2.5s         # a bucket bound of the engine's histogram
        objective: 99%          # share of requests at or under the threshold (or 0.99)
        period: 28d             # the error budget's period (default)
        match: {service: chat}  # `name` matches target names, other keys target labels; default: every target
        severities: {page: critical, ticket: warning}   # defaults
        burn_alerts:            # defaults: the Google SRE workbook's (chapter 5, "Alerting on SLOs")
          - {kind: page, long: 1h, short: 5m, factor: 14.4}
          - {kind: page, long: 6h, short: 30m, factor: 6}
          - {kind: ticket, long: 1d, short: 2h, factor: 3}
          - {kind: ticket, long: 3d, short: 6h, factor: 1}

A burn-rate alert fires when the error budget burns at ``factor`` times the rate that
would spend it exactly over ``period``, over both the long and the short window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from app.core.durations import Seconds
from app.core.limits import MAX_TEXT_LENGTH, Labels
from app.slo import buckets

SLO_SIGNALS = ("ttft", "itl", "e2e", "queue_time")
#: The burn-rate alert's name (built in and exported); ``burn`` = page | ticket.
SLO_BURN_ALERT = "LLMLatencySLOBurnRate"
BurnKind = Literal["page", "ticket"]
#: The service's alert severities (app/alerts/config.py); page and ticket map onto them.
Severity = Literal["critical", "warning", "info"]
#: The longest period (and window) an SLO may have: one year.
MAX_PERIOD_SECONDS = 366 * 86400.0


def _objective(value: object) -> object:
    """``99%``/``99.9 %`` -> 0.99/0.999; numbers pass through (0.99)."""
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("%"):
            try:
                return float(text[:-1].strip()) / 100.0
            except ValueError:
                raise ValueError(f"not a percentage: {value!r} (write e.g. 99% or 0.99)") from None
    return value


Objective = Annotated[float, BeforeValidator(_objective)]


class BurnAlert(BaseModel):
    """Fire a ``kind`` alert when the burn rate exceeds ``factor`` over ``long`` and ``short``."""

    model_config = ConfigDict(extra="forbid")

    kind: BurnKind
    long: Seconds = Field(gt=0, le=MAX_PERIOD_SECONDS)
    short: Seconds = Field(gt=0, le=MAX_PERIOD_SECONDS)
    factor: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _short_is_shorter(self) -> BurnAlert:
        if self.short >= self.long:
            raise ValueError("the short window must be shorter than the long one")
        return self


def default_burn_alerts() -> list[BurnAlert]:
    """The Google SRE workbook's multiwindow, multi-burn-rate alerts (table 5-8): 2 % of a
    30-day budget in 1 h or 5 % in 6 h pages, 10 % in 3 days files a ticket."""
    return [BurnAlert(kind="page", long=3600, short=300, factor=14.4),
            BurnAlert(kind="page", long=6 * 3600, short=1800, factor=6),
            BurnAlert(kind="ticket", long=86400, short=7200, factor=3),
            BurnAlert(kind="ticket", long=3 * 86400, short=6 * 3600, factor=1)]


def default_severities() -> dict[BurnKind, Severity]:
    """A page is the service's ``critical``, a ticket its ``warning``."""
    return {"page": "critical", "ticket": "warning"}


class SloObjective(BaseModel):
    """One SLO: ``objective`` of the requests of the matched targets have ``signal`` at or
    under ``threshold``, over every ``period``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    signal: Literal["ttft", "itl", "e2e", "queue_time"]
    threshold: Seconds = Field(gt=0)
    objective: Objective = Field(description="Share of requests at or under the threshold: 99% or 0.99.")
    period: Seconds = Field(28 * 86400.0, gt=0, le=MAX_PERIOD_SECONDS)
    match: Labels = Field(default_factory=dict, description="`name`: a target name; other keys: target labels.")
    severities: dict[BurnKind, Severity] = Field(default_factory=default_severities)
    burn_alerts: list[BurnAlert] = Field(default_factory=default_burn_alerts, max_length=16)
    custom_buckets: bool = Field(False, description=(
        "The engines run with custom histogram buckets: skip the check against their default layouts "
        "(the scraped bounds are still checked at run time)."))
    description: str = Field("", max_length=MAX_TEXT_LENGTH)

    @field_validator("objective")
    @classmethod
    def _strictly_between_0_and_1(cls, objective: float) -> float:
        if not 0.0 < objective < 1.0:
            raise ValueError(f"objective must be strictly between 0 and 1 (0% and 100%), e.g. 99% or 0.99; got "
                             f"{objective:g}")
        return objective

    @field_validator("severities")
    @classmethod
    def _both_kinds(cls, severities: dict[str, str]) -> dict[str, str]:
        return {"page": "critical", "ticket": "warning", **severities}

    @model_validator(mode="after")
    def _alerts_can_fire(self) -> SloObjective:
        budget = 1.0 - self.objective
        for index, alert in enumerate(self.burn_alerts):
            if alert.factor * budget > 1.0:
                which = f"burn_alerts[{index}]" if "burn_alerts" in self.model_fields_set else (
                    f"the default {alert.kind} alert (burn_alerts[{index}], write burn_alerts for this objective)")
                raise ValueError(f"{which}: factor {alert.factor:g} can never be reached: with an "
                                 f"objective of {self.objective:g} the burn rate is at most {1 / budget:.4g} "
                                 "(every request bad)")
            if alert.long > self.period:
                raise ValueError(f"burn_alerts[{index}]: the long window is longer than the period")
        return self

    def matches(self, name: str, labels: dict[str, str]) -> bool:
        """Whether a target (its name and labels) is one of this SLO's."""
        return all((name if key == "name" else labels.get(key)) == value for key, value in self.match.items())

    @property
    def budget(self) -> float:
        """The error budget: the share of requests allowed over the threshold."""
        return 1.0 - self.objective

    def windows(self) -> list[float]:
        """Every window the SLO is evaluated over: the alert windows, shortest first."""
        return sorted({w for a in self.burn_alerts for w in (a.long, a.short)})


def threshold_problems(slos: Sequence[SloObjective], targets: Sequence[Any]) -> list[tuple[tuple, str]]:
    """(field location, message) for every SLO whose threshold is not a bucket bound of the
    default histogram of an engine written in the file for one of its targets (``engine:
    auto`` targets are checked at run time, on the bounds they expose)."""
    problems: list[tuple[tuple, str]] = []
    for index, slo in enumerate(slos):
        if slo.custom_buckets:
            continue
        engines = sorted({t.engine for t in targets if t.engine != "auto" and slo.matches(t.name, dict(t.labels))})
        for engine in engines:
            bounds = buckets.DEFAULT_BOUNDS.get(engine, {}).get(slo.signal)
            if bounds is None:
                problems.append((("slos", index, "signal"),
                                 f"slos[{index}].signal: {engine} exports no {slo.signal} histogram, so its SLI "
                                 "cannot be computed exactly"))
                continue
            message = buckets.not_a_bound(bounds, slo.threshold, f"{engine}'s {slo.signal} histogram (default buckets)")
            if message is not None:
                problems.append((("slos", index, "threshold"), f"slos[{index}].threshold: {message}"))
    return problems
