"""Every self-metric of the service, on a registry the app owns (one per app instance).

Exported at ``/metrics`` for the Prometheus that watches this service (and the Grafana
dashboards built on it). Labels are bounded: ``target`` (as many as configured),
``model`` (as many as the targets serve), and small fixed sets for ``signal``,
``quantile``, ``result``/``error_class``. The per-target families are not on the registry:
those a round replaces whole (latency summaries, diagnoses and alerts, capacity) are rendered
once per round (:class:`RenderedPerRound`), those a scrape sets once per scrape of the target
(:class:`ScrapeFamilies`), and ``/metrics`` is the registry's text followed by theirs
(:meth:`Telemetry.exposition`).

Scrape health
    llm_latency_scrapes_total{target,result}            counter; result = ok or an error class
    llm_latency_scrape_duration_seconds                  histogram over all targets
    llm_latency_target_up{target}                        1 when the last scrape succeeded
    llm_latency_target_last_scrape_timestamp_seconds{target}
    llm_latency_target_scrape_bytes{target}              size of the last page
    llm_latency_target_samples_kept{target}              samples kept from the last page
    llm_latency_target_malformed_lines{target}           malformed lines on the last page
Storage
    llm_latency_storage_writes_total{result}             scrapes written (ok), failed (error), or refused by the
                                                         store (refused: stored as down; stored_series_limit)
    llm_latency_storage_write_seconds                    duration of one batch write
    llm_latency_write_queue_scrapes                      scrapes waiting to be written
    llm_latency_not_owned_total{stage}                   replicas: a scrape not started (scrape) or its result
                                                         not written (write): the target was handed over
Rounds (diagnosis, summaries, alerts, prune; ``round`` is the job's name)
    llm_latency_round_duration_seconds{round}            histogram of each run's duration
    llm_latency_round_overruns_total{round}              runs that took longer than their interval
    llm_latency_round_skips_total{round,reason}          runs the scheduler did not start: missed | overlap
    llm_latency_round_target_errors_total{round}         targets whose evaluation failed in a round (the others were)
Prometheus sources
    llm_latency_source_bad_series_total{source,reason}   series dropped: bad_bound | bad_count | bad_label
API
    llm_latency_requests_stopped_total{reason}           expensive reads stopped: budget (503) | disconnect
Alerts
    llm_latency_alert_notifications_total                notifications written to the outbox
    llm_latency_deliveries_total{receiver,result}        delivery attempts (ok | error)
Derived latency (recomputed every summary interval over ``latency_window``)
    llm_latency_quantile_seconds{target,model,signal,quantile}
    llm_latency_mean_seconds{target,model,signal}
    llm_latency_observations{target,model,signal}        observations in the window
Diagnosis (after every diagnosis round)
    llm_latency_diagnosis_verdict{target,model,verdict}  1 for the current verdict (regime id, healthy,
                                                         not_judged, insufficient_data); a state timeline in Grafana
    llm_latency_finding_confidence{target,model,regime,severity,state,primary}   per pending/active finding
    llm_latency_finding_evidence{target,model,regime,evidence}    the numbers behind a finding
    llm_latency_finding_threshold{target,model,regime,evidence}   ... and what they were compared with
    llm_latency_finding_remedy_info{target,model,regime,rank,remedy}   1, the remedies in order
Capacity (app/diagnosis/capacity.py, after every diagnosis round; per target or service and model)
    llm_latency_capacity_desired_replicas{target,model}  replicas the load needs (= current when scaling won't help)
    llm_latency_capacity_current_replicas{target,model}  1 for an engine, the replicas with data for a service
    llm_latency_capacity_utilization{target,model}       the largest input (1 = exactly the current replicas)
    llm_latency_capacity_input_utilization{target,model,input}   each input: slots, kv_cache, arrival
    llm_latency_capacity_slo_burn_rate{target,model,slo} the fastest SLO burn on the target (two shortest windows)
    llm_latency_capacity_scaling_helps{target,model,reason}      1 when an autoscaler may act on it; reason = the
                                                         verdict that decided (a regime, healthy, not_judged, ...)
Probes (app/probe/telemetry.py): llm_latency_probe_{ttft,itl,e2e}_seconds{target,kind,concurrency,quantile}, ...
Alerts (after every alerting round)
    llm_latency_alert_state{alertname,target,severity,state}   1 per pending/firing alert
Change events (app/attribution/telemetry.py; after every events round)
    llm_latency_change_event_last_timestamp_seconds{target,kind}   when the target's newest event of a kind
                                                         happened (restart, config, replicas, regime, step)
SLOs of the ``slos:`` section (app/slo/telemetry.py; after every alerting round; ``window`` = 5m, 1h, ..., the period)
    llm_latency_slo_objective{slo,signal}, llm_latency_slo_threshold_seconds{slo,signal}
    llm_latency_slo_sli{slo,window}                      share of good requests, matched targets together
    llm_latency_slo_requests{slo,window,kind}            good | total requests over the window
    llm_latency_slo_burn_rate{slo,window}                error-budget burn rate (1 = spent exactly over the period)
    llm_latency_slo_error_budget_remaining{slo}          share of the budget left over the period
    llm_latency_slo_time_to_exhaustion_seconds{slo}      at the current burn (absent when nothing burns)
    llm_latency_slo_period_coverage{slo}                 share of the period with data
    llm_latency_slo_target_burn_rate{slo,target,window}, llm_latency_slo_target_error_budget_remaining{slo,target}
    llm_latency_slo_target_error{slo,target}             1 when a target is not evaluated (no bucket at the threshold)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.attribution.telemetry import ChangeEventsCollector
from app.core.quantiles import LatencySummary
from app.diagnosis.telemetry import CapacityCollector, DiagnosisCollector
from app.probe.telemetry import ProbeCollector
from app.runtime.rendered import RenderedPerRound
from app.runtime.scheduling import target_errors
from app.slo.telemetry import SloCollector

ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class SourceCollector(Collector):
    """Counts kept elsewhere, read at scrape time: targets that failed a round
    (:data:`app.runtime.scheduling.target_errors`) and each source's dropped series (``bad_series``:
    set by the service to a function giving ``(source, {reason: series})`` pairs)."""

    def __init__(self) -> None:
        self.bad_series: Callable[[], Iterable[tuple[str, Mapping[str, int]]]] = lambda: ()

    def collect(self) -> Iterable[Metric]:
        errors = CounterMetricFamily("llm_latency_round_target_errors", "Targets whose evaluation failed in a "
                                     "round; the round went on with the others.", labels=["round"])
        for name, count in sorted(target_errors.items()):
            errors.add_metric([name], count)
        bad = CounterMetricFamily("llm_latency_source_bad_series", "Series of a source's answers dropped because "
                                  "they cannot be what the query reads.", labels=["source", "reason"])
        for source, by_reason in self.bad_series():
            for reason, count in sorted(by_reason.items()):
                bad.add_metric([source, reason], count)
        return [errors, bad]


class _Families:
    """What :func:`generate_latest` renders: any object with ``collect()``."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _sections(*families: Metric) -> dict[bytes, bytes]:
    """prometheus_client's text for ``families``, by section: its HELP and TYPE lines -> its
    sample lines. A counter is two sections (``_total``, then ``_created`` as a gauge)."""
    sections: dict[bytes, bytes] = {}
    header = b""
    for line in generate_latest(_Families(*families)).splitlines(keepends=True):
        if line.startswith(b"# HELP"):
            header = line
            sections[header] = b""
        elif line.startswith(b"#"):
            samples = sections.pop(header)
            header += line
            sections[header] = samples
        else:
            sections[header] += line
    return sections


@dataclass
class _TargetScrapeState:
    """One target's values (None: never set; e.g. a source's view sets only up and the time)."""

    up: float | None = None
    last: float | None = None
    size: float | None = None
    kept: float | None = None
    malformed: float | None = None
    results: dict[str, tuple[float, float]] = field(default_factory=dict)  # result -> (count, created)


class ScrapeFamilies:
    """The per-target families a scrape sets: attempts by result, up, last scrape time, page
    size, samples kept, malformed lines. Each target's lines are rendered when its scrape is
    recorded (by prometheus_client, so the text is the library's own) and every read of
    ``/metrics`` joins them: as labelled metrics on the registry every read would render all
    targets' lines (7,000 at 1,000 targets), where a scrape renders its own target's 7 lines
    once. Recorded from the event loop and the sources round (under a lock); read from worker
    threads without one: a target's lines are replaced whole, and the read copies the
    mapping's values in one step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, _TargetScrapeState] = {}
        self._lines: dict[str, tuple[bytes, ...]] = {}  # target -> its lines, one item per section
        every = _TargetScrapeState(1.0, 0.0, 0.0, 0.0, 0.0, {"ok": (1.0, 0.0)})  # a target in every section
        self._headers = tuple(_sections(*self._families({"": every})))

    @staticmethod
    def _families(states: Mapping[str, _TargetScrapeState]) -> tuple[Metric, ...]:
        attempts = CounterMetricFamily("llm_latency_scrapes", "Scrape attempts by target and result.",
                                       labels=["target", "result"])
        gauges = {attr: GaugeMetricFamily(name, help_text, labels=["target"]) for attr, name, help_text in (
            ("up", "llm_latency_target_up", "1 if the last scrape of the target succeeded."),
            ("last", "llm_latency_target_last_scrape_timestamp_seconds", "Time of the last scrape."),
            ("size", "llm_latency_target_scrape_bytes", "Size of the last page."),
            ("kept", "llm_latency_target_samples_kept", "Samples kept from the last page."),
            ("malformed", "llm_latency_target_malformed_lines", "Malformed lines on the last page."))}
        for target, state in states.items():
            for result, (count, created) in state.results.items():
                attempts.add_metric([target, result], count, created=created)
            for attr, family in gauges.items():
                value = getattr(state, attr)
                if value is not None:
                    family.add_metric([target], value)
        return (attempts, *gauges.values())

    def _render(self, target: str, state: _TargetScrapeState) -> None:
        sections = _sections(*self._families({target: state}))
        self._lines[target] = tuple(sections.get(header, b"") for header in self._headers)

    def record(self, target: str, *, up: bool, ts: float, result: str | None = None, size: int | None = None,
               kept: int | None = None, malformed: int | None = None) -> None:
        """One scrape (``result`` counted) or a source's view of the target (up and time only)."""
        with self._lock:
            state = self._state.setdefault(target, _TargetScrapeState())
            state.up, state.last = (1.0 if up else 0.0), ts
            if result is not None:
                count, created = state.results.get(result, (0.0, time.time()))
                state.results[result] = (count + 1.0, created)
            for attr, value in (("size", size), ("kept", kept), ("malformed", malformed)):
                if value is not None:
                    setattr(state, attr, float(value))
            self._render(target, state)

    def forget(self, target: str) -> None:
        with self._lock:
            self._state.pop(target, None)
            self._lines.pop(target, None)

    def exposition(self) -> bytes:
        rendered = list(self._lines.values())
        return b"".join(header + b"".join(lines[i] for lines in rendered) for i, header in enumerate(self._headers))


class DerivedLatencyCollector(RenderedPerRound):
    """Exposes the latest latency summaries; computed by a job, not at scrape time,
    so a Prometheus scraping every 5 s never triggers database work."""

    _data = ("summaries",)

    def __init__(self) -> None:
        # (target, model, signal) -> its summary over the latency window
        self.summaries: Mapping[tuple[str, str, str], LatencySummary] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        quantile = GaugeMetricFamily("llm_latency_quantile_seconds",
                                     "Latency quantile over the service's latency window, per target/model/signal.",
                                     labels=["target", "model", "signal", "quantile"])
        mean = GaugeMetricFamily("llm_latency_mean_seconds", "Mean latency over the latency window.",
                                 labels=["target", "model", "signal"])
        count = GaugeMetricFamily("llm_latency_observations", "Observations in the latency window.",
                                  labels=["target", "model", "signal"])
        for (target, model, signal), summary in sorted(self.summaries.items()):
            for key, q in (("p50", "0.5"), ("p90", "0.9"), ("p95", "0.95"), ("p99", "0.99")):
                value = getattr(summary, key)
                if value is not None:
                    quantile.add_metric([target, model, signal, q], value)
            if summary.mean is not None:
                mean.add_metric([target, model, signal], summary.mean)
            count.add_metric([target, model, signal], summary.count or 0.0)
        yield quantile
        yield mean
        yield count


class Telemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scrape_duration = Histogram("llm_latency_scrape_duration_seconds", "Duration of scrapes (fetch + parse).",
                                         buckets=SCRAPE_BUCKETS, registry=r)
        self.targets = ScrapeFamilies()  # per target, rendered once per scrape (exposition())
        self.writes = Counter("llm_latency_storage_writes", "Scrapes written to the database.", ["result"], registry=r)
        self.write_seconds = Histogram("llm_latency_storage_write_seconds", "Duration of one batch write.",
                                       buckets=SCRAPE_BUCKETS, registry=r)
        self.queue_depth = Gauge("llm_latency_write_queue_scrapes", "Scrapes waiting to be written.", registry=r)
        self.not_owned = Counter("llm_latency_not_owned", "Scrapes not started (scrape) or not written (write) "
                                 "because the target was handed over to another replica.", ["stage"], registry=r)
        self.round_duration = Histogram("llm_latency_round_duration_seconds", "Duration of each periodic round.",
                                        ["round"], buckets=ROUND_BUCKETS, registry=r)
        self.round_overruns = Counter("llm_latency_round_overruns", "Rounds that took longer than their interval.",
                                      ["round"], registry=r)
        self.round_skips = Counter("llm_latency_round_skips", "Round runs the scheduler did not start "
                                   "(missed: past the grace time; overlap: the previous run still going).",
                                   ["round", "reason"], registry=r)
        self.requests_stopped = Counter("llm_latency_requests_stopped", "Expensive reads stopped before their "
                                        "answer: budget (api_request_budget spent, 503) or disconnect (client gone).",
                                        ["reason"], registry=r)
        self.alert_notifications = Counter("llm_latency_alert_notifications", "Notifications written to the outbox.",
                                           registry=r)
        self.deliveries = Counter("llm_latency_deliveries", "Notification delivery attempts.", ["receiver", "result"],
                                  registry=r)
        # per target and replaced by rounds: rendered once per round (exposition()), not on this registry
        self.derived = DerivedLatencyCollector()
        self.diagnosis = DiagnosisCollector()
        self.capacity = CapacityCollector()
        self.changes = ChangeEventsCollector()
        self.per_round: tuple[RenderedPerRound, ...] = (self.derived, self.diagnosis, self.capacity, self.changes)
        self.probes = ProbeCollector()  # client-side probe and canary results (app/probe/telemetry.py)
        r.register(self.probes)
        self.slo = SloCollector()  # the slos: section's budgets and burn rates (app/slo/telemetry.py)
        r.register(self.slo)
        self.sources = SourceCollector()
        r.register(self.sources)

    def exposition(self) -> bytes:
        """The body of ``/metrics``: the registry's metrics, then the round collectors' text
        as their last round left it (families disjoint, so the two parts concatenate)."""
        return (generate_latest(self.registry) + self.targets.exposition()
                + b"".join(c.rendered() for c in self.per_round))

    def observe_round(self, name: str, seconds: float, interval: float) -> None:
        """One run of a periodic round (:func:`app.runtime.scheduling.add_round`)."""
        self.round_duration.labels(name).observe(seconds)
        if seconds > interval:
            self.round_overruns.labels(name).inc()

    def round_skipped(self, name: str, reason: str) -> None:
        self.round_skips.labels(name, reason).inc()

    def record_scrape(self, target: str, up: bool, error_class: str | None, duration: float, size: int,
                      kept: int, malformed: int, ts: float) -> None:
        self.scrape_duration.observe(duration)
        self.targets.record(target, up=up, ts=ts, result="ok" if up and not error_class else (error_class or "down"),
                            size=size, kept=kept, malformed=malformed)

    def record_refused(self, target: str, ts: float) -> None:
        """A scrape the store refused (:class:`app.store.writer.Refused`): the target down."""
        self.writes.labels("refused").inc()
        self.targets.record(target, up=False, ts=ts)

    def forget_target(self, target: str) -> None:
        self.targets.forget(target)
        self.derived.summaries = {k: v for k, v in self.derived.summaries.items() if k[0] != target}
        self.diagnosis.diagnoses = [d for d in self.diagnosis.diagnoses if d["target"] != target]
        self.capacity.assessments = [c for c in self.capacity.assessments if c.target != target]
        self.changes.last = {k: v for k, v in self.changes.last.items() if k[0] != target}
        self.probes.forget_target(target)
