"""The diagnosis round's self-metrics: verdicts, findings and alert states, and the capacity
signal (``llm_latency_diagnosis_*``, ``llm_latency_finding_*``, ``llm_latency_alert_state``,
``llm_latency_capacity_*``; :mod:`app.telemetry` lists every family)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily

from app.diagnosis.capacity import Capacity
from app.runtime.rendered import RenderedPerRound


class DiagnosisCollector(RenderedPerRound):
    """Exports the latest diagnoses and alerts; both lists are replaced by their jobs."""

    _data = ("diagnoses", "alerts")

    def __init__(self) -> None:
        self.diagnoses: list[dict] = []   # Diagnosis.to_dict() with finding states
        self.alerts: list[tuple[str, str, str, str]] = []  # (alertname, target, severity, state)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        verdict = GaugeMetricFamily("llm_latency_diagnosis_verdict", "1 for the current diagnosis verdict.",
                                    labels=["target", "model", "verdict"])
        confidence = GaugeMetricFamily("llm_latency_finding_confidence",
                                       "Confidence of a pending or active finding: 0.5 (its weakest condition on its "
                                       "threshold) to 0.99 (docs/diagnosis.md#confidence).",
                                       labels=["target", "model", "regime", "severity", "state", "primary"])
        evidence = GaugeMetricFamily("llm_latency_finding_evidence", "A number a finding is based on.",
                                     labels=["target", "model", "regime", "evidence"])
        threshold = GaugeMetricFamily("llm_latency_finding_threshold", "The threshold that number was compared with.",
                                      labels=["target", "model", "regime", "evidence"])
        remedy = GaugeMetricFamily("llm_latency_finding_remedy_info", "Remedies of a finding, in order.",
                                   labels=["target", "model", "regime", "rank", "remedy"])
        for d in self.diagnoses:
            target, model = d["target"], d["model"]
            verdict.add_metric([target, model, d["verdict"]], 1.0)
            for f in d["findings"]:
                regime = f["regime"]
                confidence.add_metric([target, model, regime, f["severity"], f.get("state", "pending"),
                                       "true" if f["primary"] else "false"], f["confidence"])
                for e in f["evidence"]:
                    if isinstance(e["value"], (int, float)) and not isinstance(e["value"], bool):
                        evidence.add_metric([target, model, regime, e["name"]], float(e["value"]))
                        if isinstance(e["threshold"], (int, float)) and e["op"] != "info":
                            threshold.add_metric([target, model, regime, e["name"]], float(e["threshold"]))
                for rank, text in enumerate(f["remedies"], 1):
                    remedy.add_metric([target, model, regime, str(rank), text], 1.0)
        alerts = GaugeMetricFamily("llm_latency_alert_state", "1 per pending or firing alert.",
                                   labels=["alertname", "target", "severity", "state"])
        for alertname, target, severity, state in self.alerts:
            alerts.add_metric([alertname, target, severity, state], 1.0)
        yield from (verdict, confidence, evidence, threshold, remedy, alerts)


class CapacityCollector(RenderedPerRound):
    """Exports the capacity signal (:mod:`app.diagnosis.capacity`); the list is replaced after each
    diagnosis round."""

    _data = ("assessments",)

    def __init__(self) -> None:
        self.assessments: list[Capacity] = []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        labels = ["target", "model"]
        desired = GaugeMetricFamily("llm_latency_capacity_desired_replicas",
                                    "Replicas the current load needs; the current count when more replicas would "
                                    "not help (see scaling_helps).", labels=labels)
        current = GaugeMetricFamily("llm_latency_capacity_current_replicas",
                                    "Replicas the signal was computed for: 1 for an engine, a service's replicas.",
                                    labels=labels)
        utilization = GaugeMetricFamily("llm_latency_capacity_utilization",
                                        "Largest load input; 1 = exactly the current replicas.", labels=labels)
        inputs = GaugeMetricFamily("llm_latency_capacity_input_utilization",
                                   "One load input of the capacity signal (slots, kv_cache, arrival).",
                                   labels=[*labels, "input"])
        burn = GaugeMetricFamily("llm_latency_capacity_slo_burn_rate",
                                 "Burn rate of the SLO burning fastest on the target, the lower of its two shortest "
                                 "windows'; above 1 the signal asks for one more replica.", labels=[*labels, "slo"])
        helps = GaugeMetricFamily("llm_latency_capacity_scaling_helps",
                                  "1 when more or fewer replicas are the answer; 0 holds, reason says why.",
                                  labels=[*labels, "reason"])
        for c in self.assessments:
            key = [c.target, c.model]
            desired.add_metric(key, float(c.desired_replicas))
            current.add_metric(key, float(c.current_replicas))
            if c.utilization is not None:
                utilization.add_metric(key, c.utilization)
            for name, value in c.inputs.items():
                inputs.add_metric([*key, name], value)
            if c.slo is not None and c.slo_burn_rate is not None:
                burn.add_metric([*key, c.slo], c.slo_burn_rate)
            helps.add_metric([*key, c.reason], 1.0 if c.scaling_helps else 0.0)
        yield from (desired, current, utilization, inputs, burn, helps)
