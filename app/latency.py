"""Windowed latency answers from stored snapshots: percentiles, rates and gauges.

Every number here is computed the way Prometheus computes it from the same samples
(see :mod:`app.quantiles`): per-bucket ``increase()`` over the window, ``sum by (le)``
across data-parallel ranks, models or targets, then ``histogram_quantile``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app import quantiles
from app.budget import checkpoint
from app.quantiles import HistogramSnapshot, LatencySummary, WindowHistogram, to_millis
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS, CanonicalInfo
from app.sources.tgi import TTFT_DERIVATION
from app.store import levels, repository
from app.store.repository import SeriesRef
from app.window import RANK_GAUGES, RANK_MEANS, GaugeStats, ItlInterval, ModelWindow, TargetWindow, combine_gauges


def _bucket_json(bucket: tuple[float, float]) -> list[float | None]:
    """A bucket as JSON: ``[lower, upper]``, an infinite end as null (JSON has no Infinity)."""
    return [b if math.isfinite(b) else None for b in bucket]


@dataclass(frozen=True, slots=True)
class SignalSummary(LatencySummary):
    """One signal's summary in a latency answer. ``derivation`` is set when the engine has no
    histogram of the signal and it is computed from others (TGI's TTFT from queue and
    prefill): then the quantiles are None and ``bounds`` holds, per quantile, the interval
    the true quantile must lie in (:func:`derived_ttft`)."""

    derivation: str | None = None
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, summary: LatencySummary, derivation: str | None = None) -> SignalSummary:
        return cls(summary.p50, summary.p90, summary.p95, summary.p99, summary.mean, summary.count,
                   dict(summary.intervals), summary.count_estimate, derivation)

    @property
    def derived(self) -> bool:
        return self.derivation is not None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the quantiles, the bucket interval of each (``intervals``), whether the
        count is an extrapolated estimate, plus ``derived``/``derivation``/``bounds`` for a
        derived signal."""
        out: dict[str, Any] = {
            "p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99, "mean": self.mean,
            "count": self.count}
        if self.intervals:
            out["intervals"] = {key: _bucket_json(b) for key, b in self.intervals.items()}
        if self.count_estimate:
            out["count_estimate"] = True
        if self.derivation is not None:
            out["derived"] = True
            out["derivation"] = self.derivation
            out["bounds"] = {key: _bucket_json(b) for key, b in self.bounds.items()}
        return out


@dataclass(slots=True)
class LoadedHistograms:
    """Snapshots of the histogram series of one or more targets, loaded once."""

    series: list[SeriesRef]
    snapshots: dict[int, list[HistogramSnapshot]]
    _times: dict[int, list[float]] = field(default_factory=dict, repr=False)

    def window(self, series: SeriesRef, start: float, end: float) -> WindowHistogram | None:
        checkpoint()  # a request's budget and client, between series and windows (app.budget)
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


def derived_ttft(queue: WindowHistogram, prefill: WindowHistogram) -> SignalSummary:
    """TGI's TTFT from its queue and prefill histograms: the mean exactly, each quantile as a bound.

    Per request TTFT = Q + P (queue wait, then prefill), both >= 0. Means add:
    ``mean(T) = mean(Q) + mean(P)``, each from its own ``_sum/_count``. Quantiles do not: the
    sum of the two p99 is neither the p99 of the sum nor a bound of it in general. What holds
    for any dependence between Q and P:

    * lower: T >= Q and T >= P for every request, so ``q_T(a) >= max(q_Q(a), q_P(a))``;
    * upper: ``P(Q + P > x + y) <= P(Q > x) + P(P > y)``; with x = ``q_Q(b)``, y = ``q_P(b)``,
      ``b = (1 + a) / 2`` each tail is at most ``(1 - a) / 2``, so ``q_T(a) <= q_Q(b) + q_P(b)``
      (p99 needs the p99.5 of each part).

    The histograms only know which bucket holds each quantile, so the lower bound takes the
    buckets' lower edges and the upper bound their upper edges (:func:`quantiles.histogram_quantile_interval`);
    an upper edge of +Inf leaves the bound open. TGI's prefill histogram counts prefill *batches*,
    so where a batch holds several requests the bound is on the batch time a request waits.
    """
    queue_s, prefill_s = quantiles.summarize(queue), quantiles.summarize(prefill)
    bounds: dict[str, tuple[float, float]] = {}
    for key, q in quantiles.QUANTILES:
        lower_q = quantiles.histogram_quantile_interval(q, queue.bounds, queue.increases)
        lower_p = quantiles.histogram_quantile_interval(q, prefill.bounds, prefill.increases)
        upper_q = quantiles.histogram_quantile_interval((1 + q) / 2, queue.bounds, queue.increases)
        upper_p = quantiles.histogram_quantile_interval((1 + q) / 2, prefill.bounds, prefill.increases)
        if None in (lower_q, lower_p, upper_q, upper_p):
            continue
        assert lower_q and lower_p and upper_q and upper_p
        bounds[key] = (max(lower_q[0], lower_p[0], 0.0), upper_q[1] + upper_p[1])
    mean = None if queue_s.mean is None or prefill_s.mean is None else queue_s.mean + prefill_s.mean
    return SignalSummary(None, None, None, None, mean, queue_s.count, {}, queue_s.count_estimate,
                         TTFT_DERIVATION, bounds)


def summarize_histograms(histograms: dict[str, WindowHistogram | None]) -> dict[str, SignalSummary]:
    """The latency answer's per-signal summaries: every histogram signal with data in the
    window, plus TGI's TTFT derived from queue and prefill when the engine has no TTFT."""
    out: dict[str, SignalSummary] = {}
    for signal in HISTOGRAM_SIGNALS:
        merged = histograms.get(signal)
        if merged is not None:
            out[signal] = SignalSummary.of(quantiles.summarize(merged))
    queue, prefill = histograms.get("queue_time"), histograms.get("prefill_time")
    if "ttft" not in out and queue is not None and prefill is not None:
        out["ttft"] = derived_ttft(queue, prefill)
    return out


def summarize_signals(loaded: LoadedHistograms, start: float, end: float,
                      model: str | None = None) -> dict[str, SignalSummary]:
    return summarize_histograms({signal: loaded.merged(start, end, signal, model) for signal in HISTOGRAM_SIGNALS})


def summaries_dict(summaries: dict[str, SignalSummary]) -> dict[str, dict[str, Any]]:
    """Per-signal summaries in their JSON form."""
    return {signal: summary.to_dict() for signal, summary in summaries.items()}


@dataclass(slots=True)
class StoredWindows:
    """Series of one or more targets read at the coarsest level that answers the windows
    asked (:func:`app.store.levels.plan`), loaded once for one window or a series of them."""

    series: list[SeriesRef]
    timelines: dict[int, levels.Timeline]
    exact: bool = True  # False once a window had to leave out an interval straddling an old edge
    # a series' window is asked again by the per-model pass and the rank means: combined once,
    # its increases extrapolated once, and a signal's sum over the same series (a target's
    # only model is all of it) merged once
    _selections: dict[tuple[int, int, int], levels.Selection] = field(default_factory=dict)
    _histograms: dict[tuple[int, int, int], WindowHistogram | None] = field(default_factory=dict)
    _merged: dict[tuple[int, int, tuple[int, ...]], WindowHistogram | None] = field(default_factory=dict)

    def _select(self, ref: SeriesRef, start_ms: int, end_ms: int) -> levels.Chunk | None:
        checkpoint()  # a request's budget and client, between series and windows (app.budget)
        key = (ref.id, start_ms, end_ms)
        selection = self._selections.get(key)
        if selection is None:
            selection = self._selections[key] = self.timelines[ref.id].select(start_ms, end_ms)
        self.exact = self.exact and selection.exact
        return selection.chunk

    def window(self, ref: SeriesRef, start: float, end: float) -> WindowHistogram | None:
        s_ms, e_ms = to_millis(start), to_millis(end)
        key = (ref.id, s_ms, e_ms)
        if key in self._histograms:
            return self._histograms[key]
        h = self._histograms[key] = levels.histogram(ref.bounds, self._select(ref, s_ms, e_ms), s_ms, e_ms)
        return h

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None:
        refs = [s for s in self.series
                if s.signal == signal and s.kind == "histogram" and (model is None or s.model == model)]
        key = (to_millis(start), to_millis(end), tuple(s.id for s in refs))
        if key in self._merged:
            return self._merged[key]
        parts = [self.window(s, start, end) for s in refs]
        merged = self._merged[key] = quantiles.merge(p for p in parts if p is not None)
        return merged

    def rate(self, ref: SeriesRef, start: float, end: float) -> float | None:
        s_ms, e_ms = to_millis(start), to_millis(end)
        return levels.rate(self._select(ref, s_ms, e_ms), s_ms, e_ms)

    def gauge(self, ref: SeriesRef, start: float, end: float) -> GaugeStats | None:
        chunk = self._select(ref, to_millis(start), to_millis(end))
        if chunk is None:
            return None
        return GaugeStats(chunk.last[0], chunk.total / chunk.n, chunk.peak)


def load_windows(session: Session, target_ids: Sequence[int], signals: Sequence[str], start: float, end: float,
                 model: str | None = None, max_level: int | None = None, *, many: bool = False) -> StoredWindows:
    """The series of ``signals`` (histograms, gauges or counters) over ``[start, end]``, read
    at the coarsest level that answers it (``max_level``: coarsest allowed). ``many``: the
    caller asks for many windows inside it (a series of points), so raw samples stay one
    chunk each; for the one window ``[start, end]`` they are folded as they are read."""
    series = repository.find_series(session, target_ids, signals, model)
    checkpoint()
    raw_since, done = repository.level_progress(session)
    plan = levels.plan(start, end, raw_since, done, max_level)
    return StoredWindows(series, repository.timelines(session, series, plan, fold_raw=not many))


def _model_window(stored: StoredWindows, start: float, end: float, model: str | None) -> ModelWindow:
    """One model's (``None``: every model's) histograms, gauges and rates from stored samples."""
    window = ModelWindow()
    for signal in sorted({s.signal for s in stored.series if s.kind == "histogram"
                          and (model is None or s.model == model)}):
        window.histograms[signal] = stored.merged(start, end, signal, model)
    gauges: dict[str, list[GaugeStats]] = defaultdict(list)
    rates: dict[str, float] = {}
    by_rank: dict[str, dict[str, float]] = defaultdict(dict)
    for s in stored.series:
        if s.kind == "histogram" or (model is not None and s.model != model):
            continue
        if s.kind == "counter":
            value = stored.rate(s, start, end)
            if value is not None:
                rates[s.signal] = rates.get(s.signal, 0.0) + value
        else:
            stats = stored.gauge(s, start, end)
            if stats is not None:
                gauges[s.signal].append(stats)
                if s.signal in RANK_GAUGES:
                    by_rank[s.rank][s.signal] = by_rank[s.rank].get(s.signal, 0.0) + stats.mean
    window.gauges = {signal: combine_gauges(signal, per_series) for signal, per_series in gauges.items()}
    window.rates = rates
    _rank_means(stored, start, end, model, by_rank)
    if len(by_rank) > 1:
        window.ranks = dict(sorted(by_rank.items()))
    return window


def _rank_means(stored: StoredWindows, start: float, end: float, model: str | None,
                by_rank: dict[str, dict[str, float]]) -> None:
    """Each rank's mean of the :data:`app.window.RANK_MEANS` histograms (its series summed: the
    increase of ``_sum`` over the increase of ``_count``), for the ranks that have gauges."""
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for s in stored.series:
        if s.kind != "histogram" or s.signal not in RANK_MEANS or (model is not None and s.model != model):
            continue
        h = stored.window(s, start, end)
        if h is not None and h.count > 0 and not math.isnan(h.sum):
            total = totals[(s.rank, s.signal)]
            total[0] += h.sum
            total[1] += h.count
    for (rank, signal), (total_sum, count) in totals.items():
        if rank in by_rank and count > 0:
            by_rank[rank][signal] = total_sum / count


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


def _itl_and_running(session: Session, target_ids: Sequence[int], start: float, end: float
                     ) -> tuple[LoadedHistograms, list[SeriesRef], dict[int, list[tuple[float, float]]]]:
    """The ITL histograms and the running-batch gauges of the targets over the window, from
    raw samples (a diagnosis window is recent) in one read: (ITL, running series, their
    points) for :func:`_itl_intervals`."""
    series = repository.find_series(session, target_ids, ("itl", "running"))
    itl = [s for s in series if s.signal == "itl"]
    running = [s for s in series if s.signal == "running"]
    snapshots, points = repository.snapshots_and_points(session, [s.id for s in itl], [s.id for s in running],
                                                        start, end)
    return LoadedHistograms(itl, snapshots), running, points


def store_window(session: Session, target_ids: Sequence[int], start: float, end: float,
                 signals: Sequence[str] = HISTOGRAM_SIGNALS, *, per_model: bool = True,
                 diagnosis: bool = False) -> TargetWindow:
    """A :class:`TargetWindow` from the built-in store: one or more targets summed by ``le``.

    Read at the coarsest downsampled level that answers the window exactly
    (:mod:`app.store.levels`), so a 7-day window costs a few hundred rows per series.
    ``diagnosis`` adds what only the regime rules read, for a single target: the number
    of successful scrapes, the engine's info metrics and the per-interval ITL by batch
    (the last from raw samples: a diagnosis window is recent).
    """
    stored = load_windows(session, target_ids, (*signals, *GAUGE_SIGNALS, *COUNTER_SIGNALS), start, end)
    window = TargetWindow(start, end, overall=_model_window(stored, start, end, None))
    if per_model:
        for model in sorted({s.model for s in stored.series}):
            window.models[model] = _model_window(stored, start, end, model)
    if diagnosis:
        if per_model and "itl" in signals:
            loaded, running, points = _itl_and_running(session, target_ids, start, end)
            for model, model_window in window.models.items():
                model_window.itl_intervals = _itl_intervals(loaded, running, points, model, start, end)
        (target_id,) = target_ids
        window.scrapes = len(repository.scrape_times(session, target_id, start, end))
        window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels))
                        for i in repository.target_infos(session, target_id)]
    return window


WINDOWS_CHUNK = 250  # targets per set of queries in store_windows


def store_histograms(session: Session, target_ids: Sequence[int], start: float, end: float,
                     signals: Sequence[str]) -> dict[int, dict[str, WindowHistogram | None]]:
    """Each target's histograms of ``signals`` over ``[start, end]`` (all its models and ranks
    summed by ``le``) and nothing else: what an SLO condition reads. Same levels and chunks
    as :func:`store_windows`, without the gauges, rates and per-model windows an SLO does not read."""
    out: dict[int, dict[str, WindowHistogram | None]] = {}
    for i in range(0, len(target_ids), WINDOWS_CHUNK):
        chunk = target_ids[i:i + WINDOWS_CHUNK]
        stored = load_windows(session, chunk, signals, start, end)
        series_of: dict[int, list[SeriesRef]] = defaultdict(list)
        for ref in stored.series:
            series_of[ref.target_id].append(ref)
        for target_id in chunk:
            own = StoredWindows(series_of.get(target_id, []), stored.timelines)
            out[target_id] = {signal: own.merged(start, end, signal) for signal in signals}
    return out


def store_windows(session: Session, target_ids: Sequence[int], start: float, end: float,
                  signals: Sequence[str] = HISTOGRAM_SIGNALS, *, diagnosis: bool = False) -> dict[int, TargetWindow]:
    """:func:`store_window` of each of many targets (not summed), read in a fixed number of
    set-based queries whatever the number of targets: a round's series, samples, scrape
    counts and infos are loaded once for all of them, then split by target. Targets with no
    series get an empty window. Read in chunks of :data:`WINDOWS_CHUNK` targets, so the
    samples held at once (and every ``IN`` list) stay bounded whatever the fleet's size."""
    if len(target_ids) > WINDOWS_CHUNK:
        out: dict[int, TargetWindow] = {}
        for i in range(0, len(target_ids), WINDOWS_CHUNK):
            out.update(store_windows(session, target_ids[i:i + WINDOWS_CHUNK], start, end, signals,
                                     diagnosis=diagnosis))
        return out
    if not target_ids:
        return {}
    stored = load_windows(session, target_ids, (*signals, *GAUGE_SIGNALS, *COUNTER_SIGNALS), start, end)
    series_of: dict[int, list[SeriesRef]] = defaultdict(list)
    for ref in stored.series:
        series_of[ref.target_id].append(ref)
    itl_of: dict[int, list[SeriesRef]] = defaultdict(list)
    running_of: dict[int, list[SeriesRef]] = defaultdict(list)
    itl = LoadedHistograms([], {})
    points: dict[int, list[tuple[float, float]]] = {}
    scrapes: dict[int, int] = {}
    infos: dict = {}
    if diagnosis:
        # the per-interval ITL by batch reads raw samples (a diagnosis window is recent)
        if "itl" in signals:
            itl, running, points = _itl_and_running(session, target_ids, start, end)
            for ref in itl.series:
                itl_of[ref.target_id].append(ref)
            for ref in running:
                running_of[ref.target_id].append(ref)
        scrapes = repository.successful_scrape_counts(session, target_ids, start, end)
        infos = repository.infos_by_target(session, target_ids)
    out = {}
    for target_id in target_ids:
        own = StoredWindows(series_of.get(target_id, []), stored.timelines)
        window = TargetWindow(start, end, overall=_model_window(own, start, end, None))
        for model in sorted({s.model for s in own.series}):
            window.models[model] = _model_window(own, start, end, model)
            if diagnosis and "itl" in signals:
                window.models[model].itl_intervals = _itl_intervals(
                    LoadedHistograms(itl_of.get(target_id, []), itl.snapshots), running_of.get(target_id, []),
                    points, model, start, end)
        if diagnosis:
            window.scrapes = scrapes.get(target_id, 0)
            window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels)) for i in infos.get(target_id, [])]
        out[target_id] = window
    return out


def _scalars(window: ModelWindow) -> dict:
    """Counters as per-second rates (Prometheus rate()); gauges as last/mean/max over the window."""
    rate_out = {f"{signal.removesuffix('_total')}_per_second": value for signal, value in window.rates.items()}
    queries, hits = window.rates.get("prefix_cache_queries_total"), window.rates.get("prefix_cache_hits_total")
    if queries:
        rate_out["prefix_cache_hit_rate"] = (hits or 0.0) / queries
    gauges = {signal: {"last": g.last, "mean": g.mean, "max": g.max} for signal, g in window.gauges.items()}
    return {"rates": rate_out, "gauges": gauges}


def model_report(window: ModelWindow, seconds: float) -> dict:
    """One model's (or all models') numbers over a window of ``seconds`` in the latency answer's
    shape: ``window_seconds``, each signal's summary, ``rates`` and ``gauges``."""
    return {"window_seconds": seconds, **summaries_dict(summarize_histograms(window.histograms)), **_scalars(window)}


def report_from_window(window: TargetWindow, per_model: bool = True) -> dict:
    """The body of ``GET /api/v1/targets/{name}/latency`` (and the fleet variant)."""
    report: dict = {"start": window.start, "end": window.end, **model_report(window.overall, window.seconds)}
    if per_model:
        report["models"] = {model: {**summaries_dict(summarize_histograms(m.histograms)), **_scalars(m)}
                            for model, m in window.models.items() if m.histograms}
    if window.dropped:
        report["dropped_series"] = [{"signal": signal, "reason": reason, "series": n}
                                    for (signal, reason), n in window.dropped.items()]
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
    # every window's edges are multiples of step and lookback: a level dividing both answers whole intervals
    coarsest = max((lv for lv in levels.LEVELS if to_millis(step) % (lv * 1000) == 0
                    and to_millis(lookback) % (lv * 1000) == 0), default=0)
    loaded = load_windows(session, target_ids, (signal,), first - lookback, end, model, max_level=coarsest,
                          many=True)
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
PD_ROLES = ("prefill", "decode", "both")
KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}  # vLLM's KVTransferConfig.kv_role
LABELLED_ROLE_INFO = "pd_role_label"    # a Prometheus source's ``pd_role_label`` on the target, kept as an info


@dataclass(frozen=True, slots=True)
class PdRole:
    """A worker's part in prefill/decode disaggregation and what said so."""

    role: str    # one of PD_ROLES
    source: str  # e.g. "engine configuration: SGLang engine_type=decode"

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "source": self.source}


def pd_role(infos: Iterable[Any], present: Collection[str], engine: str, model: str | None = None
            ) -> PdRole | None:
    """The worker's P/D role, from the most direct statement there is.

    1. The engine's configuration: a ``kv_role`` label on an info metric (vLLM's
       ``--kv-transfer-config``: kv_producer / kv_consumer / kv_both; no vLLM release through
       0.34 exports it, it is read where an info metric carries it) or SGLang's ``engine_type``
       label (``prefill`` / ``decode``; ``unified`` is a worker that is not disaggregated).
    2. The target's own label (a Prometheus source's ``pd_role_label``, e.g. llm-d's
       ``llm-d.ai/role``), for engines whose configuration says nothing (vLLM).
    3. The metrics: a vLLM or TRT-LLM worker that records KV transfers (``present`` holds
       ``kv_transfer_time`` or ``kv_transfers_total``) reads them in, so it decodes.

    ``infos`` are :class:`app.sources.base.CanonicalInfo` or stored ``TargetInfo`` rows (name,
    model, labels); ``model`` keeps those of one model (and the model-less ones)."""
    relevant = [i for i in infos if model is None or i.model in (model, "")]
    for info in relevant:
        kv_role = info.labels.get("kv_role")
        if kv_role in KV_ROLES:
            return PdRole(KV_ROLES[kv_role], f"engine configuration: kv_role={kv_role} ({info.name})")
    for info in relevant:
        mode = info.labels.get("disaggregation_mode")
        if mode:
            if mode in ("prefill", "decode"):
                return PdRole(mode, f"engine configuration: SGLang engine_type={mode}")
            return None  # unified (or null): the engine says it is not disaggregated
    for info in relevant:
        if info.name == LABELLED_ROLE_INFO and info.labels.get("pd_role") in PD_ROLES:
            label, value = info.labels.get("label", ""), info.labels["pd_role"]
            return PdRole(value, f"target label {label}={value} (the engine's metrics do not say)")
    if engine != "sglang" and ("kv_transfer_time" in present or "kv_transfers_total" in present):
        return PdRole("decode", "metrics: it records KV-cache transfers, which are timed where they are read "
                                "(the decode side); its configuration does not say")
    return None


PD_NOTE = ("means over the window, each from the requests its stage finished in it (the prefill and decode "
           "workers see the same requests at different times); means add, quantiles do not")
#: The terms of a disaggregated request's TTFT, in the order a request passes them (``decode_prealloc``: SGLang's
#: handshake and KV-memory reservation on the decode worker, before the prefill starts; null elsewhere).
PD_TERMS = ("decode_prealloc", "prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_step")
LITTLE = "mean {gauge} / first tokens per second (Little's law; no histogram times it)"


def _report_mean(report: dict, signal: str) -> float | None:
    return (report.get(signal) or {}).get("mean")


def _little(report: dict, gauge: str) -> float | None:
    """Mean time in a queue by Little's law: requests in it on average / requests leaving it per
    second (those that got their first token in the window)."""
    waiting = ((report.get("gauges") or {}).get(gauge) or {}).get("mean")
    firsts, seconds = (report.get("ttft") or {}).get("count"), report.get("window_seconds")
    if waiting is None or not firsts or not seconds:
        return None
    return waiting / (firsts / seconds)


def _timed(report: dict, worker: str, signal: str, what: str, gauge: str | None) -> tuple[float | None, str]:
    """A worker's mean time in a stage: its histogram's mean, else Little's law on the gauge of
    the queue it waits in; and what said so."""
    mean = _report_mean(report, signal)
    if mean is not None:
        return mean, f"{worker} worker: {what}"
    estimate = _little(report, gauge) if gauge else None
    if estimate is not None:
        return estimate, f"{worker} worker: " + LITTLE.format(gauge=gauge)
    return None, f"{worker} worker: not exported"


def pd_terms(decode: dict, prefill: dict | None) -> dict:
    """The terms of a disaggregated request's TTFT (:data:`PD_TERMS`) from the latency answers
    (:func:`report_from_window` shape) of its decode worker and, when paired, its prefill side;
    ``sources`` names what each came from, ``kv_wait`` is the decode worker's own wait for the KV.

    The transfer: the decode worker's transfer histogram (vLLM NIXL, TensorRT-LLM: timed where the
    KV is read), else the prefill side's (SGLang observes ``kv_transfer_latency_ms`` where it is
    sent), else the decode worker's KV wait less the prefill side's queue and prefill (SGLang's
    decode worker reserves the memory first; the prefill worker queues and prefills only then, so
    the wait spans both and the transfer). Unpaired, that wait bounds the transfer from above only."""
    out: dict = {}
    sources: dict[str, str] = {}
    out["decode_prealloc"], sources["decode_prealloc"] = _timed(
        decode, "decode", "prealloc_time", "handshake and KV-memory reservation (SGLang stage decode_bootstrap)",
        "prealloc_queue")
    if prefill is not None:
        out["prefill_queue"], sources["prefill_queue"] = _timed(prefill, "prefill", "queue_time",
                                                                "queue-time histogram", "waiting")
        out["prefill"], sources["prefill"] = _timed(prefill, "prefill", "prefill_time", "prefill-time histogram",
                                                    None)
    else:
        out["prefill_queue"] = out["prefill"] = None
        sources["prefill_queue"] = sources["prefill"] = "no prefill worker paired with this decode worker"
    kv_wait, sources["kv_wait"] = _timed(decode, "decode", "kv_wait_time",
                                         "waiting for the KV (SGLang stage decode_transferred)", "transfer_queue")
    transfer = _report_mean(decode, "kv_transfer_time")
    if transfer is not None:
        sources["kv_transfer"] = "decode worker: its transfer-time histogram"
    elif prefill is not None and _report_mean(prefill, "kv_transfer_time") is not None:
        transfer = _report_mean(prefill, "kv_transfer_time")
        sources["kv_transfer"] = ("prefill worker: its transfer-time histogram (SGLang times a transfer where it "
                                  "is sent)")
    elif kv_wait is not None and out["prefill_queue"] is not None and out["prefill"] is not None:
        transfer = max(0.0, kv_wait - out["prefill_queue"] - out["prefill"])
        sources["kv_transfer"] = "decode worker's KV wait less the prefill worker's queue and prefill"
    else:
        sources["kv_transfer"] = ("not separable: the decode worker's KV wait also holds the prefill side's queue "
                                  "and prefill; pair it with its prefill worker") if kv_wait is not None else \
            "no transfer time on either worker"
    out["kv_transfer"] = transfer
    out["decode_queue"], sources["decode_queue"] = _timed(decode, "decode", "queue_time", "queue-time histogram",
                                                          "waiting")
    out["first_step"], sources["first_step"] = _timed(decode, "decode", "prefill_time",
                                                      "first scheduled -> first token", None)
    needed = [out[term] for term in PD_TERMS if term != "decode_prealloc"]
    total = None if any(v is None for v in needed) else sum(v for v in needed if v is not None) \
        + (out["decode_prealloc"] or 0.0)
    return {**{term: out[term] for term in PD_TERMS}, "kv_wait": kv_wait, "ttft_mean": total, "sources": sources}


def pd_split(decode: dict, prefill: dict, prefill_targets: Sequence[str]) -> dict:
    """A disaggregated request's TTFT assembled from the latency answers of its decode and prefill
    workers (:func:`pd_terms`): decode-side prealloc (SGLang) + prefill queue + prefill (prefill
    worker) + KV transfer + decode queue + first step (decode worker). Means, which add; a stage
    without data is null and so is the total (the prealloc counts where the engine has one).
    ``prefill`` may be several prefill replicas summed (a source's deployment)."""
    return {"prefill_target": ", ".join(prefill_targets), "prefill_targets": list(prefill_targets),
            **pd_terms(decode, prefill), "note": PD_NOTE}
