"""Windows from scrapes held in memory: a backend with no database and no server.

It answers :class:`~app.windows.base.WindowReader` from the raw samples of the scrapes it was
given (:meth:`MemoryWindows.add`), with the same per-series maths as the built-in store's raw
level (:mod:`app.core.quantiles`: ``increase``/``rate`` over the closed window, gauges'
last/mean/max of the samples in it) and the same combination across models and ranks
(:func:`app.store.reads.model_window`). Unit tests of the features use it; it passes the same
contract as the store and a Prometheus source (``tests/windows/test_contract.py``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from app.core import quantiles
from app.core.quantiles import HistogramSnapshot, Point, WindowHistogram
from app.latency import PD_PREFILL_LABEL, WindowSummary
from app.slo.config import SloObjective
from app.slo.status import SloErrors, SloSums
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS, CanonicalInfo
from app.store.models import TargetView
from app.store.reads import LoadedHistograms, itl_intervals, model_window, restarts, series_points, summarize_signals
from app.store.record import ScrapeRecord
from app.store.repository import SeriesRef
from app.window import GaugeStats, TargetWindow
from app.windows.base import (
    FLEET_SIGNALS,
    TTFT_PARTS,
    BucketNeeds,
    HistogramHistory,
    HistogramsRead,
    SourceStatus,
    WindowsRead,
)


@dataclass(slots=True)
class _Target:
    name: str
    labels: dict[str, str]
    series: dict[tuple[str, str, str, str], SeriesRef] = field(default_factory=dict)  # (kind, signal, model, rank)
    snapshots: dict[int, list[HistogramSnapshot]] = field(default_factory=dict)  # histogram series id -> scrapes
    points: dict[int, list[Point]] = field(default_factory=dict)  # gauge or counter series id -> samples
    scrapes: list[float] = field(default_factory=list)  # times of the successful scrapes
    infos: dict[tuple[str, str, str], CanonicalInfo] = field(default_factory=dict)  # the latest of each


@dataclass(slots=True)
class _Samples:
    """One target's series over a span, answering what :func:`app.store.reads.model_window` asks."""

    series: list[SeriesRef]
    target: _Target

    def window(self, ref: SeriesRef, start: float, end: float) -> WindowHistogram | None:
        return quantiles.window_histogram(ref.bounds, self.target.snapshots.get(ref.id, []), start, end)

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None:
        parts = [self.window(s, start, end) for s in self.series
                 if s.kind == "histogram" and s.signal == signal and (model is None or s.model == model)]
        return quantiles.merge(p for p in parts if p is not None)

    def rate(self, ref: SeriesRef, start: float, end: float) -> float | None:
        return quantiles.rate(self.target.points.get(ref.id, []), start, end)

    def gauge(self, ref: SeriesRef, start: float, end: float) -> GaugeStats | None:
        values = [v for _, v in quantiles.select_range(self.target.points.get(ref.id, []), start, end)]
        if not values:
            return None
        return GaugeStats(values[-1], math.fsum(values) / len(values), max(values))

    def resets(self, ref: SeriesRef, start: float, end: float) -> int:
        values = [v for _, v in quantiles.select_range(self.target.points.get(ref.id, []), start, end)]
        return sum(1 for a, b in zip(values, values[1:]) if b < a)


class MemoryWindows:
    """:class:`~app.windows.base.WindowReader` over scrapes given to it, by target id."""

    def __init__(self) -> None:
        self._targets: dict[int, _Target] = {}
        self._next_series = 1

    def add(self, target_id: int, name: str, records: Iterable[ScrapeRecord], labels: dict[str, str] | None = None
            ) -> None:
        """Hold ``records`` (in time order) as target ``target_id``'s scrapes; failed ones count nowhere."""
        target = self._targets.setdefault(target_id, _Target(name, dict(labels or {})))
        for record in records:
            if not record.up or record.canonical is None:
                continue
            target.scrapes.append(record.ts)
            canonical = record.canonical
            for h in canonical.histograms:
                ref = self._series(target, target_id, "histogram", h.signal, h.model, h.rank, h.bounds)
                target.snapshots.setdefault(ref.id, []).append(HistogramSnapshot(record.ts, h.counts, h.sum, h.count))
            for s in canonical.scalars:
                ref = self._series(target, target_id, s.kind, s.signal, s.model, s.rank, ())
                target.points.setdefault(ref.id, []).append((record.ts, s.value))
            for info in canonical.infos:
                target.infos[(info.name, info.model, info.rank)] = info

    def _series(self, target: _Target, target_id: int, kind: str, signal: str, model: str, rank: str,
                bounds: tuple[float, ...]) -> SeriesRef:
        key = (kind, signal, model, rank)
        ref = target.series.get(key)
        if ref is None:
            ref = target.series[key] = SeriesRef(self._next_series, target_id, signal, kind, model, rank, tuple(bounds))
            self._next_series += 1
        return ref

    def _samples(self, target_id: int, signals: Iterable[str]) -> _Samples:
        target = self._targets.get(target_id) or _Target("", {})
        wanted = set(signals)
        return _Samples([ref for ref in target.series.values() if ref.signal in wanted], target)

    def _loaded(self, target_id: int, signals: Iterable[str], start: float = -math.inf,
                end: float = math.inf) -> LoadedHistograms:
        """The raw snapshots of ``signals`` in ``[start, end]``, as the store loads them."""
        samples = self._samples(target_id, signals)
        histograms = [ref for ref in samples.series if ref.kind == "histogram"]
        snapshots = samples.target.snapshots
        return LoadedHistograms(histograms, {ref.id: [s for s in snapshots[ref.id] if start <= s.ts <= end]
                                             for ref in histograms})

    def _window(self, target_id: int, start: float, end: float, signals: Sequence[str], diagnosis: bool,
                per_model: bool = True) -> TargetWindow:
        samples = self._samples(target_id, (*signals, *GAUGE_SIGNALS, *COUNTER_SIGNALS))
        window = TargetWindow(start, end, overall=model_window(samples, start, end, None))
        if per_model:
            for model in sorted({s.model for s in samples.series}):
                window.models[model] = model_window(samples, start, end, model)
        target = samples.target
        if diagnosis:
            if per_model and "itl" in signals:
                running = [ref for ref in target.series.values() if ref.signal == "running" and ref.kind == "gauge"]
                points = {ref.id: quantiles.select_range(target.points.get(ref.id, []), start, end) for ref in running}
                loaded = self._loaded(target_id, ("itl",))
                for model, one_model in window.models.items():
                    one_model.itl_intervals = itl_intervals(loaded, running, points, model, start, end)
            window.scrapes = sum(1 for ts in target.scrapes if start <= ts <= end)
            window.restarts = restarts(samples, start, end)
        window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels)) for i in target.infos.values()]
        return window

    # ------------------------------------------------------------------ WindowReader
    def window(self, session: Session, target: TargetView, start: float, end: float,
               signals: Sequence[str], diagnosis: bool = False, buckets: Collection[str] | None = None
               ) -> TargetWindow:
        return self._window(target.id, start, end, signals, diagnosis)

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None) -> WindowsRead:
        return WindowsRead({t.id: self._window(t.id, start, end, signals, diagnosis) for t in targets})

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        out: dict[int, dict[str, WindowHistogram | None]] = {}
        for t in targets:
            samples = self._samples(t.id, signals)
            found = {signal: samples.merged(start, end, signal) for signal in signals}
            out[t.id] = {signal: h for signal, h in found.items() if h is not None}
        return HistogramsRead(out)

    def discover(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
                 needs: BucketNeeds | None = None) -> None:
        """Nothing: its targets are those given to :meth:`add`."""

    def shared_end(self, target: TargetView, now: float) -> float:
        """``now``: every read ends where it is asked."""
        return now

    def fleet_summaries(self, session: Session, targets: Sequence[TargetView], start: float, end: float
                        ) -> dict[int, dict[str, WindowSummary]]:
        out = {}
        for t in targets:
            loaded = self._loaded(t.id, (*FLEET_SIGNALS, *TTFT_PARTS), start, end)
            has_ttft = "ttft" in loaded.signals
            loaded.series = [s for s in loaded.series if s.signal in FLEET_SIGNALS or not has_ttft]
            summaries = summarize_signals(loaded, start, end)
            out[t.id] = {s: summary for s, summary in summaries.items() if s in FLEET_SIGNALS}
        return out

    def quantile_series(self, session: Session, target: TargetView, signal: str, q: float | None, span: float,
                        step: float, lookback: float, end: float, model: str | None) -> list[dict]:
        return series_points(self._samples(target.id, (signal,)), signal, q, span, step, lookback, end, model)

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float,
                   decode: bool) -> tuple[list[str], TargetWindow] | None:
        """The target its ``llm_latency_prefill_target`` label names, as the store pairs them."""
        name = (target.labels or {}).get(PD_PREFILL_LABEL)
        found = [(tid, t) for tid, t in self._targets.items() if name is not None and t.name == name]
        if not found:
            return None
        (prefill_id, prefill), *_ = found
        return [prefill.name], self._window(prefill_id, start, end, HISTOGRAM_SIGNALS, False, per_model=False)

    def history(self, session: Session, target: TargetView, signals: Sequence[str], start: float, end: float
                ) -> HistogramHistory:
        return self._loaded(target.id, signals, start, end)

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        """None: the SLO feature records its targets' increments from their windows."""
        return {}, {}

    def statuses(self) -> list[SourceStatus]:
        return []

