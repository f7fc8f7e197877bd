"""The typed result of a diagnosis: findings with their evidence and remedies."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from app.core import human

if TYPE_CHECKING:
    REGIMES: tuple[str, ...]
    PROBE_REGIMES: tuple[str, ...]
    VERDICTS: tuple[str, ...]

#: The verdicts that are not a regime (the regimes are read from the registry: ``__getattr__``):
#: ``healthy`` only when every rule that applies was judged, none fired and the latency is in its
#: expected range; ``insufficient_data`` when the window has too little traffic to judge;
#: ``not_judged`` when nothing fired but some rule could not be judged (``Diagnosis.not_judged``).
NON_REGIME_VERDICTS = ("healthy", "insufficient_data", "not_judged")
SEVERITIES = ("critical", "warning", "info")
#: What a finding's confidence is (docs/diagnosis.md#confidence; computed by
#: :func:`app.diagnosis.rules.base.confidence`), for the API schema, the status page and /metrics.
CONFIDENCE_MEANING = (
    "How sure the rule is that its pattern holds, 0.5 to 0.99 (never lower: a finding fires only when every "
    "condition is met). 0.5 when the weakest condition that fired sits on its threshold, where a little noise "
    "would flip it; rising as that condition lies further past it (all the way at four times the threshold, or "
    "for a share at 100 %) and as the window holds more of what the rule reads (all the way at four times its "
    "minimum); half as far above 0.5 for a rule judging without its reference (bandwidth_bound without a "
    "hardware profile, severity info). Severity is separate: the size of the effect (critical past the rule's "
    "critical threshold), so a critical finding at 0.55 is a large effect whose pattern only just holds.")
RUNBOOK_DIR = "docs/runbooks"  # in the source tree


def runbook_link(name: str, base_url: str = "") -> str:
    """Where this service serves runbook ``name``: an absolute URL under ``base_url`` (the
    service's external URL) when it is known, else the path ``/runbooks/<name>``."""
    return f"{base_url.rstrip('/')}/runbooks/{name}"


def __getattr__(name: str) -> tuple[str, ...]:
    """The regime lists, derived from the regime registry (:data:`app.diagnosis.rules.RULES`):

    * ``REGIMES``: every regime id, in precedence order;
    * ``PROBE_REGIMES``: those judged from client-side probes (:mod:`app.probe.consistency`),
      not from the engine's metrics alone (Prometheus has no client measurement, so they
      have no exported rule);
    * ``VERDICTS``: the regimes, then :data:`NON_REGIME_VERDICTS`.

    Read on first use rather than imported at the top: the registry imports the rule
    modules, which import this module's types.
    """
    if name not in ("REGIMES", "PROBE_REGIMES", "VERDICTS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from app.diagnosis.rules import RULES

    regimes = tuple(rule.regime for rule in RULES)
    globals().update(REGIMES=regimes, PROBE_REGIMES=tuple(rule.regime for rule in RULES if rule.from_probes),
                     VERDICTS=(*regimes, *NON_REGIME_VERDICTS))
    return globals()[name]


@dataclass(slots=True)
class Evidence:
    """One number a rule looked at, the threshold it was compared with, and the outcome."""

    name: str
    value: float | str | None
    op: str  # ">=", "<=", ">", "==", "info"
    threshold: float | str | None
    unit: str = ""
    met: bool = True
    note: str = ""
    #: for a quantile: the histogram bucket ``[lower, upper]`` that holds it (upper None: +Inf)
    interval: list[float | None] | None = None

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> Evidence:
        """The evidence a stored finding holds (its JSON form, :func:`dataclasses.asdict`);
        a missing key takes its default, so rows stored by older versions still read."""
        interval = item.get("interval")
        return cls(item.get("name", ""), item.get("value"), item.get("op", ""), item.get("threshold"),
                   item.get("unit") or "", bool(item.get("met", True)), item.get("note") or "",
                   list(interval) if isinstance(interval, (list, tuple)) and len(interval) == 2 else None)

    def text(self) -> str:
        value = _fmt(self.value, self.unit)
        if self.interval is not None and isinstance(self.value, (int, float)):
            value = human.quantile(float(self.value), self.interval, "s" if self.unit == "s" else self.unit)
        if self.op == "info":
            return f"{self.name} = {value}" + (f" ({self.note})" if self.note else "")
        return f"{self.name} = {value} ({self.op} {_fmt(self.threshold, self.unit)})" + (
            f"; {self.note}" if self.note else "")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def plain_json(obj: Any) -> Any:
    """The JSON form of a diagnosis' values in one pass: :func:`dataclasses.asdict` without its
    deep copies (numbers and strings shared), tuples as lists, and every infinite or NaN float as
    null - JSON has none (PostgreSQL's json type refuses them), e.g. the +Inf edge of a bucket, or
    a ratio of a source's non-finite numbers. A diagnosis round converts thousands of findings
    and signals, so the common types are dispatched on first."""
    cls = type(obj)
    if cls is float:
        return obj if math.isfinite(obj) else None
    if cls in _LEAVES:
        return obj
    names = _FIELD_NAMES.get(cls)
    if names is not None:
        return {name: plain_json(getattr(obj, name)) for name in names}
    if cls is list or cls is tuple:
        return [plain_json(v) for v in obj]
    if cls is dict:
        return {k: plain_json(v) for k, v in obj.items()}
    if is_dataclass(obj) and not isinstance(obj, type):
        return {name: plain_json(getattr(obj, name)) for name in field_names(cls)}
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    return obj


def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass' field names (looked up once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


_LEAVES = frozenset({int, str, bool, type(None)})


def window_dict(start: float, end: float) -> dict:
    """The window a number was computed over, as every API response shows it."""
    return {"start": start, "end": end, "seconds": end - start}


def _fmt(value: float | str | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if unit == "s":
        return human.seconds(value)
    if unit == "ratio":
        return f"{value:.2f}"
    if unit == "%":
        return f"{value * 100:.1f} %"
    return human.number(value, unit)


@dataclass(slots=True)
class Finding:
    regime: str
    severity: str
    confidence: float  # 0..1
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    remedies: list[str] = field(default_factory=list)
    primary: bool = False
    caused_by: str | None = None  # the primary regime this one is a symptom of
    # the window every evidence number was computed over (set by the engine from the signals)
    window_start: float | None = None
    window_end: float | None = None

    @property
    def runbook(self) -> str:
        """The runbook's path on the service (``/runbooks/<regime>``)."""
        return runbook_link(self.regime)

    def to_dict(self) -> dict:
        data = plain_json(self)
        assert isinstance(data, dict)
        start, end = data.pop("window_start"), data.pop("window_end")
        data["window"] = window_dict(start, end) if start is not None and end is not None else None
        data["runbook"] = self.runbook
        return data


@dataclass(slots=True)
class Diagnosis:
    """Everything one evaluation concluded for one target and model."""

    target: str
    model: str
    engine: str
    window_start: float
    window_end: float
    verdict: str  # a regime id (the primary finding), or one of NON_REGIME_VERDICTS
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    signals: dict = field(default_factory=dict)
    #: regimes not judged, each ``{"regime": ..., "reason": ...}``: the signals the rule needs
    #: are not on this engine's page, or the numbers cannot decide (a threshold inside the
    #: bucket that holds a quantile, fewer samples than its evidence needs). Any of them makes
    #: a verdict without findings ``not_judged``, never ``healthy``.
    not_judged: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "target": self.target, "model": self.model, "engine": self.engine,
            "window": window_dict(self.window_start, self.window_end),
            "verdict": self.verdict, "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes, "signals": self.signals, "not_judged": self.not_judged,
        }
