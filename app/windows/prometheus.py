"""Prometheus sources as a window backend: the replicas each source discovered.

The PromQL, its batching and the memo of long-period answers stay in :mod:`app.promsource`;
this module only puts them behind :class:`~app.windows.base.WindowReader` and turns the
source's errors into :class:`~app.windows.base.WindowError`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from sqlalchemy.orm import Session, sessionmaker

from app import latency
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
    NoHistory,
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
               signals: Sequence[str], diagnosis: bool = False) -> TargetWindow:
        with _answering(target):
            return self.sources.window(target, start, end, signals, diagnosis)

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None) -> WindowsRead:
        """The last discovery's windows when asked for exactly its diagnosis range (each handed
        out once, so they are not held past the round); else one set of queries per source."""
        with self._lock:
            kept = self._round
            if kept is not None and diagnosis and kept[0] == (start, end, tuple(signals)):
                found = {t.id: kept[1].pop(t.id) for t in targets if t.id in kept[1]}
                return WindowsRead(found, {t.id for t in targets} - found.keys())
        return WindowsRead(*self.sources.windows_and_failures(targets, start, end, signals, diagnosis,
                                                              histograms_only, buckets))

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        """One query per signal and source, for all its replicas (an aggregate's members are read)."""
        return HistogramsRead(*self.sources.histograms_of(targets, start, end, signals, above))

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
                                                  histograms_only=True)[0] if current else {}
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
        """None kept: a source's targets have no charts."""
        return NoHistory()

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        """By PromQL on each source's server (:func:`app.promsource.slo.source_sums`)."""
        return source_sums(sessions, self.sources, slos, now) if slos else ({}, {})

    def statuses(self) -> list[SourceStatus]:
        return self.sources.statuses()
