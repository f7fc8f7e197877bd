"""Prometheus sources as a window backend: the replicas each source discovered.

The PromQL, its batching and the memo of long-period answers stay in :mod:`app.promsource`;
this module only puts them behind :class:`~app.windows.base.WindowReader` and turns the
source's errors into :class:`~app.windows.base.WindowError`.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager

from sqlalchemy.orm import Session, sessionmaker

from app import latency
from app.core.quantiles import WindowHistogram
from app.latency import WindowSummary
from app.promql.client import PromAPIError
from app.promsource.service import SourceMissing, SourceService
from app.promsource.slo import source_sums
from app.slo.config import SloObjective
from app.slo.status import SloErrors, SloSums
from app.store.models import TargetView
from app.window import TargetWindow
from app.windows.base import (
    FLEET_SIGNALS,
    TTFT_PARTS,
    BucketNeeds,
    HistogramHistory,
    HistogramsRead,
    SourceStatus,
    WindowError,
    WindowsRead,
)


@contextmanager
def _answering(target: TargetView) -> Iterator[None]:
    """The source's classified error (never the server's text) as a :class:`WindowError`."""
    try:
        yield
    except PromAPIError as exc:
        raise WindowError("unavailable",
                          f"source {target.origin!r} could not answer: {exc.kind}: {exc.message}") from None
    except SourceMissing as exc:
        raise WindowError("not_configured", str(exc)) from None


class SourceHistory:
    """:class:`~app.windows.base.HistogramHistory` of a discovered target, computed by its source's
    Prometheus: which signals it exports over ``[start, end]`` and since when (one query when
    made), then a chart line's windows in one range query (``increase`` over the lookback at
    each point, as every read of a source). Raises :class:`WindowError` like the reads."""

    def __init__(self, sources: SourceService, target: TargetView, signals: Sequence[str], start: float,
                 end: float) -> None:
        self._sources, self._target = sources, target
        with _answering(target):
            self._first = sources.first_samples(target, signals, end - start, end)

    @property
    def signals(self) -> set[str]:
        return set(self._first)

    def first_sample(self, signals: Sequence[str]) -> float | None:
        found = [self._first[s] for s in signals if s in self._first]
        return min(found) if found else None

    def windows(self, signal: str, ends: Sequence[float], lookback: float) -> list[WindowHistogram | None]:
        return self._read(signal, ends, lookback, None)

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None:
        return self._read(signal, [end], end - start, model)[0]

    def _read(self, signal: str, ends: Sequence[float], lookback: float, model: str | None
              ) -> list[WindowHistogram | None]:
        if not ends or signal not in self._first:
            return [None] * len(ends)
        # the server evaluates at whole milliseconds: the first time and the step rounded to them
        step = round((ends[-1] - ends[0]) / (len(ends) - 1), 3) if len(ends) > 1 else 1.0
        first = round(ends[0], 3)
        with _answering(self._target):
            points = self._sources.histogram_series(self._target, signal, first, first + step * (len(ends) - 1),
                                                    step, lookback, model)
        return [merged for _, merged in points][:len(ends)] + [None] * max(0, len(ends) - len(points))


class PrometheusWindows:
    """:class:`~app.windows.base.WindowReader` over the configured Prometheus sources."""

    def __init__(self, sources: SourceService) -> None:
        self.sources = sources
        # the last discovery's diagnosis windows: (start, end, signals) and target id -> window
        self._round: tuple[tuple[float, float, tuple[str, ...]], dict[int, TargetWindow]] | None = None
        # the last fleet summaries asked: (start, end, target ids) -> their summaries
        self._fleet: tuple[tuple[float, float, tuple[int, ...]], dict[int, dict[str, WindowSummary]]] | None = None
        self._lock = threading.Lock()

    def discover(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
                 needs: BucketNeeds | None = None) -> None:
        """Each source's round: its targets now and all their diagnosis windows, one set of queries
        per source (:meth:`app.promsource.service.SourceService.round`). A target that is down, or
        whose source failed, has no window: it keeps its last verdict."""
        found = {target.id: target.window for source_round in self.sources.round(sessions, now, window, signals, needs)
                 for target in source_round.targets if target.window is not None}
        with self._lock:
            self._round = ((now - window, now, tuple(signals)), found)

    def window(self, session: Session, target: TargetView, start: float, end: float,
               signals: Sequence[str], diagnosis: bool = False, buckets: Collection[str] | None = None
               ) -> TargetWindow:
        with _answering(target):
            return self.sources.window(target, start, end, signals, diagnosis, buckets)

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None) -> WindowsRead:
        """The last discovery's windows when asked for exactly its diagnosis range (each handed
        out once, so they are not held past the round); else one set of queries per source."""
        with self._lock:
            kept = self._round
            if kept is not None and diagnosis and kept[0] == (start, end, tuple(signals)):
                found = {t.id: kept[1].pop(t.id) for t in targets if t.id in kept[1]}
                return WindowsRead(found, {t.id for t in targets} - found.keys())
        return WindowsRead(*self.sources.windows_and_failures(targets, start, end, signals, diagnosis,
                                                              histograms_only, buckets, scalars))

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        """One query per signal and source, for all its replicas (an aggregate's members are read)."""
        return HistogramsRead(*self.sources.histograms_of(targets, start, end, signals, above))

    def shared_end(self, target: TargetView, now: float) -> float:
        return self.sources.shared_end(target, now)

    def fleet_summaries(self, session: Session, targets: Sequence[TargetView], start: float, end: float
                        ) -> dict[int, dict[str, WindowSummary]]:
        """One set of queries per source, the histograms alone; none for a source whose last round
        failed (its targets' numbers are not current: the status page's banner says why). The
        answer for the same window and targets is kept: the status page asks for the last
        round's window, so its refreshes and viewers within a round read the buckets once."""
        current = [t for t in targets if not self._failing(t)]
        key = (start, end, tuple(sorted(t.id for t in current)))
        with self._lock:
            if self._fleet is not None and self._fleet[0] == key:
                return self._fleet[1]
        found = self.sources.windows_and_failures(current, start, end, (*FLEET_SIGNALS, *TTFT_PARTS),
                                                  histograms_only=True, view=True)[0] if current else {}
        out = {target_id: {s: summary for s, summary in latency.summarize_histograms(window.overall.histograms).items()
                           if s in FLEET_SIGNALS} for target_id, window in found.items()}
        with self._lock:
            self._fleet = (key, out)
        return out

    def _failing(self, target: TargetView) -> bool:
        source = self.sources.get(target.origin)
        return source is not None and source.status.failing

    def quantile_series(self, session: Session, target: TargetView, signal: str, q: float | None, span: float,
                        step: float, lookback: float, end: float, model: str | None) -> list[dict]:
        with _answering(target):
            return self.sources.quantile_series(target, signal, q, span, step, lookback, end, model)

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float,
                   decode: bool) -> tuple[list[str], TargetWindow] | None:
        """The prefill replicas sharing a decode replica's ``pd_pair_labels`` values, summed."""
        if not decode:
            return None
        with _answering(target):
            return self.sources.prefill_of(session, target, start, end)

    def history(self, session: Session, target: TargetView, signals: Sequence[str], start: float, end: float
                ) -> HistogramHistory:
        """Computed by the source's server (:class:`SourceHistory`): one query now, one per chart line."""
        return SourceHistory(self.sources, target, signals, start, end)

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        """By PromQL on each source's server (:func:`app.promsource.slo.source_sums`)."""
        return source_sums(sessions, self.sources, slos, now) if slos else ({}, {})

    def statuses(self) -> list[SourceStatus]:
        return self.sources.statuses()
