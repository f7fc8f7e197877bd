"""Windowed latency answers from stored snapshots: percentiles, rates and gauges.

Every number here is computed the way Prometheus computes it from the same samples
(see :mod:`app.quantiles`): per-bucket ``increase()`` over the window, ``sum by (le)``
across data-parallel ranks, models or targets, then ``histogram_quantile``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from sqlalchemy.orm import Session

from app import quantiles
from app.quantiles import HistogramSnapshot, LatencySummary, WindowHistogram
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS
from app.sources.tgi import TTFT_DERIVATION
from app.store import repository
from app.store.repository import SeriesRef

QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
# Gauges that must be averaged, not summed, across ranks and targets: a KV usage of
# 0.5 on each of two engines is 0.5, not 1.0 (GoogleCloudPlatform dashboards PR #1188).
AVERAGED_GAUGES = {"kv_usage"}


def summary_dict(summary: LatencySummary) -> dict[str, float | None]:
    return asdict(summary)


@dataclass(slots=True)
class LoadedHistograms:
    """Snapshots of the histogram series of one or more targets, loaded once."""

    series: list[SeriesRef]
    snapshots: dict[int, list[HistogramSnapshot]]
    _times: dict[int, list[float]] = field(default_factory=dict, repr=False)

    def window(self, series: SeriesRef, start: float, end: float) -> WindowHistogram | None:
        points = self.snapshots.get(series.id, [])
        times = self._times.get(series.id)
        if times is None:  # built once per series: a time series asks for many windows
            times = self._times[series.id] = [p.ts for p in points]
        lo, hi = bisect.bisect_left(times, start), bisect.bisect_right(times, end)
        return quantiles.window_histogram(series.bounds, points[lo:hi], start, end)

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None:
        parts = [self.window(s, start, end) for s in self.series
                 if s.signal == signal and (model is None or s.model == model)]
        return quantiles.merge(p for p in parts if p is not None)


def load_histograms(session: Session, target_ids: Sequence[int], signals: Sequence[str], start: float,
                    end: float, model: str | None = None) -> LoadedHistograms:
    series = repository.find_series(session, target_ids, signals, model)
    snapshots = repository.histogram_snapshots(session, [s.id for s in series], start, end)
    return LoadedHistograms(series, snapshots)


def _derived_ttft(queue: LatencySummary, prefill: LatencySummary) -> dict:
    """TGI: TTFT ≈ queue + prefill, per quantile (what TGI's own dashboard shows)."""
    out: dict[str, float | None] = {}
    for key in (*QUANTILES, "mean"):
        a, b = getattr(queue, key), getattr(prefill, key)
        out[key] = None if a is None or b is None else a + b
    out["count"] = queue.count
    out["derived"] = True
    out["derivation"] = TTFT_DERIVATION
    return out


def summarize_signals(loaded: LoadedHistograms, start: float, end: float, model: str | None = None) -> dict:
    out: dict[str, dict] = {}
    summaries: dict[str, LatencySummary] = {}
    for signal in HISTOGRAM_SIGNALS:
        merged = loaded.merged(start, end, signal, model)
        if merged is not None:
            summaries[signal] = quantiles.summarize(merged)
            out[signal] = summary_dict(summaries[signal])
    if "ttft" not in out and "queue_time" in out and "prefill_time" in out:
        out["ttft"] = _derived_ttft(summaries["queue_time"], summaries["prefill_time"])
    return out


def scalar_summary(session: Session, target_ids: Sequence[int], start: float, end: float,
                   model: str | None = None) -> dict:
    """Counters as per-second rates (Prometheus rate()); gauges as last/mean/max over the window."""
    series = repository.find_series(session, target_ids, (*GAUGE_SIGNALS, *COUNTER_SIGNALS), model)
    points = repository.scalar_points(session, [s.id for s in series], start, end)
    rates: dict[str, float] = defaultdict(float)
    gauges: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for s in series:
        pts = points.get(s.id, [])
        if s.kind == "counter":
            value = quantiles.rate(pts, start, end)
            if value is not None:
                rates[s.signal] += value
        elif pts:
            values = [v for _, v in pts]
            gauges[s.signal].append((values[-1], sum(values) / len(values), max(values)))
    gauge_out = {}
    for signal, per_series in gauges.items():
        combine = (lambda xs: sum(xs) / len(xs)) if signal in AVERAGED_GAUGES else sum
        gauge_out[signal] = {
            "last": combine([p[0] for p in per_series]),
            "mean": combine([p[1] for p in per_series]),
            "max": combine([p[2] for p in per_series]),
        }
    rate_out = {f"{signal.removesuffix('_total')}_per_second": value for signal, value in rates.items()}
    queries, hits = rates.get("prefix_cache_queries_total"), rates.get("prefix_cache_hits_total")
    if queries:
        rate_out["prefix_cache_hit_rate"] = (hits or 0.0) / queries
    return {"rates": rate_out, "gauges": gauge_out}


def latency_report(session: Session, target_ids: Sequence[int], window: float, end: float,
                   per_model: bool = True) -> dict:
    """The body of ``GET /api/v1/targets/{name}/latency`` (and the fleet variant)."""
    start = end - window
    loaded = load_histograms(session, target_ids, HISTOGRAM_SIGNALS, start, end)
    report = {"start": start, "end": end, "window_seconds": window}
    report.update(summarize_signals(loaded, start, end))
    report.update(scalar_summary(session, target_ids, start, end))
    if per_model:
        models = sorted({s.model for s in loaded.series})
        report["models"] = {
            model: {**summarize_signals(loaded, start, end, model),
                    **scalar_summary(session, target_ids, start, end, model)}
            for model in models
        }
    return report


def quantile_series(session: Session, target_ids: Sequence[int], signal: str, q: float | None, span: float,
                    step: float, lookback: float, end: float, model: str | None = None) -> list[dict]:
    """Points of ``histogram_quantile(q, sum by (le) (increase(x_bucket[lookback])))`` every ``step``.

    ``q=None`` gives the mean (``increase(_sum)/increase(_count)``). Steps are aligned to
    multiples of ``step`` like Grafana does, so repeated calls return the same points.
    """
    first = math.ceil((end - span) / step) * step
    loaded = load_histograms(session, target_ids, (signal,), first - lookback, end, model)
    points = []
    t = first
    while t <= end + 1e-9:
        merged = loaded.merged(t - lookback, t, signal, model)
        value = None
        if merged is not None:
            if q is None:
                value = merged.sum / merged.count if merged.count > 0 else None
            else:
                result = quantiles.histogram_quantile(q, merged.bounds, merged.increases)
                value = None if math.isnan(result) else result
        points.append({"ts": t, "value": value, "count": None if merged is None else merged.count})
        t += step
    return points
