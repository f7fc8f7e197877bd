"""Windows, histograms and quantile series read from the built-in store's samples.

Every number is computed the way Prometheus computes it from the same samples (see
:mod:`app.core.quantiles`): per-bucket ``increase()`` over the window, ``sum by (le)`` across
data-parallel ranks, models or targets, then ``histogram_quantile``; read at the coarsest
downsampled level that answers a window exactly (:mod:`app.store.levels`). Features read these
through :class:`app.windows.store.StoreWindows`.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session

from app.core import quantiles
from app.core.quantiles import HistogramSnapshot, WindowHistogram, to_millis
from app.latency import WindowSummary, report_from_window, series_point, summarize_histograms
from app.runtime.budget import checkpoint
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS, CanonicalInfo
from app.store import levels, repository
from app.store.repository import SeriesRef
from app.window import RANK_GAUGES, RANK_MEANS, GaugeStats, ItlInterval, ModelWindow, TargetWindow, combine_gauges


@dataclass(slots=True)
class LoadedHistograms:
    """Snapshots of the histogram series of one or more targets, loaded once."""

    series: list[SeriesRef]
    snapshots: dict[int, list[HistogramSnapshot]]
    _times: dict[int, list[float]] = field(default_factory=dict, repr=False)

    def window(self, series: SeriesRef, start: float, end: float) -> WindowHistogram | None:
        checkpoint()  # a request's budget and client, between series and windows (app.runtime.budget)
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

    def windows(self, signal: str, ends: Sequence[float], lookback: float) -> list[WindowHistogram | None]:
        """:meth:`merged` over the ``lookback`` before each of ``ends`` (a chart's points)."""
        return [self.merged(t - lookback, t, signal) for t in ends]

    @property
    def signals(self) -> set[str]:
        return {s.signal for s in self.series}

    def first_sample(self, signals: Sequence[str]) -> float | None:
        firsts = [self.snapshots[s.id][0].ts for s in self.series if s.signal in signals and self.snapshots.get(s.id)]
        return min(firsts) if firsts else None


def load_histograms(session: Session, target_ids: Sequence[int], signals: Sequence[str], start: float,
                    end: float, model: str | None = None) -> LoadedHistograms:
    series = repository.find_series(session, target_ids, signals, model)
    snapshots = repository.histogram_snapshots(session, [s.id for s in series], start, end)
    return LoadedHistograms(series, snapshots)


def summarize_signals(loaded: LoadedHistograms, start: float, end: float,
                      model: str | None = None) -> dict[str, WindowSummary]:
    return summarize_histograms({signal: loaded.merged(start, end, signal, model) for signal in HISTOGRAM_SIGNALS})


class SeriesWindows(Protocol):
    """Series of one or more targets and each one's numbers over a window: what
    :func:`model_window` combines (the store's :class:`StoredWindows`, the in-memory backend's)."""

    series: list[SeriesRef]

    def window(self, ref: SeriesRef, start: float, end: float) -> WindowHistogram | None: ...

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None: ...

    def rate(self, ref: SeriesRef, start: float, end: float) -> float | None: ...

    def gauge(self, ref: SeriesRef, start: float, end: float) -> GaugeStats | None: ...

    def resets(self, ref: SeriesRef, start: float, end: float) -> int: ...


def restarts(stored: SeriesWindows, start: float, end: float) -> int:
    """Engine restarts in the window: the most counter resets any one counter series shows (a
    restart sets every counter of the process back to zero at once; data-parallel ranks and models
    of one engine reset together, so their counts are not added)."""
    return max((stored.resets(s, start, end) for s in stored.series if s.kind == "counter"), default=0)


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
        checkpoint()  # a request's budget and client, between series and windows (app.runtime.budget)
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

    def resets(self, ref: SeriesRef, start: float, end: float) -> int:
        chunk = self._select(ref, to_millis(start), to_millis(end))
        return 0 if chunk is None else len(chunk.resets)


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


def model_window(stored: SeriesWindows, start: float, end: float, model: str | None) -> ModelWindow:
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


def _rank_means(stored: SeriesWindows, start: float, end: float, model: str | None,
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


def itl_intervals(loaded: LoadedHistograms, scalar_series: Sequence[SeriesRef],
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
    points) for :func:`itl_intervals`."""
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
    window = TargetWindow(start, end, overall=model_window(stored, start, end, None))
    if per_model:
        for model in sorted({s.model for s in stored.series}):
            window.models[model] = model_window(stored, start, end, model)
    if diagnosis:
        if per_model and "itl" in signals:
            loaded, running, points = _itl_and_running(session, target_ids, start, end)
            for model, one_model in window.models.items():
                one_model.itl_intervals = itl_intervals(loaded, running, points, model, start, end)
        (target_id,) = target_ids
        window.restarts = restarts(stored, start, end)
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
        window = TargetWindow(start, end, overall=model_window(own, start, end, None))
        for model in sorted({s.model for s in own.series}):
            window.models[model] = model_window(own, start, end, model)
            if diagnosis and "itl" in signals:
                window.models[model].itl_intervals = itl_intervals(
                    LoadedHistograms(itl_of.get(target_id, []), itl.snapshots), running_of.get(target_id, []),
                    points, model, start, end)
        if diagnosis:
            window.restarts = restarts(own, start, end)
            window.scrapes = scrapes.get(target_id, 0)
            window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels)) for i in infos.get(target_id, [])]
        out[target_id] = window
    return out


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
    return series_points(loaded, signal, q, span, step, lookback, end, model)


def series_points(windows: SeriesWindows, signal: str, q: float | None, span: float, step: float, lookback: float,
                  end: float, model: str | None = None) -> list[dict]:
    """The points of :func:`quantile_series` from series already read: one every ``step`` (aligned
    to its multiples) over the ``span`` before ``end``, each over the ``lookback`` before it."""
    points = []
    t = math.ceil((end - span) / step) * step
    while t <= end + 1e-9:
        points.append(series_point(t, windows.merged(t - lookback, t, signal, model), q))
        t += step
    return points
