"""Metric windows, whichever backend holds a target's samples.

:class:`Windows` is the one place that knows which backend answers for a target (the built-in
store for the targets this service scrapes, a Prometheus source for those it discovered); it
answers the same :class:`~app.windows.base.WindowReader` interface itself, so features ask it
and never which backend answers - as PromQL asks Prometheus' ``storage.Queryable``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sqlalchemy.orm import Session, sessionmaker

from app.latency import WindowSummary
from app.slo.config import SloObjective
from app.slo.status import SloErrors, SloSums
from app.store.models import DISCOVERED_BY_SOURCES, SERVICE_KIND, TargetView
from app.window import TargetWindow
from app.windows.base import (
    BucketNeeds,
    HistogramHistory,
    HistogramsRead,
    SourceStatus,
    WindowError,
    WindowReader,
    WindowsRead,
)
from app.windows.store import StoreWindows


class Windows:
    """Every backend behind one :class:`~app.windows.base.WindowReader`."""

    def __init__(self, store: WindowReader, sources: WindowReader) -> None:
        self.store = store
        self.sources = sources

    @staticmethod
    def is_aggregate(target: TargetView) -> bool:
        """A target that sums others (a Prometheus source's service): its numbers are already its
        members', so per-target evaluations (SLO conditions, gauges) skip it."""
        return target.source == SERVICE_KIND

    def reader(self, target: TargetView) -> WindowReader:
        """The backend that holds ``target``'s samples."""
        return self.sources if target.source in DISCOVERED_BY_SOURCES else self.store

    def window(self, session: Session, target: TargetView, start: float, end: float,
               signals: Sequence[str], diagnosis: bool = False, buckets: Collection[str] | None = None
               ) -> TargetWindow:
        return self.reader(target).window(session, target, start, end, signals, diagnosis, buckets)

    def _split(self, targets: Sequence[TargetView]) -> list[tuple[WindowReader, list[TargetView]]]:
        """``targets`` by backend, leaving out a backend with none (it is not asked)."""
        parts = [(reader, [t for t in targets if self.reader(t) is reader]) for reader in (self.store, self.sources)]
        return [(reader, mine) for reader, mine in parts if mine]

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None) -> WindowsRead:
        out = WindowsRead()
        for reader, mine in self._split(targets):
            read = reader.windows(session, mine, start, end, signals, diagnosis, histograms_only, buckets, scalars)
            out.found.update(read.found)
            out.failed |= read.failed
        return out

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        out = HistogramsRead()
        for reader, mine in self._split(targets):
            read = reader.histograms(session, mine, start, end, signals, above)
            out.found.update(read.found)
            out.failed |= read.failed
        return out

    def shared_end(self, target: TargetView, now: float) -> float:
        return self.reader(target).shared_end(target, now)

    def fleet_summaries(self, session: Session, targets: Sequence[TargetView], start: float, end: float
                        ) -> dict[int, dict[str, WindowSummary]]:
        out: dict[int, dict[str, WindowSummary]] = {}
        for reader, mine in self._split(targets):
            out.update(reader.fleet_summaries(session, mine, start, end))
        return out

    def discover(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
                 needs: BucketNeeds | None = None) -> None:
        for reader in (self.store, self.sources):
            reader.discover(sessions, now, window, signals, needs)

    def quantile_series(self, session: Session, target: TargetView, signal: str, q: float | None, span: float,
                        step: float, lookback: float, end: float, model: str | None) -> list[dict]:
        return self.reader(target).quantile_series(session, target, signal, q, span, step, lookback, end, model)

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float,
                   decode: bool) -> tuple[list[str], TargetWindow] | None:
        return self.reader(target).prefill_of(session, target, start, end, decode)

    def history(self, session: Session, target: TargetView, signals: Sequence[str], start: float, end: float
                ) -> HistogramHistory:
        return self.reader(target).history(session, target, signals, start, end)

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        sums: SloSums = {}
        errors: SloErrors = {}
        for reader in (self.store, self.sources):
            found, failed = reader.slo_sums(sessions, slos, now)
            for name, sums_of in found.items():
                sums.setdefault(name, {}).update(sums_of)
            for name, errors_of in failed.items():
                errors.setdefault(name, {}).update(errors_of)
        return sums, errors

    def statuses(self) -> list[SourceStatus]:
        return [*self.store.statuses(), *self.sources.statuses()]


def default_windows() -> WindowReader:
    """The built-in store alone: what a round reads when the service has no sources (tests, the
    one-shot diagnosis)."""
    return StoreWindows()


__all__ = ["HistogramsRead", "SourceStatus", "WindowError", "WindowReader", "Windows", "WindowsRead", "default_windows"]
