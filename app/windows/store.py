"""The built-in store as a window backend: the targets this service scrapes itself.

Reads at the coarsest downsampled level that answers a window exactly (:mod:`app.store.levels`,
through :mod:`app.latency`), in a fixed number of set-based queries for many targets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sqlalchemy.orm import Session, sessionmaker

from app import latency
from app.latency import WindowSummary
from app.slo.config import SloObjective
from app.slo.status import SloErrors, SloSums
from app.sources.base import CanonicalInfo
from app.store import reads, repository
from app.store.models import TargetView
from app.store.reads import LoadedHistograms
from app.targets import repository as target_repository
from app.window import TargetWindow
from app.windows.base import (
    FLEET_SIGNALS,
    TTFT_PARTS,
    BucketNeeds,
    HistogramHistory,
    HistogramsRead,
    SourceStatus,
    WindowsRead,
)


class StoreWindows:
    """:class:`~app.windows.base.WindowReader` over the samples in the service's database."""

    def window(self, session: Session, target: TargetView, start: float, end: float,
               signals: Sequence[str], diagnosis: bool = False, buckets: Collection[str] | None = None
               ) -> TargetWindow:
        """``buckets`` changes nothing here (see :meth:`windows`)."""
        window = reads.store_window(session, [target.id], start, end, signals, diagnosis=diagnosis)
        if not diagnosis:  # a diagnosis window has them already
            window.infos = [CanonicalInfo(i.name, i.model, i.rank, dict(i.labels))
                            for i in repository.target_infos(session, target.id)]
        return window

    def windows(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None) -> WindowsRead:
        """``histograms_only``, ``buckets`` and ``scalars`` change nothing here: the store's reads cost no
        other server."""
        return WindowsRead(reads.store_windows(session, [t.id for t in targets], start, end, signals,
                                                 diagnosis=diagnosis))

    def histograms(self, session: Session, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str], above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> HistogramsRead:
        read = reads.store_histograms(session, [t.id for t in targets], start, end, signals)
        # a signal without an increase in the window is absent, as in a source's answer
        return HistogramsRead({target_id: {s: h for s, h in found.items() if h is not None}
                               for target_id, found in read.items()})

    def discover(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
                 needs: BucketNeeds | None = None) -> None:
        """Nothing: the store's targets are those configured and discovered by the scraper."""

    def shared_end(self, target: TargetView, now: float) -> float:
        """``now``: every read of the store ends where it is asked."""
        return now

    def fleet_summaries(self, session: Session, targets: Sequence[TargetView], start: float, end: float
                        ) -> dict[int, dict[str, WindowSummary]]:
        """From the raw snapshots of the few series the table shows (cheaper than whole windows):
        a target's queue and prefill time only where it has no TTFT histogram."""
        ids = [t.id for t in targets]
        series = repository.find_series(session, ids, (*FLEET_SIGNALS, *TTFT_PARTS)) if ids else []
        with_ttft = {s.target_id for s in series if s.signal == "ttft"}
        wanted = [s for s in series if s.signal in FLEET_SIGNALS or s.target_id not in with_ttft]
        snapshots = repository.histogram_snapshots(session, [s.id for s in wanted], start, end)
        by_target: dict[int, list] = {}
        for s in wanted:
            by_target.setdefault(s.target_id, []).append(s)
        out = {}
        for t in targets:
            summaries = reads.summarize_signals(LoadedHistograms(by_target.get(t.id, []), snapshots), start, end)
            out[t.id] = {s: summary for s, summary in summaries.items() if s in FLEET_SIGNALS}
        return out

    def quantile_series(self, session: Session, target: TargetView, signal: str, q: float | None, span: float,
                        step: float, lookback: float, end: float, model: str | None) -> list[dict]:
        return reads.quantile_series(session, [target.id], signal, q, span, step, lookback, end, model)

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float,
                   decode: bool) -> tuple[list[str], TargetWindow] | None:
        """The target its ``llm_latency_prefill_target`` label names (whatever its own role says)."""
        name = (target.labels or {}).get(latency.PD_PREFILL_LABEL)
        prefill = target_repository.get_target(session, name) if name else None
        if prefill is None:
            return None
        seconds = end - start  # the window as the latency API gives it: its length before its end
        return [prefill.name], reads.store_window(session, [prefill.id], end - seconds, end, per_model=False)

    def history(self, session: Session, target: TargetView, signals: Sequence[str], start: float, end: float
                ) -> HistogramHistory:
        """Raw snapshots (a chart spans hours at most)."""
        return reads.load_histograms(session, [target.id], signals, start, end)

    def slo_sums(self, sessions: sessionmaker[Session], slos: Sequence[SloObjective], now: float
                 ) -> tuple[SloSums, SloErrors]:
        """None: the SLO feature records the increments of the store's targets itself."""
        return {}, {}

    def statuses(self) -> list[SourceStatus]:
        """None: the store reads no other server."""
        return []
