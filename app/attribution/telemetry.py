"""The change events on ``/metrics``: when each target last had an event of each kind, for the
dashboards' annotations (a Prometheus query cannot read the events table)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily

from app.runtime.rendered import RenderedPerRound


class ChangeEventsCollector(RenderedPerRound):
    """``llm_latency_change_event_last_timestamp_seconds{target,kind}``, replaced after each events
    round (:mod:`app.attribution.rounds`)."""

    _data = ("last",)

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], float] = {}  # (target, kind) -> when its newest event happened

    def collect(self) -> Iterable[GaugeMetricFamily]:
        last = GaugeMetricFamily("llm_latency_change_event_last_timestamp_seconds",
                                 "When the target's newest change event of this kind happened (restart, config, "
                                 "replicas, regime, step; GET /api/v1/targets/{name}/events lists them).",
                                 labels=["target", "kind"])
        for (target, kind), ts in sorted(self.last.items()):
            last.add_metric([target, kind], ts)
        yield last
