"""Answers of a Prometheus source's queries -> one :class:`app.window.TargetWindow` per target.

A round runs a fixed set of queries (:mod:`app.promsource.queries`), each answering for every
target at once, through the client's bounded concurrency; this module regroups the answers by
target. Percentiles come from the per-bucket ``increase`` Prometheus returned, with its own
``histogram_quantile`` rules (:mod:`app.core.quantiles`): equal to Prometheus' over the same
range. With a :class:`~app.promsource.mirror.SampleMirror`, the jobs that read no bucket, or only
buckets it holds, are answered from its raw samples instead, shaped as their queries' answers.

Every series is checked where it is decoded: one that cannot be what its query reads (an ``le``
that is not a number, a count of scrapes or resets that is not a finite count, a label the query
sets that it did not set) is dropped and counted by reason (:attr:`SourceReader.bad_series`,
:data:`app.promsource.answers.BAD_SERIES_REASONS`), and the target's window names what it lacks
(:attr:`app.window.TargetWindow.dropped`). No error of bad data leaves the reader.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.latency import series_point
from app.promql.client import PromAPIError, QueryResult, VectorSample
from app.promql.text import any_of, format_matchers, parse_selector, union
from app.promsource.answers import AnswerSample, Around, TargetKey, judge_around, judge_histogram, key_of
from app.promsource.answers import bound as _bound
from app.promsource.answers import family as _family
from app.promsource.answers import first_family as _first_family
from app.promsource.answers import histogram as _histogram
from app.promsource.answers import infos as _infos
from app.promsource.answers import itl_intervals as _itl_intervals
from app.promsource.answers import overall as _overall
from app.promsource.answers import ranks as _ranks
from app.promsource.answers import rescaled as _rescaled
from app.promsource.answers import tgi_kv as _tgi_kv
from app.promsource.answers import valid_le as _valid_le
from app.promsource.mirror import HOLDABLE, MIRRORED, Held, SampleMirror, Wanted, wanted_by
from app.promsource.queries import (
    COUNTER_FAMILIES,
    FAMILY_LABEL,
    GAUGE_FAMILIES,
    HISTOGRAM_FAMILIES,
    JOB_LABEL,
    MODEL_LABEL,
    NATIVE_NAMES,
    PRESENCE_FAMILIES,
    STAT_LABEL,
    SourceQueries,
    _selector,
    _tag,
    prom_duration,
)
from app.slo.buckets import bound_index
from app.sources.base import COUNTER_SIGNALS, GAUGE_SIGNALS, HISTOGRAM_SIGNALS
from app.window import GaugeStats, ModelWindow, TailProbe, TargetWindow, merge_windows

log = logging.getLogger(__name__)
#: Series dropped while reading one window, per target: (signal, reason) -> series.
Drops = dict[TargetKey, Counter[tuple[str, str]]]
SIGNAL_LABEL = "llm_latency_signal"  # the signal of each branch of a query that asks for several


def _tag_signal(expr: str, signal: str) -> str:
    return f'label_replace({expr}, "{SIGNAL_LABEL}", "{signal}", "", "")'


class QueryClient(Protocol):
    """What the reader needs of :class:`app.promql.client.PrometheusClient`."""

    def query(self, promql: str, time: float) -> Any: ...

    def query_range(self, promql: str, start: float, end: float, step: float) -> Any: ...

    def query_samples(self, selector: str, time: float) -> Any: ...

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]: ...

    def map_as_completed(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Iterable[tuple[int, Any]]: ...


@dataclass(slots=True)
class SourceTargets:
    """The targets of a source at one instant: engine per target, and ``up`` where known."""

    engines: dict[TargetKey, str] = field(default_factory=dict)
    up: dict[TargetKey, float] = field(default_factory=dict)
    service: dict[TargetKey, dict[str, str]] = field(default_factory=dict)  # service label values
    native: dict[TargetKey, set[str]] = field(default_factory=dict)  # its histograms' names held as native ones


#: The step of the subquery that finds where a source's data of a period begins: under
#: Prometheus' default 5 min lookback, so every sample is seen by some step (a coarser step
#: misses a replica that lived between two steps). 10,080 points per replica over 28 d, a
#: twentieth of what the period's bucket increases read; the answer is reused (app/promsource/slo.py).
FIRST_SEEN_STEP = 240.0


class SourceReader:
    """Reads windows and the current target set of one source through a query client."""

    def __init__(self, client: QueryClient, target_labels: Sequence[str], selector: str = "",
                 service_labels: Sequence[str] = (), mirror_lag: float | None = None,
                 hold_buckets: Collection[str] = HOLDABLE) -> None:
        """``mirror_lag``: the :class:`~app.promsource.mirror.SampleMirror`'s lag (None: no mirror,
        every window is queried); ``hold_buckets``: the histograms whose buckets it keeps too."""
        self.client = client
        self.target_labels = tuple(target_labels)
        self.service_labels = tuple(service_labels)
        self.matchers = tuple(parse_selector(selector))
        self.mirror = None if mirror_lag is None else \
            SampleMirror(client, self.matchers, self.target_labels, mirror_lag, buckets=hold_buckets)
        self.bad_series: Counter[str] = Counter()  # series dropped since the start, by reason
        self.refused: dict[str, str] = {}  # the query (signal or kind) -> why its last answer was refused
        self.buckets_read: dict[str, int] = {}  # the last round's bucket reads: histogram -> targets
        self._layouts: dict[tuple[str, int], set[str]] = {}  # (signal, family) -> le values seen
        #: the engines' scrape interval where known (0: unknown): the ITL split's steps span two of them
        self.scrape_interval = 0.0
        self._lock = threading.Lock()

    def _refuse(self, query: str, why: str) -> None:
        log.warning("source answer for %s refused: %s", query, why)
        with self._lock:
            self.refused[query] = why

    def _drop(self, drops: Drops | None, key: TargetKey, signal: str, reason: str) -> None:
        with self._lock:
            self.bad_series[reason] += 1
        if drops is not None:
            drops.setdefault(key, Counter())[(signal, reason)] += 1

    def _queries(self, only: TargetKey | None, where: dict[str, str] | None = None,
                 keys: Collection[TargetKey] | None = None) -> SourceQueries:
        """The queries of this source, narrowed to one target (``only``), to the targets with
        these label values (``where``) or to a set of targets (``keys``: one ``=~`` matcher per
        target label, a superset that the answers' keys are filtered to)."""
        extra = () if only is None else tuple((name, "=", value) for name, value in zip(self.target_labels, only))
        extra += tuple((name, "=", value) for name, value in (where or {}).items())
        if keys is not None:
            extra += tuple((name, "=~", any_of([key[i] for key in keys])) for i, name in enumerate(self.target_labels))
        return SourceQueries(self.target_labels, (*self.matchers, *extra), self.service_labels)

    # ------------------------------------------------------------------ discovery
    def discover(self, now: float) -> SourceTargets:
        """Targets whose engine series exist at ``now`` (Prometheus' 5-minute lookback, ended early
        by staleness markers when a pod goes away), and the ``up`` of every target it scrapes."""
        q = self._queries(None)
        presence, up = self.client.map(lambda text: self.client.query(text, now), [q.presence(), q.up()])
        engines = {f.name: f.engine for f in PRESENCE_FAMILIES}
        found = SourceTargets()
        for sample in presence.data:
            name = sample.labels.get("__name__", "")
            engine = engines.get(name)
            if engine is not None:
                key = key_of(sample.labels, self.target_labels)
                found.engines.setdefault(key, engine)
                found.service.setdefault(key, {name: sample.labels.get(name, "") for name in self.service_labels})
            elif name in NATIVE_NAMES:
                found.native.setdefault(key_of(sample.labels, self.target_labels), set()).add(name)
        for sample in up.data:
            found.up[key_of(sample.labels, self.target_labels)] = sample.value
        return found

    # ------------------------------------------------------------------ windows
    def windows(self, start: float, end: float, signals: Sequence[str] = HISTOGRAM_SIGNALS, *,
                only: TargetKey | None = None, where: dict[str, str] | None = None,
                diagnosis: bool = False, histograms_only: bool = False, buckets: Collection[str] | None = None,
                keys: Collection[TargetKey] | None = None, scalars: Collection[str] | None = None,
                fresh: bool = False, view: bool = False, families: dict[str, set[int]] | None = None
                ) -> dict[TargetKey, TargetWindow]:
        """Every target's window ``[start, end]`` (``only``: one target's; ``where``: those with
        these label values, e.g. one service's), in one query per signal (for ``only`` or
        ``where``, the instant ones in one request: :meth:`_combined`).

        ``diagnosis`` adds the successful scrapes, the counter resets (restarts), the per-rank loads
        and the ITL by running batch size, which the regime rules and the change attribution read;
        ``histograms_only`` asks for the histograms of ``signals`` alone (the summary round's
        per-replica means). ``buckets``: the histogram signals whose buckets are read (None: all);
        the others are read means first, ``_sum`` and ``_count`` alone
        (:attr:`WindowHistogram.means_only`). ``keys``: only these targets (an empty collection
        reads nothing). ``scalars``: the gauge and counter signals to read (None: all, and the
        per-rank loads); the ITL by running batch size is read with ``itl`` in ``signals``.
        ``fresh``: from raw samples read up to ``end`` (the diagnosis round), never a shared read.
        ``view``: a read for a reader (the status page's fleet table), exact at ``end`` as one
        target's is: it never refreshes the raw samples nor takes a window within their lag.
        ``families``: filled with the family each histogram's answer took for some target."""
        if keys is not None and not keys:
            return {}
        q = self._queries(only, where, keys)
        w = end - start
        thin = {s for s in signals if buckets is not None and s not in buckets}
        jobs: list[tuple[str, str, str]] = [("histogram", s, q.histogram(s, w, s not in thin)) for s in signals
                                            if s in HISTOGRAM_FAMILIES]
        step = max(15.0, w / 20, 2 * self.scrape_interval)  # an increase needs two samples in its step
        if not histograms_only:
            # a signal no engine's adapter maps yet has no query (and costs none)
            jobs += [("gauge", s, q.gauge(s, w)) for s in GAUGE_SIGNALS
                     if GAUGE_FAMILIES.get(s) and (scalars is None or s in scalars)]
            jobs += [("counter", s, q.counter(s, w)) for s in COUNTER_SIGNALS
                     if COUNTER_FAMILIES.get(s) and (scalars is None or s in scalars)]
            if scalars is None or "kv_usage" in scalars:
                jobs.append(("tgi_kv", "kv_usage", q.tgi_kv_samples(w)))
            jobs.append(("infos", "", q.infos()))  # the configuration: the latency API shows the P/D role too
        if diagnosis and not histograms_only:
            jobs += [("scrapes", "", q.scrapes(w)), ("restarts", "", q.restarts(w))]
            if scalars is None:
                jobs.append(("ranks", "", q.rank_gauges(w)))
            if w >= 2 * step and "itl" in signals:
                jobs.append(("itl_intervals", "", q.itl_intervals(step)))

        def run(job: tuple[str, str, str]) -> Any:
            kind, signal, text = job
            try:
                if kind == "itl_intervals":
                    answer = self.client.query_range(text, start + step, end, step)
                elif kind == "tgi_kv":
                    answer = self.client.query_samples(text, end)
                else:
                    answer = self.client.query(text, end)
            except PromAPIError as exc:
                if exc.kind != "too_large":
                    raise
                self._refuse(signal or kind, exc.message)  # the round goes on without this answer
                return None
            if self.refused:
                with self._lock:
                    self.refused.pop(signal or kind, None)
            return answer

        mirrored = self._mirrored(start, end, only, where, keys, fresh, view)
        here = {i for i, (kind, signal, _) in enumerate(jobs) if mirrored is not None and
                (kind in MIRRORED or (kind == "histogram" and (signal in thin or signal in mirrored[0].buckets)))}
        positions = [i for i in range(len(jobs)) if i not in here]  # of the jobs queried
        asked = [jobs[i] for i in positions]
        queried = self._combined(asked, run, end) if only is not None or where is not None else \
            self.client.map_as_completed(run, asked)
        at = end if mirrored is None else mirrored[0].at  # a window within the mirror's lag ends at its refresh
        answers = itertools.chain(((i, QueryResult(mirrored[0].answer(jobs[i][:2], at - w, at, mirrored[1], step,
                                                                      buckets=jobs[i][1] not in thin), []))
                                   for i in sorted(here) if mirrored is not None),
                                  ((positions[n], answer) for n, answer in queried))
        out: dict[TargetKey, TargetWindow] = {}

        def window(key: TargetKey) -> TargetWindow:
            tw = out.get(key)
            if tw is None:
                tw = out[key] = TargetWindow(start, end)
            return tw

        def model(key: TargetKey, name: str) -> ModelWindow:
            tw = window(key)
            m = tw.models.get(name)
            if m is None:
                m = tw.models[name] = ModelWindow()
            return m

        intervals: Any = None
        tgi_kv: Any = None
        ranks_answer: Any = None
        drops: Drops = {}
        drop = functools.partial(self._drop, drops)
        # Each answer is regrouped as soon as it arrives, while the other queries are still
        # running on the server; the ITL split last, as it keeps only models other answers found.
        for index, answer in answers:
            kind, signal, _ = jobs[index]
            if answer is None:
                continue  # refused as too large: the windows lack it
            if kind == "histogram":
                took = None if families is None else families.setdefault(signal, set())
                for key, per_model in self._pick(answer.data, "le", signal, drops, histogram=True, took=took).items():
                    for name, read in per_model.items():
                        model(key, name).histograms[signal] = _histogram(read, signal in thin)
            elif kind == "gauge":
                for key, per_model in self._pick(answer.data, STAT_LABEL, signal, drops).items():
                    for name, stats in per_model.items():
                        if {"last", "avg", "max"} <= stats.keys():
                            model(key, name).gauges[signal] = GaugeStats(stats["last"], stats["avg"], stats["max"])
            elif kind == "counter":
                for key, per_model in self._pick(answer.data, None, signal, drops).items():
                    for name, values in per_model.items():
                        if not math.isnan(values[""]):
                            model(key, name).rates[signal] = values[""]
            elif kind == "scrapes":
                for sample in answer.data:
                    key = key_of(sample.labels, self.target_labels)
                    if math.isfinite(sample.value) and sample.value >= 0:
                        window(key).scrapes = int(sample.value)
                    else:
                        self._drop(drops, key, "scrapes", "bad_count")
            elif kind == "restarts":  # one series per target and counter family: the most of them
                for sample in answer.data:
                    key = key_of(sample.labels, self.target_labels)
                    if math.isfinite(sample.value) and sample.value >= 0:
                        window(key).restarts = max(window(key).restarts or 0, round(sample.value))
                    else:
                        self._drop(drops, key, "restarts", "bad_count")
            elif kind == "tgi_kv":
                tgi_kv = answer  # after the gauges: an engine's own KV gauge wins
            elif kind == "ranks":
                ranks_answer = answer  # after the others: it keeps only models they found
            elif kind == "infos":
                for key, infos in _infos(answer.data, self.target_labels).items():
                    window(key).infos = infos
            else:
                intervals = answer
        if tgi_kv is not None:
            for key, kv in _tgi_kv(tgi_kv.data, self.target_labels).items():
                model(key, "").gauges.setdefault("kv_usage", kv)
        if ranks_answer is not None:
            for key, rank_models in _ranks(ranks_answer.data, self.target_labels, drop).items():
                for name, ranks in rank_models.items():
                    if len(ranks) > 1 and name in window(key).models:
                        model(key, name).ranks = dict(sorted(ranks.items()))
        if intervals is not None:
            for key, by_model in _itl_intervals(intervals.data, self.target_labels, drop).items():
                for name, intervals_of_model in by_model.items():
                    if name in window(key).models:
                        model(key, name).itl_intervals = intervals_of_model
        for key, counts in drops.items():
            window(key).dropped = dict(sorted(counts.items()))
        if keys is not None:  # the matchers select a superset when there are several target labels
            wanted = set(keys)
            out = {key: tw for key, tw in out.items() if key in wanted}
        out = dict(sorted(out.items()))  # answers arrive in any order; windows and models do not
        for tw in out.values():
            tw.models = dict(sorted(tw.models.items()))
            tw.overall = _overall(tw.models)
        return out

    def shared_end(self, now: float) -> float:
        """The raw samples' last refresh when it is at most their lag before ``now`` (a read of
        one target ending there is answered from them), else ``now``."""
        mirror = self.mirror
        if mirror is None or mirror.refused or mirror.time is None or not now - mirror.lag <= mirror.time <= now:
            return now
        return mirror.time

    def _mirrored(self, start: float, end: float, only: TargetKey | None, where: dict[str, str] | None,
                  keys: Collection[TargetKey] | None, fresh: bool = False, view: bool = False
                  ) -> tuple[Held, Wanted] | None:
        """The mirror's samples for a window read and which of its series the read takes (None:
        every job is queried). A read of one target or service, or a ``view``, never refreshes them
        (a full read for one target would cost more than its queries) and takes them only for a
        window that ended by their last read."""
        held = None if self.mirror is None else \
            self.mirror.view(start, end, refresh=only is None and where is None and not view, fresh=fresh)
        return None if held is None else (held, wanted_by(only, where, keys))

    def _combined(self, jobs: list[tuple[str, str, str]], run: Callable[[tuple[str, str, str]], Any], end: float
                  ) -> Iterable[tuple[int, Any]]:
        """The answers of :meth:`windows`' ``jobs`` for one target or one service: every instant
        query in one request (each branch tagged with its job, then split back), the range and
        raw-sample ones alone - a few requests instead of ~40, for the same series. Where the
        combined answer is refused as too large, each query is asked alone."""
        alone = ("itl_intervals", "tgi_kv")
        single = [i for i, (kind, _, _) in enumerate(jobs) if kind not in alone]
        others = [i for i, (kind, _, _) in enumerate(jobs) if kind in alone]
        text = union([_tag(jobs[i][2], JOB_LABEL, str(n)) for n, i in enumerate(single)])
        answer = None
        if single:
            try:
                answer = self.client.query(text, end)
            except PromAPIError as exc:
                if exc.kind != "too_large":
                    raise
        if answer is None:  # refused as too large (or nothing to combine): one by one
            yield from self.client.map_as_completed(run, jobs)
            return
        split: list[list[VectorSample]] = [[] for _ in single]
        for sample in answer.data:
            tag = sample.labels.get(JOB_LABEL, "")
            if tag.isdigit() and int(tag) < len(single):
                labels = {k: v for k, v in sample.labels.items() if k != JOB_LABEL}
                split[int(tag)].append(VectorSample(labels, sample.value))
        for n, i in enumerate(single):
            yield i, QueryResult(split[n], answer.warnings)
        for n, result in self.client.map_as_completed(run, [jobs[i] for i in others]):
            yield others[n], result

    def round_windows(self, start: float, end: float, signals: Sequence[str],
                      needs: Callable[[TargetKey, TargetWindow], Collection[str | TailProbe]],
                      groups: dict[TargetKey, list[TargetKey]] | None = None,
                      group_needs: Callable[[TargetKey, TargetWindow], Collection[str | TailProbe]] | None = None
                      ) -> dict[TargetKey, TargetWindow]:
        """A diagnosis round's windows, means first: every target's window with each histogram's
        ``_sum`` and ``_count`` only, then the buckets of the histograms ``needs(key, window)``
        names for that target (and, for each of ``groups`` - a service: its members' keys - those
        ``group_needs`` names for the members' windows merged), one query per histogram for all
        the targets that need it; a :class:`~app.window.TailProbe` first asks :meth:`at_most`, for
        the targets it names at once. Every number read is the one a full read gives; a histogram
        whose buckets nobody needed keeps ``means_only`` (its mean and count exact, no quantile)."""
        took: dict[str, set[int]] = {}  # a target's buckets are of the family its means came from
        windows = self.windows(start, end, signals, diagnosis=True, buckets=(), fresh=True, families=took)
        wanted: dict[str, set[TargetKey]] = defaultdict(set)
        probes: dict[TailProbe, set[TargetKey]] = defaultdict(set)

        def want(keys: list[TargetKey], needed: Collection[str | TailProbe]) -> None:
            for need in needed:
                (probes[need] if isinstance(need, TailProbe) else wanted[need]).update(keys)

        for key, tw in windows.items():
            want([key], needs(key, tw))
        if groups and group_needs is not None:
            for group, members in groups.items():
                present = {"\x00".join(k): windows[k] for k in members if k in windows}
                if present:
                    want([k for k in members if k in windows], group_needs(group, merge_windows(present, start, end)))
        for probe, probed in sorted(probes.items(), key=lambda item: repr(item[0])):
            maybe = self.at_most(probe.signal, start, end, probe.limits, probed)
            for signal in probe.then:
                wanted[signal].update(probed if maybe is None else maybe & probed)
        jobs = sorted((s, sorted(keys)) for s, keys in wanted.items() if s in HISTOGRAM_FAMILIES and s in signals)
        self.buckets_read = {signal: len(keys) for signal, keys in jobs}
        if not jobs:
            return windows
        held = self._mirrored(start, end, None, None, None, fresh=True)  # the view the means came from

        def run(job: tuple[str, list[TargetKey]]) -> Any:
            signal, keys = job
            if held is not None and signal in held[0].buckets:
                return QueryResult(held[0].buckets_over(signal, end - start,
                                                        wanted_by(None, None, keys)), [])
            try:
                return self.client.query(self._queries(None, None, keys).histogram(
                    signal, end - start, families=took.get(signal) or None), end)
            except PromAPIError as exc:
                if exc.kind != "too_large":
                    raise
                self._refuse(signal, exc.message)  # its targets keep the means
                return None

        drops: Drops = {}
        touched: set[TargetKey] = set()
        for (signal, keys), answer in zip(jobs, self.client.map(run, jobs), strict=True):
            if answer is None:
                continue
            asked = set(keys)
            for key, per_model in self._pick(answer.data, "le", signal, drops, histogram=True).items():
                if key not in windows or key not in asked:
                    continue
                tw = windows[key]
                for name, read in per_model.items():
                    if name in tw.models:
                        tw.models[name].histograms[signal] = _histogram(read)
                touched.add(key)
        for key in touched:
            windows[key].overall = _overall(windows[key].models)
        for key, counts in drops.items():
            if key in windows:
                merged = Counter(windows[key].dropped) + counts
                windows[key].dropped = dict(sorted(merged.items()))
        return windows

    def histograms_over(self, signal: str, windows: Sequence[float], end: float, threshold: float | None = None
                        ) -> list[dict[TargetKey, dict[str, WindowHistogram]]]:
        """Per window ending at ``end``: every target's ``signal`` histogram increase per model,
        one query per window for all targets (the SLOs' exact SLI, app/promsource/slo.py).
        ``threshold``: only the bucket at it is needed (with ``_sum`` and ``_count``), one series
        of ~20 a target, where an engine's layout seen before has that bound; the others read
        every bucket (their answer shows the bounds there are)."""
        q = self._queries(None, None)
        les = None if threshold is None else self._les_at(signal, threshold)
        answers = self.client.map(lambda w: self.client.query(q.histogram(signal, w, les=les), end), list(windows))
        return [self._histograms(answer.data, signal) for answer in answers]

    def histograms(self, signals: Sequence[str], start: float, end: float,
                   above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                   ) -> dict[str, dict[TargetKey, dict[str, WindowHistogram]]]:
        """Per signal: every target's histogram increase over ``[start, end]`` per model, one query
        per signal (an SLO condition's read). ``above``: signal -> (quantile, threshold) pairs; the
        buckets around the thresholds come first (:meth:`_around`): a target at or below every
        threshold is left out, one they tell exactly keeps them (model ``""``), the others' are
        read from ``L`` up (:meth:`_les_below`) or in full where the layout differs; buckets the
        mirror holds answer every target in full. Within the raw samples' lag the window ends at
        their refresh, computed once per refresh (the SLO alert rounds in between ask the same)."""
        held = self._mirrored(start, end, None, None, None)
        if held is None:
            return self._histograms_read(signals, start, end, above, None)
        at, limits = held[0].at, tuple(sorted((s, tuple(pairs)) for s, pairs in (above or {}).items()))
        return held[0].memo(("histograms", tuple(signals), at - (end - start), at, limits),
                            lambda: self._histograms_read(signals, at - (end - start), at, above, held))

    def _histograms_read(self, signals: Sequence[str], start: float, end: float,
                         above: Mapping[str, Sequence[tuple[float, float]]] | None, held: tuple[Held, Wanted] | None
                         ) -> dict[str, dict[TargetKey, dict[str, WindowHistogram]]]:
        asked = [s for s in signals if s in HISTOGRAM_FAMILIES]  # a signal no engine exports costs no query
        mine = {s for s in asked if held is not None and s in held[0].buckets}  # every bucket from the samples held
        around = {s: self._around(s, start, end, above[s]) for s in asked if above and above.get(s) and s not in mine}

        # per signal, the reads: (targets (None: all), le values not read), one query each
        jobs: list[tuple[str, set[TargetKey] | None, dict[int, str] | None]] = []
        for signal in asked:
            found = around.get(signal)
            if found is None:
                jobs.append((signal, None, None))
                continue
            upward = {key for key, a in found.items() if a.above and a.histogram is None and a.upward}
            rest = {key for key, a in found.items() if a.above and a.histogram is None and not a.upward}
            assert above is not None
            jobs += [(signal, keys, skip) for keys, skip in ((upward, self._les_below(signal, above[signal])),
                                                            (rest, None)) if keys]

        def read(job: tuple[str, set[TargetKey] | None, dict[int, str] | None]
                 ) -> dict[TargetKey, dict[str, WindowHistogram]]:
            signal, keys, skip = job
            if held is not None and signal in mine:
                return self._histograms(held[0].buckets_over(signal, end - start, held[1]), signal)
            answer = self.client.query(self._queries(None, None, keys).histogram(signal, end - start, skip_les=skip),
                                       end)
            return self._histograms(answer.data, signal)

        out: dict[str, dict[TargetKey, dict[str, WindowHistogram]]] = {signal: {} for signal in asked}
        for (signal, keys, _), found in zip(jobs, self.client.map(read, jobs), strict=True):
            out[signal].update({key: per_model for key, per_model in found.items() if keys is None or key in keys})
        for signal, found in around.items():
            out[signal].update({key: {"": a.histogram} for key, a in (found or {}).items()
                                if a.above and a.histogram is not None})
        return out

    def _histograms(self, samples: Sequence[AnswerSample], signal: str) -> dict[TargetKey, dict[str, WindowHistogram]]:
        """A histogram answer's series -> target -> model -> its window histogram."""
        return {key: {name: _histogram(b) for name, b in per_model.items()}
                for key, per_model in self._pick(samples, "le", signal, None, histogram=True).items()}

    def at_most(self, signal: str, start: float, end: float, limits: Sequence[tuple[float, float]],
                keys: Collection[TargetKey] | None = None) -> set[TargetKey] | None:
        """The targets whose ``signal`` quantile over ``[start, end]`` may be above its threshold
        for one of ``limits`` ((quantile, threshold) pairs), from a few buckets a target
        (:meth:`_around`; None: the bucket layout is not known yet, ask for every target)."""
        around = self._around(signal, start, end, limits, keys)
        return None if around is None else {key for key, a in around.items() if a.above}

    def _around(self, signal: str, start: float, end: float, limits: Sequence[tuple[float, float]],
                keys: Collection[TargetKey] | None = None) -> dict[TargetKey, Around] | None:
        """Per target, from the buckets around each threshold - the largest bound ``L`` at or below
        it, the smallest ``U`` at or above it - with ``+Inf``, ``_sum`` and ``_count`` (all models,
        the engine's first family): whether a quantile may be above its threshold, and the
        histogram of those buckets when it tells every quantile exactly (None: the other buckets
        are needed). A quantile whose rank ``L`` holds is at or below ``L``; one whose rank lies
        between ``L`` and ``U`` is the interpolation inside ``(L, U]`` that ``histogram_quantile``
        makes; above ``U`` it needs the buckets above. Exact because one target's bucket
        increases never decrease with the bound (one scrape gives its series the same timestamps,
        and an extrapolated ``increase`` grows with the counter's first value and its rise, both
        of which grow with the bound), so Prometheus' monotonicity fix changes nothing. ``keys``:
        only these targets; a family whose layout is not known yet makes its targets "may be
        above", with no histogram; None: no layout is known. A signal whose buckets the mirror
        holds is judged from them all, each target's quantiles computed."""
        held = self._mirrored(start, end, None, None, keys) if self.mirror and signal in self.mirror.buckets else None
        if held is not None and signal in held[0].buckets:
            return self._judged(signal, held[0], start, end, held[1], limits)
        families = HISTOGRAM_FAMILIES[signal]
        layouts = [self._layout(signal, i) for i in range(len(families))]
        if all(layout is None for layout in layouts):
            return None
        w = prom_duration(end - start)
        by = ", ".join(dict.fromkeys(self.target_labels))
        matchers = self._queries(None, None, keys).matchers
        parts, unknown = [], []
        around: dict[int, list[tuple[float | None, float]]] = {}  # family -> per limit (L, U), in seconds
        for i, (family, layout) in enumerate(zip(families, layouts, strict=True)):
            if layout is None:
                unknown.append(f"{family.name}_count")
                continue
            chosen = {"+Inf"}
            bounds = self._bounds(signal, i)
            around[i] = []
            for _, threshold in limits:
                below = [(bound, le) for bound, le in bounds if bound <= threshold]
                upper = next((bound, le) for bound, le in bounds if bound >= threshold)  # +Inf at last
                chosen.update([le for _, le in below[-1:]] + [upper[1]])
                around[i].append((below[-1][0] if below else None, upper[0]))
            sel = (*family.matchers, *matchers)
            bucket = _selector(family.name + "_bucket", (*sel, ("le", "=~", any_of(sorted(chosen)))), [])
            parts.append(_tag(f"sum by ({by}, le) (increase({bucket}[{w}]))", FAMILY_LABEL, str(i)))
            for part in ("sum", "count"):
                expr = f"sum by ({by}) (increase({_selector(f'{family.name}_{part}', sel, [])}[{w}]))"
                parts.append(_tag(_tag(expr, "le", part), FAMILY_LABEL, str(i)))
        if unknown:  # the targets with a histogram of such a family (not tagged: never a bucket)
            inner = format_matchers([("__name__", "=~", any_of(unknown)), *matchers])
            parts.append(f"group by ({by}) ({{{inner}}})")
        answer = self.client.query(union(parts), end)
        out: dict[TargetKey, Around] = {}
        for sample in answer.data:
            if "le" not in sample.labels:
                out[key_of(sample.labels, self.target_labels)] = Around(True)
        chosen_family: dict[TargetKey, int] = {}
        for sample in answer.data:
            index = _family(sample.labels, len(families))
            if "le" in sample.labels and index is not None:
                key = key_of(sample.labels, self.target_labels)
                chosen_family[key] = min(index, chosen_family.get(key, index))
        found = [sample for sample in answer.data if "le" in sample.labels]
        for key, per_model in self._pick(found, "le", signal, None, histogram=True).items():
            if key in out or (keys is not None and key not in keys) or "" not in per_model:
                continue
            h = _histogram(per_model[""])
            total = h.increases[-1] if h.bounds and h.bounds[-1] == math.inf else math.nan
            if not total > 0:
                continue  # no observation in the window: no quantile
            out[key] = judge_around(h, total, limits, around[chosen_family[key]])
        return out

    def _judged(self, signal: str, held: Held, start: float, end: float, wanted: Wanted,
                limits: Sequence[tuple[float, float]]) -> dict[TargetKey, Around]:
        """:meth:`_around` from every bucket the mirror holds: each target's histogram (all models
        summed) over the window as the view has it, and whether a quantile of ``limits`` is above
        its threshold."""
        data = held.buckets_over(signal, end - start, wanted)
        out = {}
        for key, per_model in self._pick(data, "le", signal, None, histogram=True).items():
            found = judge_histogram(quantiles.merge(_histogram(per_model[name]) for name in sorted(per_model)), limits)
            if found is not None:
                out[key] = found
        return out

    def _les_at(self, signal: str, threshold: float) -> dict[int, str]:
        """Per candidate family whose layout is known and has a bucket at ``threshold`` (in
        seconds, matched as the SLO matches it), a regex of its ``le`` values there."""
        out = {}
        for i in range(len(HISTOGRAM_FAMILIES[signal])):
            at = sorted(le for bound, le in self._bounds(signal, i) if bound_index([bound], threshold) is not None)
            if at:
                out[i] = any_of(at)
        return out

    def _les_below(self, signal: str, limits: Sequence[tuple[float, float]]) -> dict[int, str]:
        """Per candidate family whose layout is known, a regex of its ``le`` values below the
        largest bound ``L`` at or below the lowest threshold of ``limits``: the buckets a target
        whose buckets ``L`` and ``U`` are this layout's (:meth:`_around`, ``upward``) does not
        need. A quantile of it at or below ``L`` stays at or below every threshold, whatever the
        buckets below say; one above ``L`` lies in a bucket whose lower bound is read too (every
        bound from ``L`` up is: one the layout has not seen yet is not skipped), so
        ``histogram_quantile`` gives it exactly as over every bucket (one target's increases never
        decrease with the bound). A family without such ``L`` skips none."""
        lowest = min(threshold for _, threshold in limits)
        out = {}
        for i in range(len(HISTOGRAM_FAMILIES[signal])):
            bounds = self._bounds(signal, i)
            below = [bound for bound, _ in bounds if bound <= lowest]
            skipped = [le for bound, le in bounds if below and bound < below[-1]]
            if skipped:
                out[i] = any_of(skipped)
        return out

    def _bounds(self, signal: str, family: int) -> list[tuple[float, str]]:
        """One family's known layout (:meth:`_layout`) as (bound in seconds, ``le``), ascending;
        empty before its first bucket answer."""
        scale = HISTOGRAM_FAMILIES[signal][family].scale
        return sorted((_bound(le) / scale, le) for le in self._layout(signal, family) or ())

    def _layout(self, signal: str, family: int) -> set[str] | None:
        """The ``le`` values this source's ``signal`` histograms of one family have had in any
        bucket answer (None before the first)."""
        with self._lock:
            found = self._layouts.get((signal, family))
            return None if found is None else set(found)

    def first_seen(self, signal: str, span: float, end: float) -> dict[TargetKey, float]:
        """Per target, when its ``signal`` histogram first has a sample in the ``span`` before
        ``end`` (at most :data:`FIRST_SEEN_STEP` late; earliest over the engines' names): where
        the server's data of a long SLO period begins."""
        answer = self.client.query(self._queries(None, None).first_seen(signal, span, FIRST_SEEN_STEP), end)
        out: dict[TargetKey, float] = {}
        for sample in answer.data:
            key = key_of(sample.labels, self.target_labels)
            if math.isfinite(sample.value):
                out[key] = min(out.get(key, sample.value), sample.value)
        return out

    def quantile_series(self, signal: str, q: float | None, first: float, end: float, step: float,
                        lookback: float, only: TargetKey | None, model: str | None = None,
                        where: dict[str, str] | None = None) -> list[dict]:
        """``histogram_quantile(q, sum by (le) (increase(x_bucket[lookback])))`` every ``step`` from
        ``first`` to ``end`` for one target, from one range query of the buckets (``q=None``: the
        mean). Same points as the built-in store's :func:`app.store.reads.quantile_series`."""
        return [series_point(t, merged, q)
                for t, merged in self.histogram_series(signal, first, end, step, lookback, only, model, where)]

    def histogram_series(self, signal: str, first: float, end: float, step: float, lookback: float,
                         only: TargetKey | None, model: str | None = None, where: dict[str, str] | None = None
                         ) -> list[tuple[float, WindowHistogram | None]]:
        """One target's (``only``; ``where``: the replicas with these label values, summed) ``signal``
        histogram over the ``lookback`` before each time ``first + k * step`` up to ``end``, all its
        models summed by ``le`` (``model``: that model's), from one range query of the buckets."""
        q_text = self._queries(only, where).histogram(signal, lookback)
        answer = self.client.query_range(q_text, first, end, step)
        n = int(math.floor((end - first) / step + 1e-9)) + 1
        # target -> family -> point index -> model -> {le: value}; per target its first family, then summed
        grouped: dict[TargetKey, dict[int, dict[int, dict[str, dict[str, float]]]]] = defaultdict(dict)
        families = HISTOGRAM_FAMILIES[signal]
        for series in answer.data:
            key = key_of(series.labels, self.target_labels)
            family, le = _family(series.labels, len(families)), series.labels.get("le", "")
            if family is None or not _valid_le(le):
                self._drop(None, key, signal, "bad_label" if family is None else "bad_bound")
                continue
            by_index = grouped[key].setdefault(family, defaultdict(dict))
            name = series.labels.get(MODEL_LABEL, "")
            for t, value in series.points:
                k = round((t - first) / step)
                if 0 <= k < n and abs(first + k * step - t) < 0.002:  # the server answers at millisecond times
                    by_index[k].setdefault(name, {})[le] = value
        chosen = [{k: {m: _rescaled(b, families[min(by_family)].scale) for m, b in per_k.items()}
                   for k, per_k in _first_family(by_family).items()} for _, by_family in sorted(grouped.items())]
        return [(first + k * step,
                 quantiles.merge(_histogram(b) for by_index in chosen
                                 for m, b in sorted(by_index.get(k, {}).items()) if model in (None, m)))
                for k in range(n)]

    def first_samples(self, signals: Sequence[str], span: float, end: float, only: TargetKey | None,
                      where: dict[str, str] | None = None) -> dict[str, float]:
        """Per signal of ``signals`` that one target (``only``; ``where``: the replicas with these
        label values) exports: its first histogram sample in the ``span`` before ``end`` (at most
        one step of ``span / 120`` late), in one query. A signal absent from the answer has no
        series in the span."""
        step = max(15.0, span / 120)
        asked = [s for s in signals if s in HISTOGRAM_FAMILIES]
        if not asked:
            return {}
        q = self._queries(only, where)
        text = union([_tag_signal(f"({q.first_seen(s, span, step)})", s) for s in asked])
        out: dict[str, float] = {}
        for sample in self.client.query(text, end).data:
            signal = sample.labels.get(SIGNAL_LABEL, "")
            if signal not in asked:
                self._drop(None, key_of(sample.labels, self.target_labels), signal, "bad_label")
                continue
            if math.isfinite(sample.value):
                out[signal] = min(out.get(signal, sample.value), sample.value)
        return out

    def _pick(self, samples: Sequence[AnswerSample], sub_label: str | None, signal: str, drops: Drops | None, *,
              histogram: bool = False, took: set[int] | None = None) -> dict[TargetKey, dict[str, dict[str, float]]]:
        """Samples of ``signal``'s query -> target -> model -> {sub label value: value}, from the
        first family (engine name, newest first) that answered for the target (added to ``took``);
        a ``histogram``'s buckets in seconds whatever the unit of the family chosen. A series whose
        family tag or bucket bound is not valid is dropped (counted in ``drops``)."""
        grouped: dict[TargetKey, dict[int, dict[str, dict[str, float]]]] = {}
        names = self.target_labels
        families = HISTOGRAM_FAMILIES[signal] if histogram else \
            GAUGE_FAMILIES[signal] if sub_label == STAT_LABEL else COUNTER_FAMILIES[signal]
        # an answer repeats a few family tags and bucket bounds over every target: each read once
        family_of: dict[str, int | None] = {}
        bound_ok: dict[str, bool] = {}
        for sample in samples:
            labels = sample.labels
            key = tuple([labels.get(name, "") for name in names])
            tag = labels.get(FAMILY_LABEL, "0")
            if tag not in family_of:
                family_of[tag] = _family({FAMILY_LABEL: tag}, len(families))
            family = family_of[tag]
            sub = labels.get(sub_label, "") if sub_label else ""
            if histogram and sub not in bound_ok:
                bound_ok[sub] = _valid_le(sub)
            if family is None or (histogram and not bound_ok[sub]):
                self._drop(drops, key, signal, "bad_label" if family is None else "bad_bound")
                continue
            by_family = grouped.get(key)
            if by_family is None:
                by_family = grouped[key] = {}
            per_model = by_family.get(family)
            if per_model is None:
                per_model = by_family[family] = {}
            name = labels.get(MODEL_LABEL, "")
            subs = per_model.get(name)
            if subs is None:
                subs = per_model[name] = {}
            subs[sub] = sample.value
        if took is not None:
            took.update(min(by_family) for by_family in grouped.values())
        if not histogram:
            return {key: _first_family(by_family) for key, by_family in grouped.items()}
        seen: dict[int, set[str]] = defaultdict(set)
        for by_family in grouped.values():
            for family, per_model in by_family.items():
                for subs in per_model.values():
                    seen[family].update(subs)
        with self._lock:
            for family, les in seen.items():
                les.difference_update(("sum", "count"))
                if les:
                    self._layouts.setdefault((signal, family), set()).update(les)
        return {key: {name: _rescaled(buckets, families[min(by_family)].scale)
                      for name, buckets in _first_family(by_family).items()} for key, by_family in grouped.items()}


__all__ = ["SourceTargets", "GAUGE_FAMILIES", "SourceReader", "TargetKey"]
