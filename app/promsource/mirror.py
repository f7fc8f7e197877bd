"""A source's means series and latency buckets, each sample read once: the raw samples since the last read.

Every round of a source reads the same series over overlapping windows (the diagnosis' 60 s
every 30 s, the summaries' and the SLO alerts' 5 minutes every 15 s, the change events' 30 s),
and what a query costs Prometheus grows with the series it touches and the functions it
applies, not with the samples. A :class:`SampleMirror` keeps the raw samples of the series
those rounds read every time - each histogram's ``_sum`` and ``_count``, the gauges, the
counters, ``up``, and (``hold_buckets``, by default) the buckets of :data:`HOLDABLE` (TTFT and
ITL: what the SLO alerts judge every round and the diagnosis' largest bucket reads) - for the
longest such window; a refresh asks for those series' samples since the last refresh only (one
plain range selector per group, ``{__name__=~"..."}[Δ]``), and the rounds' windows are computed
here from them, grouped as :class:`app.promsource.queries.SourceQueries`' queries group them,
with the same per-series maths as Prometheus 2.42 (:mod:`app.core.quantiles`:
``increase``/``rate`` = ``extrapolatedRate``; the ``*_over_time`` functions), so the reader
regroups them unchanged and the numbers are the server's over the same samples
(``tests/promsource/test_mirror_reads.py``, ``tests/promsource/test_matrix_both_modes.py``).

A window ending at most ``lag`` seconds after the last refresh is computed from it as it was at
the refresh (the same length, ending then): the rounds of one moment share one read, and a
window is the server's answer of up to ``lag`` seconds before, never one cut short of its end.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from app.core import quantiles
from app.core.quantiles import avg_of, avg_over_time, sum_of, sum_over_time
from app.promql.client import PromAPIError, RangeSeries, VectorSample
from app.promql.text import any_of, format_matchers
from app.promsource.config import HOLDABLE
from app.promsource.queries import (
    COUNTER_FAMILIES,
    FAMILY_LABEL,
    GAUGE_FAMILIES,
    HISTOGRAM_FAMILIES,
    MODEL_LABEL,
    STAT_LABEL,
    Family,
    prom_duration,
)
from app.sources import tgi
from app.vectors import any_decrease
from app.window import AVERAGED_GAUGES, RANK_GAUGES, RANK_MEANS

log = logging.getLogger(__name__)

#: how far back a mirror holds the samples: the longest windows its rounds read - the summaries'
#: 5 minutes, and a firing alert's attribution (the 2 minutes of its ``for`` and the diagnosis
#: window, then as long before them: ~6.5 minutes at the defaults) - and the scrapes before them
RETENTION = 480.0
#: how far before the last refresh a refresh reads again: a scrape whose samples Prometheus
#: committed after that refresh, stamped before it (a scrape that took up to this long)
OVERLAP = 15.0
#: the longest range one read asks for: a first read of the retention comes in pieces
PIECE = 120.0
#: the shortest: a piece whose answer holds too many samples is read in halves down to this
MIN_PIECE = 15.0
#: how often the samples older than the retention are cut (seconds)
TRIM_EVERY = 60.0
#: the default ``lag`` of a running service: the default diagnosis interval, so that the rounds
#: between two diagnosis rounds (summaries, alerts, change events, out of step with it) share its
#: refresh - one read of the raw samples per interval
SHARED_LAG = 30.0

_T = TypeVar("_T")
Labels = dict[str, str]
Series = dict[str, dict[tuple[tuple[str, str], ...], "_Held"]]
#: the jobs of a window read (app.promsource.reader) a mirror answers, with the means-only histograms
MIRRORED = frozenset({"gauge", "counter", "scrapes", "restarts", "ranks", "itl_intervals", "tgi_kv"})


def means_names() -> list[str]:
    """Every metric name a mirror reads: the histograms' ``_sum``/``_count``, the gauges, the counters."""
    names = {f.name + part for families in HISTOGRAM_FAMILIES.values() for f in families for part in ("_sum", "_count")}
    names |= {f.name for families in (*GAUGE_FAMILIES.values(), *COUNTER_FAMILIES.values()) for f in families}
    names |= {f.positive for families in GAUGE_FAMILIES.values() for f in families if f.positive}
    return sorted(names | {tgi.KV_USED, tgi.KV_CAPACITY})


def bucket_names(signal: str) -> list[str]:
    """The bucket series' names of one histogram, every engine's."""
    return sorted({f.name + "_bucket" for f in HISTOGRAM_FAMILIES[signal]})


class _Held(NamedTuple):
    """One series' samples in time order (integer milliseconds and values), its labels and the
    label values it is grouped by (worked out once: a round groups every series several times)."""

    pairs: tuple[tuple[str, str], ...]  # its labels without __name__, sorted: the series' key
    ts: array
    values: array
    target: tuple[str, ...]  # its values of the source's target labels
    group: tuple[str, ...]  # of the target labels and the model label: what most queries group by
    le: str  # a bucket's bound ("" for a series that is not a bucket)

    @property
    def labels(self) -> Labels:
        return dict(self.pairs)

    def span(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """The indexes of the samples in the closed range ``[start_ms, end_ms]`` (a 2.x range selector)."""
        return bisect_left(self.ts, start_ms), bisect_right(self.ts, end_ms)

    def with_samples(self, ts: array, values: array) -> _Held:
        """The same series holding these samples."""
        return _Held(self.pairs, ts, values, self.target, self.group, self.le)


def _key_reader(by: tuple[str, ...], target_labels: tuple[str, ...]) -> Callable[[_Held], tuple[str, ...]]:
    """How a series' values of the labels ``by`` (the target labels first, then the model label,
    then ``le``) are read: worked out once per grouping, not once per series."""
    if by == target_labels:
        return _target
    if by[len(target_labels):] == (MODEL_LABEL,):
        return _group
    if by[len(target_labels):] == (MODEL_LABEL, "le"):
        return _bucket
    return lambda held: tuple([held.labels.get(label, "") for label in by])


def _target(held: _Held) -> tuple[str, ...]:
    return held.target


def _group(held: _Held) -> tuple[str, ...]:
    return held.group


def _bucket(held: _Held) -> tuple[str, ...]:
    return (*held.group, held.le)


@dataclass(frozen=True, slots=True)
class Wanted:
    """Which held series a read takes: those of the targets ``targets`` (None: of every target)
    whose labels have the values ``where``."""

    targets: frozenset[tuple[str, ...]] | None = None
    where: tuple[tuple[str, str], ...] = ()


#: every series held (a read of every target)
EVERY = Wanted()


class SampleMirror:
    """The raw samples of one source's means series over the last :data:`RETENTION` seconds."""

    def __init__(self, client: object, matchers: Sequence[tuple[str, str, str]], target_labels: Sequence[str],
                 lag: float = 0.0, retention: float = RETENTION, buckets: Collection[str] = HOLDABLE) -> None:
        """``buckets``: the histograms of :data:`HOLDABLE` whose buckets are kept too."""
        if other := sorted(set(buckets) - HOLDABLE):
            raise ValueError(f"only the buckets of {sorted(HOLDABLE)} can be kept, not {other}")
        self.client = client
        self.target_labels = tuple(target_labels)
        self.lag, self.retention = lag, retention
        # one read per group of names, each answer within the limits on its own: the means series,
        # then each histogram's buckets (None: the means, "ttft": its buckets, ...)
        self.selectors = {group: "{" + format_matchers([("__name__", "=~", any_of(names)), *matchers]) + "}"
                          for group, names in [(None, [*means_names(), "up"]),
                                               *((signal, bucket_names(signal)) for signal in sorted(buckets))]}
        self.time: float | None = None  # the evaluation time of the last refresh
        self.held_from = math.inf  # samples at or after this time are all held
        self.refused = ""  # why the mirror is off (an answer too large): its rounds query instead
        self.refused_buckets: dict[str, str] = {}  # histogram -> why its buckets are not held (queried)
        self.refreshes = 0
        self._series: Series = {}
        self._answers: dict[tuple, Any] = {}  # what was computed from the samples since the last refresh (Held.memo)
        self._trimmed_at = -math.inf
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading
    @property
    def buckets(self) -> frozenset[str]:
        """The histograms whose buckets are held (those not refused as too many)."""
        return frozenset(group for group in self.selectors if group is not None)

    def series_held(self) -> int:
        return sum(len(by_key) for by_key in self._series.values())

    def covers(self, start: float, end: float, refresh: bool = True) -> bool:
        return self.view(start, end, refresh) is not None

    def view(self, start: float, end: float, refresh: bool = True, fresh: bool = False) -> Held | None:
        """The samples that answer ``[start, end]``, refreshing first (``refresh``) when ``end`` is
        more than ``lag`` after the last refresh; None for a window longer than the retention or
        one that starts before the samples held, and once refused as too large. Without
        ``refresh`` (a read of one target), only a window that ended by the last refresh: the
        lag is for rounds that share a read, a window asked of one target ends when asked.
        ``fresh`` (the diagnosis round): no lag either, a refresh whenever ``end`` is past the last."""
        if self.refused or end - start > self.retention - OVERLAP:
            return None
        lag = self.lag if refresh and not fresh else 0.0
        with self._lock:
            if refresh and (self.time is None or end > self.time + lag):
                try:
                    self._refresh(max(time.time(), end))
                except PromAPIError as exc:
                    if exc.kind != "too_large":
                        raise
                    self.refused = exc.message
                    log.warning("the source's raw samples are too many to keep (%s): its rounds query instead",
                                exc.message)
                    return None
            if self.time is None or not end <= self.time + lag:
                return None
            if self.held_from > min(end, self.time) - (end - start):
                return None
            return Held(self._series, self.target_labels, min(end, self.time), self._answers, self.buckets)

    def _merge(self, series: Series, data: Sequence[RangeSeries]) -> None:
        """Each answer series' samples newer than those held, appended to a new copy of its series."""
        by_model = tuple(dict.fromkeys((*self.target_labels, MODEL_LABEL)))
        for read in data:
            labels = dict(read.labels)
            name = labels.pop("__name__", "")
            by_key = series.setdefault(name, {})
            held = by_key.get(key := tuple(sorted(labels.items())))
            last = held.ts[-1] if held is not None and len(held.ts) else -1
            ts, values = array("q"), array("d")
            for t, v in read.points:
                ms = quantiles.to_millis(t)
                if ms > last:
                    ts.append(ms)
                    values.append(v)
                    last = ms
            if not ts:
                continue
            if held is None:
                by_key[key] = _Held(key, ts, values, tuple([labels.get(n, "") for n in self.target_labels]),
                                    tuple([labels.get(n, "") for n in by_model]), labels.get("le", ""))
            else:
                by_key[key] = held.with_samples(held.ts + ts, held.values + values)

    def _refresh(self, now: float) -> None:
        """Read the samples since the last refresh (less :data:`OVERLAP`; all the retention the
        first time or after a gap) into a new set of held series, the old one left as it was."""
        since = now - self.retention if self.time is None or now - self.time > self.retention - OVERLAP \
            else self.time - OVERLAP
        fresh = self.time is None or since < self.time - OVERLAP
        series = {} if fresh else {name: dict(by_key) for name, by_key in self._series.items()}
        # a read of the whole retention in pieces of at most PIECE seconds, oldest first (each within
        # max_samples where one would not be), every later one the time since the last
        ends = [now - k * PIECE for k in range(math.ceil((now - since) / PIECE) - 1, -1, -1)]
        for group, selector in list(self.selectors.items()):
            try:
                for piece_end in ends:
                    self._read(series, selector, piece_end - min(PIECE, piece_end - since), piece_end)
            except PromAPIError as exc:
                if exc.kind != "too_large" or group is None:
                    raise
                log.warning("the source's %s buckets are too many to keep (%s): they are queried", group, exc.message)
                del self.selectors[group]
                self.refused_buckets[group] = exc.message
                for name in bucket_names(group):
                    series.pop(name, None)
        held_from = since if fresh else max(self.held_from, now - self.retention)
        if fresh or now - self._trimmed_at >= TRIM_EVERY:  # older samples are never selected: cut them now and then
            series, self._trimmed_at = _trimmed(series, quantiles.to_millis(held_from)), now
        self._series, self._answers = series, {}
        self.time, self.held_from, self.refreshes = now, held_from, self.refreshes + 1


    def _read(self, series: Series, selector: str, start: float, end: float) -> None:
        """The samples of ``selector`` in ``[start, end]`` into ``series``; an answer with too many
        samples (or bytes) is read again in halves, down to :data:`MIN_PIECE`."""
        try:
            answer = self.client.query_samples(  # type: ignore[attr-defined]
                f"{selector}[{prom_duration(end - start)}]", end)
        except PromAPIError as exc:
            if exc.kind != "too_large" or exc.limit == "max_series" or end - start < 2 * MIN_PIECE:
                raise
            middle = end - round((end - start) * 500) / 1000  # whole milliseconds, as the range is
            self._read(series, selector, start, middle)
            self._read(series, selector, middle, end)
            return
        self._merge(series, answer.data)


class Held:
    """The samples a mirror held at one refresh (never changed after: a later refresh makes a new
    one), answering a window read's jobs as their queries would."""

    def __init__(self, series: Series, target_labels: tuple[str, ...],
                 at: float, answers: dict[tuple, Any] | None = None, buckets: frozenset[str] = frozenset()) -> None:
        """``at``: where the windows asked of it end - the end asked, or the refresh's time when that
        is earlier (a window within the lag is the server's answer at the refresh, not short of it).
        ``answers``: the answers for every target already computed from these samples (the rounds
        that share a refresh ask the same windows: the summaries' and the SLO alerts' every 15 s)."""
        self.series, self.target_labels, self.at = series, target_labels, at
        self.answers: dict[tuple, Any] = {} if answers is None else answers
        self.buckets = buckets  # the histograms whose buckets are held

    def _select(self, family: Family, name: str, wanted: Wanted) -> list[_Held]:
        found: Iterable[_Held]
        chosen = wanted.targets
        if chosen is None:
            found = self.series.get(name, {}).values()
        elif len(chosen) == 1:  # one target's series, found through the index
            found = self._by_target(name).get(next(iter(chosen)), [])
        else:  # some targets' series, in the order held, without a look at every series
            found = [h for target, helds in self._by_target(name).items() if target in chosen for h in helds]
        matchers = [*((label, value) for label, _, value in family.matchers), *wanted.where]
        if not matchers:
            return list(found)
        return [h for h in found if all(h.labels.get(label, "") == value for label, value in matchers)]

    def _by_target(self, name: str) -> dict[tuple[str, ...], list[_Held]]:
        """``name``'s series by target, in the order held (made once per refresh, when first asked)."""
        def index() -> dict[tuple[str, ...], list[_Held]]:
            by_target: dict[tuple[str, ...], list[_Held]] = {}
            for held in self.series.get(name, {}).values():
                by_target.setdefault(held.target, []).append(held)
            return by_target
        return self.memo(("by target", name), index)

    def answer(self, job: tuple[str, str], start: float, end: float, wanted: Wanted, step: float,
               buckets: bool = False) -> list[VectorSample] | list[RangeSeries]:
        """The answer of a window read's job (kind, signal), shaped as its query's (``step``: the
        ITL-by-batch split's; ``buckets``: a histogram's buckets too, one of :attr:`buckets`).
        An answer for every target is computed once per refresh (the callers only read it)."""
        if wanted != EVERY:
            return self._answer(job, start, end, wanted, step, buckets)
        return self.memo((job, start, end, step, buckets), lambda: self._answer(job, start, end, wanted, step, buckets))

    def memo(self, key: tuple, compute: Callable[[], _T]) -> _T:
        """``compute()`` once per refresh for ``key`` (a read of every target, an index of these
        samples): the rounds that share a refresh ask the same (the caller must not change what
        it returns)."""
        if key not in self.answers:
            self.answers[key] = compute()
        return self.answers[key]

    def buckets_over(self, signal: str, length: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`answer` of ``signal``'s histogram with its buckets over the ``length`` seconds
        that end at :attr:`at`."""
        return self.answer(("histogram", signal), self.at - length, self.at, wanted, 0.0, buckets=True)  # type: ignore[return-value]

    def _answer(self, job: tuple[str, str], start: float, end: float, wanted: Wanted, step: float,
                buckets: bool) -> list[VectorSample] | list[RangeSeries]:
        kind, signal = job
        if kind == "ranks":
            return self.ranks(start, end, wanted)
        if kind == "itl_intervals":
            return self.itl_intervals(start, end, step, wanted)
        if kind == "tgi_kv":
            return self.tgi_kv(start, end, wanted)
        if kind == "histogram":
            return self.histogram(signal, start, end, wanted, buckets)
        if kind == "gauge":
            return self.gauge(signal, start, end, wanted)
        if kind == "counter":
            return self.counter(signal, start, end, wanted)
        return self.scrapes(start, end, wanted) if kind == "scrapes" else self.restarts(start, end, wanted)

    def histogram(self, signal: str, start: float, end: float, wanted: Wanted, buckets: bool = False
                  ) -> list[VectorSample]:
        """:meth:`SourceQueries.histogram`: per target and model the ``increase`` of ``_sum``
        (``le="sum"``), of ``_count`` (``le="count"``) and (``buckets``, a signal whose buckets are
        held) of every bucket, by ``le``."""
        if buckets and signal not in self.buckets:
            raise ValueError(f"the buckets of {signal} are not held")
        start_ms, end_ms = _range(start, end)
        out = []
        for i, f in enumerate(HISTOGRAM_FAMILIES[signal]):
            if buckets:
                per = _increases(self._select(f, f"{f.name}_bucket", wanted), start_ms, end_ms, False)
                out += self._grouped(per, sum_of, {FAMILY_LABEL: str(i)}, (MODEL_LABEL, "le"))
            for part in ("sum", "count"):
                per = _increases(self._select(f, f"{f.name}_{part}", wanted), start_ms, end_ms, False)
                out += self._grouped(per, sum_of, {"le": part, FAMILY_LABEL: str(i)}, True)
        return out

    def gauge(self, signal: str, start: float, end: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`SourceQueries.gauge`: per target and model, the sum (an averaged gauge: the mean)
        of each series' last, mean and max over the window."""
        start_ms, end_ms = _range(start, end)
        combine = avg_of if signal in AVERAGED_GAUGES else sum_of
        out = []
        for i, f in enumerate(GAUGE_FAMILIES[signal]):
            held = self._select(f, f.name, wanted)
            if f.positive:  # `and (min_over_time(positive[w]) > 0)`: same labels, above 0 all along
                above = {h.pairs for h in self._select(Family(f.engine, f.positive), f.positive, wanted)
                         if (m := _over(h, start_ms, end_ms, min)) is not None and m > 0}
                held = [h for h in held if h.pairs in above]
            stats = [(h, _over(h, start_ms, end_ms, _stats)) for h in held]  # (last, mean, max) in one pass
            for n, stat in enumerate(("last", "avg", "max")):
                per = [(h, None if found is None else found[n]) for h, found in stats]
                out += self._grouped(per, combine, {STAT_LABEL: stat, FAMILY_LABEL: str(i)}, True)
        return out

    def counter(self, signal: str, start: float, end: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`SourceQueries.counter`: per target and model, the sum of each series' ``rate``."""
        start_ms, end_ms = _range(start, end)
        out = []
        for i, f in enumerate(COUNTER_FAMILIES[signal]):
            per = _increases(self._select(f, f.name, wanted), start_ms, end_ms, True)
            out += self._grouped(per, sum_of, {FAMILY_LABEL: str(i)}, True)
        return out

    def scrapes(self, start: float, end: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`SourceQueries.scrapes`: per target, the sum of ``up`` over the window."""
        start_ms, end_ms = _range(start, end)
        per = [(h, _over(h, start_ms, end_ms, sum_over_time)) for h in self._select(Family("", "up"), "up", wanted)]
        return self._grouped(per, sum_of, {}, False)

    def restarts(self, start: float, end: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`SourceQueries.restarts`: per target, the most resets one counter series shows."""
        start_ms, end_ms = _range(start, end)
        names = sorted({f.name for families in COUNTER_FAMILIES.values() for f in families if not f.matchers})
        per = [(h, _over(h, start_ms, end_ms, _resets)) for name in names
               for h in self._select(Family("", name), name, wanted)]
        return self._grouped(per, max, {}, False)

    def ranks(self, start: float, end: float, wanted: Wanted) -> list[VectorSample]:
        """:meth:`SourceQueries.rank_gauges`: per target, model and rank, the sum of each series'
        mean of every :data:`RANK_GAUGES` gauge, and each :data:`RANK_MEANS` histogram's mean."""
        start_ms, end_ms = _range(start, end)
        out = []
        for signal in RANK_GAUGES:
            for i, f in enumerate(GAUGE_FAMILIES.get(signal, [])):
                if f.engine != "tgi":
                    per = [(h, _over(h, start_ms, end_ms, avg_over_time)) for h in self._select(f, f.name, wanted)]
                    tags = {STAT_LABEL: signal, FAMILY_LABEL: str(i)}
                    out += self._grouped(per, sum_of, tags, (MODEL_LABEL, _rank(f)))
        for signal in RANK_MEANS:
            for i, f in enumerate(HISTOGRAM_FAMILIES.get(signal, [])):
                if f.engine == "tgi":
                    continue
                sums, counts = ({frozenset(v.labels.items()): v.value for v in self._grouped(
                    _increases(self._select(f, f"{f.name}_{part}", wanted), start_ms, end_ms, False),
                    sum_of, {}, (MODEL_LABEL, _rank(f)))} for part in ("sum", "count"))
                tags = {STAT_LABEL: signal, FAMILY_LABEL: str(i)}
                out += [VectorSample({**dict(labels), **tags}, quantiles.divide(total, counts[labels]))
                        for labels, total in sums.items() if labels in counts]
        return out

    def itl_intervals(self, start: float, end: float, step: float, wanted: Wanted) -> list[RangeSeries]:
        """:meth:`SourceQueries.itl_intervals` as the range query from ``start + step`` to ``end``
        every ``step`` asks it: per target, model and rank, the ITL ``_sum`` and ``_count``
        increases and the mean running batch of each step."""
        first_ms, end_ms, step_ms = quantiles.to_millis(start + step), quantiles.to_millis(end), round(step * 1000)
        points: dict[frozenset[tuple[str, str]], list[tuple[float, float]]] = {}
        for i, f in enumerate(HISTOGRAM_FAMILIES["itl"]):
            if f.engine == "tgi":
                continue
            running = next(g for g in GAUGE_FAMILIES["running"] if g.engine == f.engine)
            by = (MODEL_LABEL, _rank(f))
            sums, counts = self._select(f, f.name + "_sum", wanted), self._select(f, f.name + "_count", wanted)
            batches = self._select(running, running.name, wanted)
            for t_ms in range(first_ms, end_ms + 1, step_ms):
                parts = [("sum", _increases(sums, t_ms - step_ms, t_ms, False)),
                         ("count", _increases(counts, t_ms - step_ms, t_ms, False)),
                         ("running", [(h, _over(h, t_ms - step_ms, t_ms, avg_over_time)) for h in batches])]
                for stat, per in parts:
                    for v in self._grouped(per, sum_of, {STAT_LABEL: stat, FAMILY_LABEL: str(i)}, by):
                        points.setdefault(frozenset(v.labels.items()), []).append((t_ms / 1000.0, v.value))
        return [RangeSeries(dict(labels), series) for labels, series in points.items()]

    def tgi_kv(self, start: float, end: float, wanted: Wanted) -> list[RangeSeries]:
        """:meth:`SourceQueries.tgi_kv_samples`: TGI's used and capacity gauges' raw samples."""
        start_ms, end_ms = _range(start, end)
        out = []
        for name in (tgi.KV_USED, tgi.KV_CAPACITY):
            for h in self._select(Family("tgi", name), name, wanted):
                a, b = h.span(start_ms, end_ms)
                if b > a:
                    out.append(RangeSeries({"__name__": name, **dict(h.pairs)},
                                           [(t / 1000.0, v) for t, v in zip(h.ts[a:b], h.values[a:b], strict=True)]))
        return out

    def _grouped(self, per: list[tuple[_Held, float | None]], combine: Callable[[list[float]], float],
                 tags: Labels, extra: bool | tuple[str, ...]) -> list[VectorSample]:
        """``combine by (<target labels>, <extra>)`` (``extra`` True: the model), then the tags:
        what the query answers."""
        more = (MODEL_LABEL,) if extra is True else () if extra is False else extra
        by = tuple(dict.fromkeys((*self.target_labels, *more)))
        groups: dict[tuple[str, ...], list[float]] = {}
        key_of = _key_reader(by, self.target_labels)
        for held, found in per:
            if found is not None:
                groups.setdefault(key_of(held), []).append(found)
        out = []
        for key, values in groups.items():
            labels = dict(tags)
            for label, text in zip(by, key, strict=True):
                if text:
                    labels[label] = text
            out.append(VectorSample(labels, combine(values)))
        return out


def _trimmed(series: Series, oldest_ms: int) -> Series:
    """``series`` without the samples before ``oldest_ms`` (a series left with none is dropped)."""
    out = {}
    for name, by_key in series.items():
        kept = {}
        for key, held in by_key.items():
            cut = bisect_left(held.ts, oldest_ms)
            if cut < len(held.ts):
                kept[key] = held if cut == 0 else held.with_samples(held.ts[cut:], held.values[cut:])
        if kept:
            out[name] = kept
    return out


def wanted_by(only: tuple[str, ...] | None, where: dict[str, str] | None,
              keys: Collection[tuple[str, ...]] | None) -> Wanted:
    """The held series of one target (``only``), of the targets with these label values
    (``where``), of a set of targets (``keys``), or all."""
    if only is not None:
        return Wanted(frozenset([only]))
    if where is not None:
        return Wanted(where=tuple(where.items()))
    return EVERY if keys is None else Wanted(frozenset(keys))


def _range(start: float, end: float) -> tuple[int, int]:
    """The milliseconds a query at ``end`` over ``[end - start]`` selects (as the reader asks it)."""
    end_ms = quantiles.to_millis(end)
    return end_ms - max(0, round((end - start) * 1000)), end_ms


def _rank(family: Family) -> str:
    """The label of a family's data-parallel rank (vLLM's ``engine``, else ``dp_rank``), as the queries name it."""
    return "engine" if family.engine == "vllm" else "dp_rank"


def _increases(helds: Sequence[_Held], start_ms: int, end_ms: int, is_rate: bool) -> list[tuple[_Held, float | None]]:
    """Each series' ``increase`` (``is_rate``: ``rate``) over the range, as
    :func:`quantiles.counter_over` gives it: the counter resets' correction per series, the
    extrapolation once per first and last timestamp and sample count (a histogram's series are
    sampled at the same instants: one factor for all of them, :func:`quantiles.extrapolate_all`)."""
    out: list[tuple[_Held, float | None]] = []
    # (first ms, last ms, samples) -> the positions in `out`, the reset-corrected results, the first values
    batches: dict[tuple[int, int, int], tuple[list[int], list[float], list[float]]] = {}
    for held in helds:
        a, b = held.span(start_ms, end_ms)
        out.append((held, None))
        if b - a < 2:
            continue  # no sample from Prometheus either
        values = held.values[a:b]
        first = values[0]
        # a counter reset (a value falls): Prometheus' correction, walked only then
        result = quantiles.reset_corrected(values) if any_decrease(values) else values[-1] - first
        positions, results, firsts = batches.setdefault((held.ts[a], held.ts[b - 1], b - a), ([], [], []))
        positions.append(len(out) - 1)
        results.append(result)
        firsts.append(first)
    for (first_ms, last_ms, n), (positions, results, firsts) in batches.items():
        found = quantiles.extrapolate_all(results, firsts, first_ms, last_ms, n, start_ms, end_ms, is_counter=True,
                                          is_rate=is_rate)
        for position, value in zip(positions, found, strict=True):
            out[position] = (out[position][0], value)
    return out


def _over(held: _Held, start_ms: int, end_ms: int, fn: Callable[[Sequence[float]], _T]) -> _T | None:
    """``fn`` of the series' values in the range (a ``*_over_time`` function); None without one."""
    a, b = held.span(start_ms, end_ms)
    return fn(held.values[a:b]) if b > a else None


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    """``last_over_time``, ``avg_over_time`` and ``max_over_time`` of one series' samples."""
    return values[-1], avg_over_time(values), _max(values)


def _max(values: Sequence[float]) -> float:
    """``max_over_time``: a NaN is passed over unless all are NaN."""
    best = values[0]
    for v in values:
        if v > best or math.isnan(best):
            best = v
    return best


def _resets(values: Sequence[float]) -> float:
    return float(sum(1 for a, b in zip(values, values[1:]) if b < a))
