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
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app import quantiles
from app.quantiles import HistogramSnapshot, LatencySummary, WindowHistogram
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS, CanonicalInfo
from app.sources.tgi import TTFT_DERIVATION
from app.store import repository
from app.store.repository import SeriesRef
from app.window import RANK_GAUGES, GaugeStats, ItlInterval, ModelWindow, TargetWindow, combine_gauges


@dataclass(frozen=True, slots=True)
class SignalSummary(LatencySummary):
    """One signal's summary in a latency answer. ``derivation`` is set when the engine has no
    histogram of the signal and it is computed from others (TGI's TTFT = queue + prefill)."""

    derivation: str | None = None

    @classmethod
    def of(cls, summary: LatencySummary, derivation: str | None = None) -> SignalSummary:
        return cls(summary.p50, summary.p90, summary.p95, summary.p99, summary.mean, summary.count, derivation)

    @property
    def derived(self) -> bool:
        return self.derivation is not None

    def to_dict(self) -> dict[str, float | bool | str | None]:
        """The JSON form: the quantiles, plus ``derived``/``derivation`` for a derived signal."""
        out: dict[str, float | bool | str | None] = {
            "p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99, "mean": self.mean,
            "count": self.count}
        if self.derivation is not None:
            out["derived"] = True
            out["derivation"] = self.derivation
        return out


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


def _derived_ttft(queue: LatencySummary, prefill: LatencySummary) -> SignalSummary:
    """TGI: TTFT ≈ queue + prefill, per quantile (what TGI's own dashboard shows)."""

    def add(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    return SignalSummary(add(queue.p50, prefill.p50), add(queue.p90, prefill.p90), add(queue.p95, prefill.p95),
                         add(queue.p99, prefill.p99), add(queue.mean, prefill.mean), queue.count, TTFT_DERIVATION)


def summarize_histograms(histograms: dict[str, WindowHistogram | None]) -> dict[str, SignalSummary]:
    """The latency answer's per-signal summaries: every histogram signal with data in the
    window, plus TGI's TTFT derived from queue + prefill when the engine has no TTFT."""
    out: dict[str, SignalSummary] = {}
    for signal in HISTOGRAM_SIGNALS:
        merged = histograms.get(signal)
        if merged is not None:
            out[signal] = SignalSummary.of(quantiles.summarize(merged))
    if "ttft" not in out and "queue_time" in out and "prefill_time" in out:
        out["ttft"] = _derived_ttft(out["queue_time"], out["prefill_time"])
    return out


def summarize_signals(loaded: LoadedHistograms, start: float, end: float,
                      model: str | None = None) -> dict[str, SignalSummary]:
    return summarize_histograms({signal: loaded.merged(start, end, signal, model) for signal in HISTOGRAM_SIGNALS})


def summaries_dict(summaries: dict[str, SignalSummary]) -> dict[str, dict[str, float | bool | str | None]]:
    """Per-signal summaries in their JSON form."""
    return {signal: summary.to_dict() for signal, summary in summaries.items()}


def _model_window(loaded: LoadedHistograms, scalar_series: Sequence[SeriesRef],
                  points: dict[int, list[tuple[float, float]]], start: float, end: float,
                  model: str | None) -> ModelWindow:
    """One model's (``None``: every model's) histograms, gauges and rates from stored samples."""
    window = ModelWindow()
    for signal in sorted({s.signal for s in loaded.series if model is None or s.model == model}):
        window.histograms[signal] = loaded.merged(start, end, signal, model)
    gauges: dict[str, list[GaugeStats]] = defaultdict(list)
    rates: dict[str, float] = {}
    by_rank: dict[str, dict[str, float]] = defaultdict(dict)
    for s in scalar_series:
        if model is not None and s.model != model:
            continue
        pts = points.get(s.id, [])
        if s.kind == "counter":
            value = quantiles.rate(pts, start, end)
            if value is not None:
                rates[s.signal] = rates.get(s.signal, 0.0) + value
        elif pts:
            values = [v for _, v in pts]
            gauges[s.signal].append(GaugeStats(values[-1], sum(values) / len(values), max(values)))
            if s.signal in RANK_GAUGES:
                by_rank[s.rank][s.signal] = by_rank[s.rank].get(s.signal, 0.0) + sum(values) / len(values)
    window.gauges = {signal: combine_gauges(signal, per_series) for signal, per_series in gauges.items()}
    window.rates = rates
    if len(by_rank) > 1:
        window.ranks = dict(sorted(by_rank.items()))
    return window


def _itl_intervals(loaded: LoadedHistograms, scalar_series: Sequence[SeriesRef],
                   points: dict[int, list[tuple[float, float]]], model: str, start: float,
                   end: float) -> list[ItlInterval]:
    """ITL added between consecutive scrapes of each rank, next to that rank's running batch."""
    running: dict[str, dict[float, float]] = {}
    for ref in scalar_series:
        if ref.model == model and ref.signal == "running":
            running[ref.rank] = dict(points.get(ref.id, []))
    out = []
    for ref in loaded.series:
        if ref.model != model or ref.signal != "itl":
            continue
        snaps = loaded.snapshots.get(ref.id, [])
        gauge = running.get(ref.rank, {})
        for a, b in zip(snaps, snaps[1:]):
            d_count, d_sum = b.count - a.count, b.sum - a.sum
            if d_count <= 0 or d_sum < 0 or math.isnan(d_sum) or a.ts < start or b.ts > end:
                continue
            batch_values = [gauge[t] for t in (a.ts, b.ts) if t in gauge]
            if batch_values:
                out.append(ItlInterval(d_sum, d_count, sum(batch_values) / len(batch_values)))
    return out


def store_window(session: Session, target_ids: Sequence[int], start: float, end: float,
                 signals: Sequence[str] = HISTOGRAM_SIGNALS, *, per_model: bool = True,
                 diagnosis: bool = False) -> TargetWindow:
    """A :class:`TargetWindow` from the built-in store: one or more targets summed by ``le``.

    ``diagnosis`` adds what only the regime rules read, for a single target: the number
    of successful scrapes, the engine's info metrics and the per-interval ITL by batch.
    """
    loaded = load_histograms(session, target_ids, signals, start, end)
    scalar_series = repository.find_series(session, target_ids, (*GAUGE_SIGNALS, *COUNTER_SIGNALS))
    points = repository.scalar_points(session, [s.id for s in scalar_series], start, end)
    window = TargetWindow(start, end, overall=_model_window(loaded, scalar_series, points, start, end, None))
    if per_model:
        for model in sorted({s.model for s in loaded.series} | {s.model for s in scalar_series}):
            window.models[model] = _model_window(loaded, scalar_series, points, start, end, model)
            if diagnosis:
                window.models[model].itl_intervals = _itl_intervals(loaded, scalar_series, points, model,
                                                                    start, end)
    if diagnosis:
        (target_id,) = target_ids
        window.scrapes = len(repository.scrape_times(session, target_id, start, end))
        window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels))
                        for i in repository.target_infos(session, target_id)]
    return window


def _scalars(window: ModelWindow) -> dict:
    """Counters as per-second rates (Prometheus rate()); gauges as last/mean/max over the window."""
    rate_out = {f"{signal.removesuffix('_total')}_per_second": value for signal, value in window.rates.items()}
    queries, hits = window.rates.get("prefix_cache_queries_total"), window.rates.get("prefix_cache_hits_total")
    if queries:
        rate_out["prefix_cache_hit_rate"] = (hits or 0.0) / queries
    gauges = {signal: {"last": g.last, "mean": g.mean, "max": g.max} for signal, g in window.gauges.items()}
    return {"rates": rate_out, "gauges": gauges}


def report_from_window(window: TargetWindow, per_model: bool = True) -> dict:
    """The body of ``GET /api/v1/targets/{name}/latency`` (and the fleet variant)."""
    report: dict = {"start": window.start, "end": window.end, "window_seconds": window.seconds}
    report.update(summaries_dict(summarize_histograms(window.overall.histograms)))
    report.update(_scalars(window.overall))
    if per_model:
        report["models"] = {model: {**summaries_dict(summarize_histograms(m.histograms)), **_scalars(m)}
                            for model, m in window.models.items() if m.histograms}
    return report


def latency_report(session: Session, target_ids: Sequence[int], window: float, end: float,
                   per_model: bool = True) -> dict:
    """The latency answer from the built-in store."""
    return report_from_window(store_window(session, target_ids, end - window, end, per_model=per_model),
                              per_model)


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
        points.append(series_point(t, loaded.merged(t - lookback, t, signal, model), q))
        t += step
    return points


def series_point(t: float, merged: WindowHistogram | None, q: float | None) -> dict:
    """One point of a quantile series: ``histogram_quantile(q, …)`` of the window histogram
    ending at ``t`` (``q=None``: the mean), None where Prometheus would return nothing."""
    value = None
    if merged is not None:
        if q is None:
            value = merged.sum / merged.count if merged.count > 0 else None
        else:
            result = quantiles.histogram_quantile(q, merged.bounds, merged.increases)
            value = None if math.isnan(result) else result
    return {"ts": t, "value": value, "count": None if merged is None else merged.count}


PD_PREFILL_LABEL = "llm_latency_prefill_target"  # on a decode worker's target: the name of its prefill worker
PD_NOTE = ("means over the window, each from the requests its stage finished in it (the prefill and decode "
           "workers see the same requests at different times); means add, quantiles do not")


def pd_split(decode: dict, prefill: dict, prefill_target: str) -> dict:
    """A disaggregated request's TTFT assembled from the latency answers of its decode and prefill
    workers: prefill queue + prefill (prefill worker) + KV transfer + decode queue + first step
    (decode worker: first scheduled -> first token). Means, which add; a stage without data is null
    and so is the total."""

    def mean(report: dict, signal: str) -> float | None:
        return (report.get(signal) or {}).get("mean")

    parts = {"prefill_queue": mean(prefill, "queue_time"), "prefill": mean(prefill, "prefill_time"),
             "kv_transfer": mean(decode, "kv_transfer_time"), "decode_queue": mean(decode, "queue_time"),
             "first_step": mean(decode, "prefill_time")}
    values = list(parts.values())
    total = None if any(v is None for v in values) else sum(v for v in values if v is not None)
    return {"prefill_target": prefill_target, **parts, "ttft_mean": total, "note": PD_NOTE}
