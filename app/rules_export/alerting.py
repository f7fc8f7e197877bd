"""The alerting rules: each regime's PromQL twin (:class:`RegimeAlerts`, the
:class:`app.diagnosis.rules.base.Twin` the regime modules write with), the SLO thresholds,
the target-down alert and the suggested inhibit rules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.alerts.config import TARGET_DOWN, SloConfig, regime_alertname, runbook_url
from app.config import FileConfig, TargetConfig
from app.core.thresholds import Thresholds
from app.diagnosis.rules import RULES
from app.diagnosis.rules.base import Rule
from app.promql.text import (
    and_on,
    human_seconds,
    instance_selector,
    num,
    prom_duration,
    quantile_name,
)
from app.rules_export.engines import SLO_WORDS, EngineExposition, Scope
from app.rules_export.recording import Group

# ----------------------------------------------------------------------------- alerts


@dataclass(frozen=True)
class Links:
    external_url: str
    dashboard_url: str
    labels: tuple[str, ...] = ("instance",)  # the dashboards' variables that name a target

    def annotations(self, alertname: str, summary: str, description: str) -> dict[str, str]:
        out = {"summary": summary, "description": description,
               "runbook_url": runbook_url(self.external_url, alertname)}
        if self.dashboard_url:
            sep = "&" if "?" in self.dashboard_url else "?"
            values = "&".join(f"var-{label}={{{{ $labels.{label} }}}}" for label in self.labels)
            out["dashboard_url"] = f"{self.dashboard_url}{sep}{values}"
        return out


def _alert(name: str, expr: str, hold: float, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": prom_duration(hold), "labels": labels, "annotations": annotations}


@dataclass
class RegimeAlerts:
    """What one regime's PromQL twin (``Rule.promql`` / ``promql_profiled`` in its module)
    writes its alerts with, for one engine: the recorded series over the regime window
    (``recorded``, keys of :meth:`Group.all_signals`), the thresholds, the data gate every
    regime alert shares, and :meth:`add`."""

    regime: str
    engine: EngineExposition
    recorded: dict[str, str | None]
    t: Thresholds
    w: str  # the regime window as a Prometheus duration
    hold: float
    links: Links
    hardware: list[TargetConfig]  # the targets with a hardware profile (decode floor)
    alerts: list[dict[str, Any]]  # where add() appends

    @property
    def gate(self) -> str:
        """Enough engine traffic in the window, like ``engine.data_problems``."""
        r, t = self.recorded, self.t
        if "steps" not in r:  # no per-step ITL: requests only
            return f"({r['requests']} >= {num(t.min_requests)})"
        return f"({r['requests']} >= {num(t.min_requests)}) or ({r['steps']} >= {num(t.min_decode_steps)})"

    def and_(self, *parts: str) -> str:
        """Every condition on the same series (the engine's aggregation labels)."""
        return and_on(*parts, on=self.engine.labels)

    def add(self, severity: str, expr: str, summary: str, description: str,
            extra: dict[str, str] | None = None) -> None:
        labels = {"severity": severity, "regime": self.regime, "engine": self.engine.name, **(extra or {})}
        name = regime_alertname(self.regime)
        self.alerts.append(_alert(name, expr, self.hold, labels, self.links.annotations(name, summary, description)))


def regime_alerts(g: Group, recorded: dict[str, str | None], t: Thresholds, w: str, hold: float, links: Links,
                   hardware: list[TargetConfig]) -> list[dict[str, Any]]:
    """Every regime's twin alerts for one engine, listed from symptom to cause (reverse
    precedence): first the regimes that need no hardware profile, then per profiled target
    the alerts against its decode floor, then what those regimes say without a floor."""
    exported = [rule for rule in reversed(RULES) if rule.promql is not None]
    out: list[dict[str, Any]] = []

    def write(rule: Rule, twin: Callable[..., None], *args: Any) -> None:
        """The twin's alerts for this engine, or none when it reads a number the engine does not
        export (the built-in diagnosis lists that regime as not judged)."""
        alerts: list[dict[str, Any]] = []
        try:
            twin(RegimeAlerts(rule.regime, g.engine, recorded, t, w, hold, links, hardware, alerts), *args)
        except KeyError:
            return
        out.extend(alerts)

    plain = [(rule, rule.promql) for rule in exported if rule.promql and rule.promql_profiled is None]
    profiled = [(rule, rule.promql, rule.promql_profiled) for rule in exported if rule.promql and rule.promql_profiled]
    for rule, twin in plain:
        write(rule, twin)
    for target in hardware:
        for rule, _, twin_with_floor in profiled:
            write(rule, twin_with_floor, target)
    for rule, twin, _ in profiled:
        write(rule, twin)
    return out


def slo_alerts(g: Group, config: FileConfig, links: Links, scope: Scope,
               fit: Callable[[float], float] = float) -> list[dict[str, Any]]:
    """The ``alerts.slos`` quantile alerts of one engine, each over its window (``fit``: made at
    least a few scrape intervals long)."""
    e = g.engine
    alerts = []
    for index, slo in enumerate(config.alerts.slos):
        if not e.supports(slo.signal):
            continue
        targets = _slo_targets(config, slo, index, scope)
        if targets is None:
            continue
        selector = instance_selector(targets)
        w = prom_duration(fit(slo.window))
        series = g.quantile(slo.signal, slo.quantile, w)
        what = f"{SLO_WORDS[slo.signal]} {quantile_name(slo.quantile)}"
        derived = ""
        if e.name == "tgi" and slo.signal == "ttft":
            derived = " (queue + prefill-batch quantiles: TGI exports no TTFT)"
        alerts.append(_alert(
            slo.alertname, f"{series}{selector} > {num(slo.threshold)}", slo.for_,
            {"severity": slo.severity, "slo": slo.name, "engine": e.name},
            links.annotations(
                slo.alertname, f"{what} above {human_seconds(slo.threshold)} on {e.title} (SLO {slo.name})",
                f"{e.who()}: {what}{derived} over the last {w} is {{{{ $value | humanizeDuration }}}}, above the "
                f"{human_seconds(slo.threshold)} objective"
                + (f" for at least {prom_duration(slo.for_)}." if slo.for_ else "."))))
    return alerts


def _slo_targets(config: FileConfig, slo: SloConfig, index: int, scope: Scope) -> list[TargetConfig] | None:
    """The scraped targets an SLO is limited to ([] = all); None when it concerns no target of a source."""
    if slo.targets is None:
        return []
    by_name = {t.name: t for t in config.targets}
    if scope.source is not None:
        # Targets of a source are named after label values the export cannot know; an SLO
        # limited to the static targets of the file is not about this Prometheus' series.
        others = [name for name in slo.targets if name not in by_name]
        if others:
            raise ValueError(f"alerts.slos[{index}].targets: rules for source {scope.source.name!r} group by its "
                             f"target_labels and cannot be limited to named targets ({', '.join(map(repr, others))});"
                             " leave targets out or narrow the source's selector")
        return None
    unknown = [name for name in slo.targets if name not in by_name]
    if unknown:
        raise ValueError(f"alerts.slos[{index}].targets: unknown target(s) {', '.join(map(repr, unknown))}")
    return [by_name[name] for name in slo.targets]


def target_down(config: FileConfig, links: Links, scope: Scope) -> dict[str, Any]:
    hold = prom_duration(config.alerts.target_down_for)
    if scope.source is not None:
        by = ", ".join(scope.labels)
        who = "/".join(f"{{{{ $labels.{label} }}}}" for label in scope.labels)
        up = f"up{{{scope.matchers}}}" if scope.matchers else "up"
        return _alert(
            TARGET_DOWN, f"max by ({by}) ({up}) == 0", config.alerts.target_down_for, {"severity": "warning"},
            links.annotations(
                TARGET_DOWN, f"Prometheus cannot scrape {who}",
                f"Prometheus has failed to scrape {who} for at least {hold}: latency and regime alerts for it "
                f"see no data."))
    selector = instance_selector(config.targets)
    return _alert(
        TARGET_DOWN, f"up{selector} == 0", config.alerts.target_down_for, {"severity": "warning"},
        links.annotations(
            TARGET_DOWN, "Prometheus cannot scrape {{ $labels.instance }}",
            f"Job {{{{ $labels.job }}}} has failed to scrape {{{{ $labels.instance }}}} for at least {hold}: latency "
            f"and regime alerts for it see no data."))


def inhibit_rules(scope: Scope | None = None) -> list[dict[str, Any]]:
    """Alertmanager inhibit_rules from the regime rules' ``causes`` (+ critical over warning), for
    the regimes these rules export (a regime without a PromQL twin raises no exported alert)."""
    labels = list((scope or Scope()).labels)
    out = []
    for rule in RULES:
        if rule.causes and rule.promql is not None:
            out.append({"source_matchers": [f'alertname="{regime_alertname(rule.regime)}"'],
                        "target_matchers": ['alertname=~"' + "|".join(regime_alertname(c) for c in rule.causes) + '"'],
                        "equal": list(labels)})
    out.append({"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
                "equal": ["alertname", *labels]})
    return out
