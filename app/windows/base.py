"""The one interface every metric backend answers: windows, their time series, and its errors.

A backend holds samples of some targets (the built-in store: the targets this service scrapes;
a Prometheus source: the replicas it discovered) and answers for them with a
:class:`~app.window.TargetWindow` - the type the latency report, the diagnosis, the SLOs and the
status page read. Features ask :class:`app.windows.Windows`, which hands each target to the
backend that holds it; none of them asks which backend that is.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from app.core.quantiles import WindowHistogram
from app.latency import WindowSummary
from app.promsource.status import SourceStatus as SourceStatus  # features read a source's status from here
from app.slo.config import SloObjective
from app.slo.status import SloErrors, SloSums
from app.store.models import TargetView
from app.window import TailProbe, TargetWindow

#: (target name, engine, its means-first window) -> the histograms whose buckets its diagnosis needs
#: (:func:`app.diagnosis.tails.buckets_needed`)
BucketNeeds = Callable[[str, str, TargetWindow], Collection[str | TailProbe]]
#: What the fleet table shows of each target (:meth:`WindowReader.fleet_summaries`); the TTFT of an
#: engine without a TTFT histogram (TGI) is derived from its queue and prefill time.
FLEET_SIGNALS = ("ttft", "itl")
TTFT_PARTS = ("queue_time", "prefill_time")

#: The ``kind`` of a :class:`WindowError`, and the HTTP status an API answer gives it.
ERROR_STATUS = {"unavailable": 502, "not_configured": 503}


class WindowError(Exception):
    """A backend could not answer for a target: ``unavailable`` (its server failed: unreachable,
    timeout, a bad answer) or ``not_configured`` (its backend is gone from the configuration).
    ``message`` is safe to show anyone: it classifies the fault and never quotes the server."""

    def __init__(self, kind: str, message: str) -> None:
        assert kind in ERROR_STATUS, kind
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.kind]


@dataclass(slots=True)
class WindowsRead:
    """Many targets' windows (by target id), and the ids whose backend could not answer: their
    numbers are unknown, not absent (an alert on them must neither fire nor resolve)."""

    found: dict[int, TargetWindow] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)


@dataclass(slots=True)
class HistogramsRead:
    """Many targets' histograms of some signals (all models summed by ``le``; None: the series
    exist without two samples in the window), and the ids whose backend could not answer."""

    found: dict[int, dict[str, WindowHistogram | None]] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)


class HistogramHistory(Protocol):
    """A target's histograms over a span, for charts: the window histogram of a signal between
    any two times in it (all models and ranks summed by ``le``)."""

    @property
    def signals(self) -> set[str]: ...  # the histogram signals it holds

    def merged(self, start: float, end: float, signal: str, model: str | None = None) -> WindowHistogram | None: ...

    def windows(self, signal: str, ends: Sequence[float], lookback: float) -> list[WindowHistogram | None]:
        """``merged(t - lookback, t, signal)`` at each of ``ends`` (evenly spaced): a chart's points,
        which a backend that computes windows on its server reads in one query."""
        ...

    def first_sample(self, signals: Sequence[str]) -> float | None: ...  # its oldest sample of any of them


class WindowReader(Protocol):
    """What a backend answers. ``session`` is the request's or round's database session (a
    backend that keeps no samples there does not use it); every method may raise
    :class:`WindowError` but :meth:`windows`, which reports failures per target instead."""

    def window(self, session: Session, target: TargetView, start: float, end: float,
               signals: Sequence[str], diagnosis: bool = False, buckets: Collection[str] | None = None
               ) -> TargetWindow:
        """The target's window ``[start, end]``: histograms, gauges and rates, overall and per
        model, and its engine configuration (``infos``); ``diagnosis`` and ``buckets`` as in
        :meth:`windows`."""
        ...

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None) -> WindowsRead:
        """Each target's window, read together (a fixed number of reads, whatever the count).
        ``diagnosis`` adds what only the regime rules read: successful scrapes, the engine's
        configuration, per-rank loads, the ITL by running batch size. ``histograms_only``: the
        histograms of ``signals`` per model and nothing else (a backend that reads another server
        then asks it for no gauge, rate or configuration). ``buckets``: the histograms whose
        buckets the caller needs (None: all); such a backend reads the others' ``_sum`` and
        ``_count`` alone (:attr:`~app.core.quantiles.WindowHistogram.means_only`). ``scalars``: the
        gauge and counter signals the caller needs (None: all, with the per-rank loads); such a
        backend asks for no other. The ITL by running batch size comes with ``itl`` in ``signals``."""
        ...

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        """Each target's histograms of ``signals`` and nothing else (what an SLO condition reads),
        read together. ``above``: signal -> (quantile, threshold) pairs; the caller needs only the
        targets whose quantile may be above a threshold, and a backend that reads another server
        may leave out (from ``found``) those it knows are at or below every one."""
        ...

    def discover(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
                 needs: BucketNeeds | None = None) -> None:
        """Bring the targets table in step with the targets the backend holds now (a new one gets
        a row, one that went away is marked gone, one that does not answer is down). A backend
        may read its targets' diagnosis windows over ``[now - window, now]`` on the way, to answer
        :meth:`windows` for exactly that range from them; one whose targets are configured does
        nothing. ``needs(target name, engine, window)``: the histograms whose buckets the caller
        needs of a means-first window (a backend that reads another server then reads each
        histogram's ``_sum`` and ``_count`` for every target, and buckets only for those)."""
        ...

    def shared_end(self, target: TargetView, now: float) -> float:
        """Where the rounds' windows of ``target`` end at ``now``: ``now``, or for a backend whose
        rounds share one read (a source's raw samples, refreshed once per diagnosis interval) the
        time of that read, when it is at most its lag ago. A read of one target ending there is
        answered from what that read holds - a firing alert's attribution ends where its
        condition did."""
        ...

    def fleet_summaries(self, session: Session, targets: Sequence[TargetView], start: float, end: float
                        ) -> dict[int, dict[str, WindowSummary]]:
        """Each target's summaries of :data:`FLEET_SIGNALS` (all models summed by ``le``), read
        together; a target whose backend cannot answer now has none."""
        ...

    def quantile_series(self, session: Session, target: TargetView, signal: str, q: float | None, span: float,
                        step: float, lookback: float, end: float, model: str | None) -> list[dict]:
        """``histogram_quantile(q, sum by (le) (increase(x_bucket[lookback])))`` (``q=None``: the
        mean) every ``step`` over the ``span`` before ``end``, steps aligned to multiples of ``step``."""
        ...

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float,
                   decode: bool) -> tuple[list[str], TargetWindow] | None:
        """The prefill side of a P/D target (``decode``: its role says it decodes), summed, and
        the names of its targets; None when nothing pairs it."""
        ...

    def history(self, session: Session, target: TargetView, signals: Sequence[str], start: float, end: float
                ) -> HistogramHistory:
        """The target's histograms of ``signals`` over ``[start, end]`` as a history any window
        inside it can be read from (the status page's charts)."""
        ...

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        """Each SLO's (good, total, oldest) over its windows and period for the targets whose SLI
        the backend computes on its server, and those it could not evaluate; the other targets'
        SLIs are the increments the SLO feature records from their windows (the store: none here)."""
        ...

    def statuses(self) -> list[SourceStatus]:
        """Each server the backend reads and how its last round went (the store: none)."""
        ...
