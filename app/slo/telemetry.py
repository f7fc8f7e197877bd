"""The ``llm_latency_slo_*`` gauges on ``/metrics``: the SLOs as the last alerting round saw them.

Set from the same :class:`~app.slo.status.SloStatus` list the burn-rate alerts used (the round
replaces it), so ``/metrics``, ``GET /api/v1/slos`` and the alerts show one computation; no
database work at scrape time. ``window`` is a Prometheus duration (``5m``, ``1h``, ... and the
period, e.g. ``28d``). An SLO's totals are over its matched targets; ``_target_`` gauges are
each target's part (see app/slo/status.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.slo.status import SloStatus, SloWindow


class SloCollector(Collector):
    def __init__(self) -> None:
        self.statuses: Sequence[SloStatus] = ()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily
        objective = g("llm_latency_slo_objective", "The SLO's objective: share of requests at or under the "
                      "threshold.", labels=["slo", "signal"])
        threshold = g("llm_latency_slo_threshold_seconds", "The SLO's latency threshold (a bucket bound).",
                      labels=["slo", "signal"])
        sli = g("llm_latency_slo_sli", "Share of requests at or under the threshold over the window (matched "
                "targets together).", labels=["slo", "window"])
        requests = g("llm_latency_slo_requests", "Requests over the window, good (at or under the threshold) and "
                     "total.", labels=["slo", "window", "kind"])
        burn = g("llm_latency_slo_burn_rate", "Error-budget burn rate over the window (1 = spent exactly over the "
                 "period).", labels=["slo", "window"])
        budget = g("llm_latency_slo_error_budget_remaining", "Share of the period's error budget left (negative: "
                   "overspent).", labels=["slo"])
        exhaustion = g("llm_latency_slo_time_to_exhaustion_seconds", "Seconds until the budget left is spent at "
                       "the current burn rate (absent when nothing burns).", labels=["slo"])
        coverage = g("llm_latency_slo_period_coverage", "Share of the period with recorded data.", labels=["slo"])
        target_burn = g("llm_latency_slo_target_burn_rate", "A target's burn rate over the window.",
                        labels=["slo", "target", "window"])
        target_budget = g("llm_latency_slo_target_error_budget_remaining", "A target's share of the budget left.",
                          labels=["slo", "target"])
        error = g("llm_latency_slo_target_error", "1 when the SLO cannot be evaluated on the target (no bucket at "
                  "the threshold, no histogram, source down).", labels=["slo", "target"])

        def windows(status: SloStatus, values: Sequence[SloWindow]) -> Iterable[SloWindow]:
            yield from values
            yield status.period

        for status in self.statuses:
            objective.add_metric([status.name, status.signal], status.objective)
            threshold.add_metric([status.name, status.signal], status.threshold)
            for window in windows(status, status.windows):
                requests.add_metric([status.name, window.label, "good"], window.good)
                requests.add_metric([status.name, window.label, "total"], window.total)
                if window.sli is not None:
                    sli.add_metric([status.name, window.label], window.sli)
                rate = window.burn_rate(status.objective)
                if rate is not None:
                    burn.add_metric([status.name, window.label], rate)
            if status.budget_remaining is not None:
                budget.add_metric([status.name], status.budget_remaining)
            if status.time_to_exhaustion is not None:
                exhaustion.add_metric([status.name], status.time_to_exhaustion)
            coverage.add_metric([status.name], status.coverage)
            for part in status.targets:
                error.add_metric([status.name, part.target], 0.0 if part.error is None else 1.0)
                if part.error is not None or part.period is None:
                    continue
                for window in (*part.windows, part.period):
                    rate = window.burn_rate(status.objective)
                    if rate is not None:
                        target_burn.add_metric([status.name, part.target, window.label], rate)
                rate = part.period.burn_rate(status.objective)
                if rate is not None:
                    target_budget.add_metric([status.name, part.target], 1.0 - rate)
        yield from (objective, threshold, sli, requests, burn, budget, exhaustion, coverage, target_burn,
                    target_budget, error)
