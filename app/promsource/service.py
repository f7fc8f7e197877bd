"""The running Prometheus sources: their clients, their targets, their status.

Each diagnosis round asks every source for its current targets (``discover``) and for all
their windows at once (``windows``), then keeps the targets table in step: a new replica
gets a row within one round, a replica whose series stopped is marked gone (no "target down"
for it), a replica Prometheus scrapes with ``up == 0`` is down. A source that cannot be read
changes nothing: its targets keep their last verdict (stale), no finding resolves or fires
for lack of data, and its status says why (``GET /api/v1/sources``, ``/readyz``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.orm import Session, sessionmaker

from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.latency import LABELLED_ROLE_INFO, pd_role
from app.promql.client import PromAPIError, PrometheusClient
from app.promsource import intervals
from app.promsource.config import PrometheusSourceConfig
from app.promsource.queries import NATIVE_NAMES
from app.promsource.reader import SourceReader, SourceTargets, TargetKey
from app.promsource.status import SourceStatus
from app.sources.base import HISTOGRAM_SIGNALS, CanonicalInfo
from app.store.models import SERVICE_KIND, SOURCE_KIND, Target, TargetView
from app.store.record import ScrapeRecord
from app.targets import repository as target_repository
from app.window import TailProbe, TargetWindow, merge_windows

log = logging.getLogger(__name__)
_Answer = TypeVar("_Answer")
#: (target name, engine, its means-first window) -> the histograms whose buckets it needs
BucketNeeds = Callable[[str, str, TargetWindow], Collection[str | TailProbe]]
_Value = TypeVar("_Value")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
MAX_NAME = 63


def target_name(source: str, key: TargetKey) -> str:
    """A stable, URL-safe target name from the source name and the target label values, one
    name per value tuple: ``prod.llm.vllm-0`` when every value is plain (letters, digits, ``_``,
    ``-``; no ``.``), so the values read back from it; otherwise the values made safe (``_`` for
    the rest) plus a segment hashing the exact values, ``prod.llm.x_y.3f9a0c51d2`` (a tuple with
    one more segment than a plain one's, so the two forms never meet). Names past 63 characters
    keep a prefix and a hash of the full name."""
    if all(_PLAIN.fullmatch(v) for v in key):
        full = ".".join([source, *key])
    else:
        exact = hashlib.sha256("\x00".join(key).encode()).hexdigest()[:10]
        full = ".".join([source, *(_UNSAFE.sub("_", v) or "_" for v in key), exact])
    if len(full) <= MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[:MAX_NAME - 11]}.{digest}"


def named(source: str, keys: Iterable[TargetKey], what: str) -> dict[str, TargetKey]:
    """:func:`target_name` of each key; a name two keys would share (a hash collision, or two
    sources whose names and values line up) is refused for the second, never merged."""
    out: dict[str, TargetKey] = {}
    for key in keys:
        name = target_name(source, key)
        if out.setdefault(name, key) != key:
            log.warning("source %s: two %s would be named %s; the second is left out", source, what, name)
    return out


def public_url(url: str) -> str:
    """The source URL without user info: it is shown to every API reader."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def labelled_role(config: PrometheusSourceConfig, labels: dict[str, str] | None) -> list[CanonicalInfo]:
    """The target's ``pd_role_label`` value as an info, so the P/D role (:func:`app.latency.pd_role`)
    reads it like the engine's own configuration: the diagnosis, the latency API and the pairing
    see the same role. Empty when the source has no such label or the target no value."""
    value = (labels or {}).get(config.pd_role_label or "")
    if not config.pd_role_label or not value:
        return []
    return [CanonicalInfo(LABELLED_ROLE_INFO, "", "0", {"pd_role": value, "label": config.pd_role_label})]


def with_labelled_role(config: PrometheusSourceConfig, labels: dict[str, str] | None,
                       window: TargetWindow | None) -> TargetWindow | None:
    """``window`` (when there is one) with :func:`labelled_role` among its infos."""
    if window is not None:
        window.infos = [*window.infos, *labelled_role(config, labels)]
    return window


def native_alone(found: SourceTargets, windows: Mapping[TargetKey, TargetWindow]) -> dict[str, int]:
    """Per histogram name, the replicas (engines found) that hold it as a native histogram and lack a
    signal it carries in their window (no classic ``_sum``/``_count`` beside it): what the round did not read."""
    out: Counter[str] = Counter()
    for key, names in found.native.items():
        if key not in found.engines:
            continue  # not an engine's series: no replica lacks it
        window = windows.get(key)
        read = window.overall.histograms if window is not None else {}
        out.update(name for name in names if any(signal not in read for signal in NATIVE_NAMES[name]))
    return dict(sorted(out.items()))


class SourceMissing(LookupError):
    """A discovered target whose source is no longer in the configuration."""


@dataclass(slots=True)
class SourceTarget:
    """One discovered target in a round: its row id and name, engine, and its window (None
    when its series stopped within the window and it is now down)."""

    id: int
    name: str
    engine: str
    window: TargetWindow | None
    kind: str = SOURCE_KIND  # or SERVICE_KIND


@dataclass(slots=True)
class SourceRound:
    source: str
    ok: bool
    targets: list[SourceTarget] = field(default_factory=list)


class PrometheusSource:
    """One configured source: a client, a reader and the source's status."""

    def __init__(self, config: PrometheusSourceConfig, mirror_lag: float | None = 0.0) -> None:
        self.config = config
        self.client = PrometheusClient(
            config.url, headers=dict(config.headers), bearer_token=config.bearer_token(),
            basic_auth=config.basic_credentials(), ca_file=config.tls.ca_file,
            insecure_skip_verify=config.tls.insecure_skip_verify, timeout=config.query_timeout,
            max_concurrency=config.max_concurrency, max_series=config.max_series, max_samples=config.max_samples)
        self.reader = SourceReader(self.client, config.target_labels, config.selector, config.service_labels,
                                   mirror_lag, config.hold_buckets)
        self.status = SourceStatus(config.name, config.kind, public_url(config.url), list(config.target_labels))
        self.keys: dict[str, TargetKey] = {}  # target name -> label values, for on-demand reads
        self.interval = intervals.configured(config.scrape_interval) if config.scrape_interval is not None \
            else intervals.ScrapeInterval(None, "", "not asked yet: no engine discovered")
        self.status.scrape_interval, self.status.scrape_interval_origin = self.interval.seconds, self.interval.origin
        self.status.scrape_interval_note = self.interval.note
        self.interval_asked: float | None = None  # when the server was last asked for it
        self.window = 60.0  # the diagnosis window of the last round
        self._told: tuple[float, float | None] | None = None  # (window, interval) the log last told

    def learn_interval(self, found: SourceTargets, now: float) -> None:
        """Ask the server for the engines' scrape interval, when none is configured, engines
        were discovered and the last answer is older than :data:`intervals.REFRESH`."""
        if self.config.scrape_interval is not None or not found.engines:
            return
        if self.interval_asked is not None and 0.0 <= now - self.interval_asked < intervals.REFRESH:
            return
        self.interval_asked = now
        self.interval = intervals.learn(self.client, self.config.target_labels, found.engines.keys())
        self.status.scrape_interval = self.interval.seconds
        self.status.scrape_interval_origin, self.status.scrape_interval_note = self.interval.origin, self.interval.note

    def fit_window(self, window: float) -> float:
        """The diagnosis window of this source's targets (``diagnosis.window``, at least
        ``window_intervals`` scrape intervals); its status says why, and the log once per change."""
        self.window = self.config.fitted_window(window, self.interval.seconds)
        status = self.status
        status.scrape_interval, status.diagnosis_window = self.interval.seconds, self.window
        status.scrape_interval_origin, status.scrape_interval_note = self.interval.origin, self.interval.note
        status.window_note = intervals.window_note(window, self.window, self.interval, self.config.window_intervals)
        if self._told != (window, self.interval.seconds) and self.interval.seconds is not None:
            self._told = (window, self.interval.seconds)
            log.info("source %s: %s", self.config.name, status.window_note)
        return self.window

    def key_of(self, target: TargetView) -> TargetKey:
        key = self.keys.get(target.name)
        if key is None:
            key = tuple(target.labels.get(name, "") for name in self.config.target_labels)
        return key

    def close(self) -> None:
        self.client.close()


class SourceService:
    """All configured sources; thread-safe for the round thread and API threads."""

    def __init__(self, on_view: Callable[[str, bool, float], None] | None = None,
                 mirror_lag: float | None = 0.0) -> None:
        """``on_view(target, up, ts)`` is told each live replica's ``up`` every round (self-metrics);
        ``mirror_lag``: each source's :class:`~app.promsource.mirror.SampleMirror` lag (None: none)."""
        self.on_view = on_view
        self.mirror_lag = mirror_lag
        self.sources: dict[str, PrometheusSource] = {}
        self._lock = threading.Lock()
        self._reused: dict[Hashable, tuple[float, object]] = {}

    def configure(self, configs: Sequence[PrometheusSourceConfig]) -> None:
        with self._lock:
            self._reused.clear()
            wanted = {c.name: c for c in configs}
            for name in list(self.sources):
                if name not in wanted or wanted[name] != self.sources[name].config:
                    self.sources.pop(name).close()
            for name, config in wanted.items():
                if name not in self.sources:
                    self.sources[name] = PrometheusSource(config, self.mirror_lag)

    def get(self, name: str | None) -> PrometheusSource | None:
        return None if name is None else self.sources.get(name)

    def statuses(self) -> list[SourceStatus]:
        for source in list(self.sources.values()):
            source.status.bad_series = dict(sorted(source.reader.bad_series.items()))
            source.status.refused = dict(sorted(source.reader.refused.items()))
            mirror = source.reader.mirror
            source.status.held_series = 0 if mirror is None else mirror.series_held()
            source.status.held_refreshed_at = None if mirror is None else mirror.time
            source.status.held_note = "off: every window is queried" if mirror is None else \
                f"off: {mirror.refused}; its rounds query instead" if mirror.refused else \
                "; ".join(f"{signal} buckets not kept ({why}): queried"
                          for signal, why in sorted(mirror.refused_buckets.items()))
        return [s.status for s in self.sources.values()]

    def close(self) -> None:
        with self._lock:
            for source in self.sources.values():
                source.close()
            self.sources.clear()

    # ------------------------------------------------------------------ the round
    def round(self, sessions: sessionmaker[Session], now: float, window: float, signals: Sequence[str],
              needs: BucketNeeds | None = None) -> list[SourceRound]:
        """Discover and read every source once; update targets; a failing source changes nothing.
        ``needs(target name, engine, window)``: the histograms whose buckets a target's means-first
        window needs (:meth:`SourceReader.round_windows`); None reads every bucket."""
        return [self._round_one(source, sessions, now, window, signals, needs)
                for source in list(self.sources.values())]

    def _round_one(self, source: PrometheusSource, sessions: sessionmaker[Session], now: float, window: float,
                   signals: Sequence[str], needs: BucketNeeds | None = None) -> SourceRound:
        status = source.status
        started, queries_before, bytes_before = time.monotonic(), source.client.queries, source.client.bytes_read
        try:
            found = source.reader.discover(now)
            source.learn_interval(found, now)
            window = source.fit_window(window)
            source.reader.scrape_interval = source.interval.seconds or 0.0
            if needs is None:
                windows = source.reader.windows(now - window, now, signals, diagnosis=True)
            else:
                windows = self._means_first(source, found, now, window, signals, needs)
        except PromAPIError as exc:
            status.last_error, status.last_error_at = f"{exc.kind}: {exc.message}", now
            status.last_round_ok = False
            status.queries_last_round = source.client.queries - queries_before
            status.last_round_seconds = time.monotonic() - started
            log.warning("source %s: %s", source.config.name, status.last_error)
            return SourceRound(source.config.name, False)
        result = SourceRound(source.config.name, True)
        with sessions.begin() as session:
            result.targets = self._sync(source, session, found, windows, now)
        status.last_success, status.queries_last_round = now, source.client.queries - queries_before
        status.bytes_last_round = source.client.bytes_read - bytes_before
        status.buckets_last_round = dict(source.reader.buckets_read) if needs is not None else {}
        status.last_round_ok = True
        status.last_round_seconds = time.monotonic() - started
        status.targets = sum(1 for t in result.targets if t.kind == SOURCE_KIND)
        live_keys = set(source.keys.values())
        status.down = sum(1 for key, up in found.up.items() if up == 0 and key in live_keys)
        native = native_alone(found, windows)
        told = native.keys() != status.native_histograms.keys()  # told again when the histograms change
        status.native_histograms = native
        if told and native:
            log.warning("source %s: %s", source.config.name, status.native_note())
        return result

    @staticmethod
    def _means_first(source: PrometheusSource, found: SourceTargets, now: float, window: float,
                     signals: Sequence[str], needs: BucketNeeds) -> dict[TargetKey, TargetWindow]:
        """The round's windows read means first, with the buckets ``needs`` names per replica
        and per service (named as :meth:`_sync` and :meth:`_sync_services` name them)."""
        config = source.config
        groups: dict[TargetKey, list[TargetKey]] = {}
        if config.service_labels:
            for key, values in found.service.items():
                group = tuple(values.get(name, "") for name in config.service_labels)
                if "" not in group:  # a pod lacking a service label is in no service (_sync_services)
                    groups.setdefault(group, []).append(key)

        def replica(key: TargetKey, w: TargetWindow) -> Collection[str | TailProbe]:
            return needs(target_name(config.name, key), found.engines.get(key) or "vllm", w)

        def service(values: TargetKey, w: TargetWindow) -> Collection[str | TailProbe]:
            engine = sorted({found.engines.get(k) or "vllm" for k in groups[values]})[0]
            return needs(target_name(f"{config.name}.svc", values), engine, w)

        return source.reader.round_windows(now - window, now, signals, replica, groups, service)

    def _sync(self, source: PrometheusSource, session: Session, found: SourceTargets,
              windows: dict[TargetKey, TargetWindow], now: float) -> list[SourceTarget]:
        config = source.config
        known = {t.name: t for t in target_repository.list_targets(session)
                 if t.source == SOURCE_KIND and t.origin == config.name}
        keys = named(config.name, found.engines, "targets")
        # A known replica that Prometheus still scrapes but that answers up == 0 is down, not gone.
        for name, row in known.items():
            key = source.key_of(row)
            if name not in keys and found.up.get(key) == 0:
                keys[name] = key
        wanted: dict[str, dict] = {}
        for name, key in keys.items():
            engine = found.engines.get(key) or (known[name].detected_engine if name in known else None) or "vllm"
            labels = dict(zip(config.target_labels, key))
            service = found.service.get(key)
            if service is None and name in known:  # down: keep the service it had
                service = {k: known[name].labels.get(k, "") for k in config.service_labels}
            labels.update(service or {})
            wanted[name] = {"url": public_url(config.url), "engine": engine, "detected_engine": engine,
                            "labels": labels}
        live = target_repository.sync_discovered_targets(session, SOURCE_KIND, config.name, wanted, now)
        source.keys = {name: keys[name] for name in live}
        source.status.gone = sum(1 for t in known.values() if t.name not in live)
        views, out = [], []
        for name, row in live.items():
            key = keys[name]
            down = found.up.get(key) == 0
            views.append(ScrapeRecord(row.id, now, not down, 0.0, engine=row.detected_engine,
                                      error_class="down" if down else None,
                                      error="the source's Prometheus reports up == 0 for this target" if down
                                      else None))
            out.append(SourceTarget(row.id, name, row.detected_engine or "vllm",
                                    with_labelled_role(config, row.labels, windows.get(key))))
            if self.on_view is not None:
                self.on_view(name, not down, now)
        target_repository.record_source_view(session, views)
        if config.service_labels:
            out += self._sync_services(source, session, out, {row.id: row for row in live.values()}, now)
        return out

    def _sync_services(self, source: PrometheusSource, session: Session, replicas: list[SourceTarget],
                       rows: dict[int, Target], now: float) -> list[SourceTarget]:
        """One target per distinct ``service_labels`` value set of the live replicas (``rows``: their
        rows by id): their windows merged (:func:`app.window.merge_windows`), each replica's kept
        for the comparison. A replica without a value for every one of those labels (a pod a
        PodMonitor scrapes has no ``service``) is in no service: it stays a replica target, and
        the status counts it. A service whose replicas run different engines is one target all
        the same, its engine the first of theirs by name (sglang, tgi, trtllm, vllm)."""
        config = source.config
        groups: dict[TargetKey, list[SourceTarget]] = {}
        lacking: dict[str, int] = {}
        unlabelled = 0
        for replica in replicas:
            labels = rows[replica.id].labels
            values = tuple(labels.get(name, "") for name in config.service_labels)
            if "" in values:  # Prometheus has no empty label: the pod lacks it
                unlabelled += 1
                for name, value in zip(config.service_labels, values):
                    if not value:
                        lacking[name] = lacking.get(name, 0) + 1
                continue
            groups.setdefault(values, []).append(replica)
        source.status.unlabelled, source.status.unlabelled_by_label = unlabelled, dict(sorted(lacking.items()))
        names = named(f"{config.name}.svc", groups, "services")
        wanted = {}
        for name, values in names.items():
            engines = sorted({m.engine for m in groups[values]})
            wanted[name] = {"url": public_url(config.url), "engine": engines[0], "detected_engine": engines[0],
                            "labels": dict(zip(config.service_labels, values))}
        live = target_repository.sync_discovered_targets(session, SERVICE_KIND, config.name, wanted, now)
        out = []
        for name, values in names.items():
            members = groups[values]
            row = live.get(name)
            if row is None:
                continue
            windows = {m.name: m.window for m in members if m.window is not None}
            merged = merge_windows(windows, now - source.window, now) if windows else None
            out.append(SourceTarget(row.id, name, row.detected_engine or "vllm", merged, SERVICE_KIND))
        source.status.services = len(out)
        return out

    # ------------------------------------------------------------------ on demand
    def window(self, target: TargetView, start: float, end: float, signals: Sequence[str] = HISTOGRAM_SIGNALS,
               diagnosis: bool = False, buckets: Collection[str] | None = None) -> TargetWindow:
        """One discovered target's window, for the latency API or a diagnosis of a range
        (``diagnosis``: successful scrapes too; ``buckets``: the histograms whose buckets are read,
        None: all; raises PromAPIError)."""
        source = self.get(target.origin)
        if source is None:
            raise SourceMissing(f"source {target.origin!r} is not configured")
        if target.source == SERVICE_KIND:
            where = {name: target.labels.get(name, "") for name in source.config.service_labels}
            windows = source.reader.windows(start, end, signals, diagnosis=diagnosis, where=where, buckets=buckets)
            return merge_windows({target_name(source.config.name, key): w for key, w in windows.items()}, start, end)
        key = source.key_of(target)
        return with_labelled_role(source.config, target.labels,
                                  source.reader.windows(start, end, signals, diagnosis=diagnosis, only=key,
                                                        buckets=buckets).get(key)) \
            or TargetWindow(start, end)

    def prefill_of(self, session: Session, target: TargetView, start: float, end: float
                   ) -> tuple[list[str], TargetWindow] | None:
        """The prefill side of a decode replica's P/D deployment: the replicas of its source that
        share its ``pd_pair_labels`` values and whose role (:func:`app.latency.pd_role`) is
        prefill, their names and their windows merged (several prefill replicas serve one
        decode pool, so their requests are summed like a service's). None when the source pairs
        nothing or the deployment has no prefill replica. Raises PromAPIError."""
        source = self.get(target.origin)
        if source is None or target.source != SOURCE_KIND or not source.config.pd_pair_labels:
            return None
        config = source.config
        where = {name: (target.labels or {}).get(name, "") for name in config.pd_pair_labels}
        peers = {source.key_of(row): row for row in target_repository.list_targets(session)
                 if row.source == SOURCE_KIND and row.origin == config.name and row.id != target.id
                 and all((row.labels or {}).get(k, "") == v for k, v in where.items())}
        if not peers:
            return None
        prefill: dict[str, TargetWindow] = {}
        for key, window in source.reader.windows(start, end, HISTOGRAM_SIGNALS, where=where).items():
            row = peers.get(key)
            if row is None:
                continue
            window.infos = [*window.infos, *labelled_role(config, row.labels)]
            role = pd_role(window.infos, {*window.overall.histograms, *window.overall.rates},
                           row.detected_engine or "vllm")
            if role is not None and role.role == "prefill":
                prefill[row.name] = window
        return (sorted(prefill), merge_windows(prefill, start, end)) if prefill else None

    def shared_end(self, target: TargetView, now: float) -> float:
        """:meth:`SourceReader.shared_end` of ``target``'s source (``now`` for none)."""
        source = self.get(target.origin) if target.source in (SOURCE_KIND, SERVICE_KIND) else None
        return now if source is None else source.reader.shared_end(now)

    def windows_of(self, targets: Sequence[TargetView], start: float, end: float,
                   signals: Sequence[str]) -> dict[int, TargetWindow]:
        """Windows of many discovered targets (the status page's fleet table), by target id: one
        set of queries per source, not per target. A source that cannot answer (or is no longer
        configured) contributes nothing; its targets simply have no numbers."""
        return self.windows_and_failures(targets, start, end, signals)[0]

    def windows_and_failures(self, targets: Sequence[TargetView], start: float, end: float,
                             signals: Sequence[str], diagnosis: bool = False, histograms_only: bool = False,
                             buckets: Sequence[str] | None = None, scalars: Collection[str] | None = None,
                             view: bool = False) -> tuple[dict[int, TargetWindow], set[int]]:
        """:meth:`windows_of`, plus the ids of the targets whose source could not answer: their
        numbers are unknown, not absent (an alert on them must neither fire nor resolve).
        ``view``: a read for a reader, exact at ``end`` (:meth:`SourceReader.windows`)."""
        return self._per_source(targets, lambda source: source.reader.windows(
                                    start, end, signals, diagnosis=diagnosis, histograms_only=histograms_only,
                                    buckets=buckets, scalars=scalars, view=view),
                                lambda source, target, windows: with_labelled_role(
                                    source.config, target.labels, windows.get(source.key_of(target))), "windows")

    def histograms_of(self, targets: Sequence[TargetView], start: float, end: float, signals: Sequence[str],
                      above: Mapping[str, Sequence[tuple[float, float]]] | None = None
                      ) -> tuple[dict[int, dict[str, WindowHistogram | None]], set[int]]:
        """Per replica of ``targets`` (ids), its histograms of ``signals`` over ``[start, end]``, all
        its models summed by ``le`` (one query per signal and source), and the ids whose source
        could not answer."""
        Answers = dict[str, dict[TargetKey, dict[str, WindowHistogram]]]

        def pick(source: PrometheusSource, target: TargetView, answers: Answers
                 ) -> dict[str, WindowHistogram | None] | None:
            key = source.key_of(target)
            found = {signal: quantiles.merge(by_model[name] for name in sorted(by_model))
                     for signal, answer in answers.items() if (by_model := answer.get(key))}
            return found or None

        return self._per_source([t for t in targets if t.source == SOURCE_KIND],
                                lambda source: source.reader.histograms(signals, start, end, above), pick, "histograms")

    def histograms_over(self, targets: Sequence[TargetView], signal: str, windows: Sequence[float], end: float,
                        threshold: float | None = None) -> tuple[dict[int, list[dict[str, WindowHistogram]]], set[int]]:
        """Per replica of ``targets`` (ids), its ``signal`` histogram per model over each of
        ``windows`` ending at ``end`` (one query per source and window; ``threshold``: the bucket
        at it is the only one needed), and the ids whose source could not answer."""
        return self._per_source([t for t in targets if t.source == SOURCE_KIND],
                                lambda source: source.reader.histograms_over(signal, windows, end, threshold),
                                lambda source, target, answers: [a.get(source.key_of(target), {}) for a in answers],
                                "SLO histograms")

    def first_seen(self, targets: Sequence[TargetView], signal: str, span: float, end: float
                   ) -> tuple[dict[int, float], set[int]]:
        """Per replica of ``targets`` (ids), when its ``signal`` histogram first has a sample in
        the ``span`` before ``end`` (one query per source), and the ids whose source could not
        answer."""
        return self._per_source([t for t in targets if t.source == SOURCE_KIND],
                                lambda source: source.reader.first_seen(signal, span, end),
                                lambda source, target, answer: answer.get(source.key_of(target)),
                                "data coverage")

    def reused(self, key: Hashable, now: float, max_age: float, compute: Callable[[], _Value],
               keep: Callable[[_Value], bool]) -> tuple[float, _Value]:
        """``compute()``'s answer for ``key`` and when it was asked, reused while younger than
        ``max_age``: for questions over long periods that every alert round and every API
        request would otherwise send again (an SLO's 28 d period). An answer ``keep`` refuses
        (a source failed) is not reused; the memo is cleared when the sources change."""
        with self._lock:
            hit = self._reused.get(key)
            if hit is not None and 0.0 <= now - hit[0] < max_age:
                return hit  # type: ignore[return-value]
        value = compute()
        if keep(value):
            with self._lock:
                self._reused = {k: v for k, v in self._reused.items() if now - v[0] < 86400.0}
                self._reused[key] = (now, value)
        return now, value

    def _per_source(self, targets: Sequence[TargetView], ask: Callable[[PrometheusSource], _Answer],
                    pick: Callable[[PrometheusSource, TargetView, _Answer], _Value | None], what: str
                    ) -> tuple[dict[int, _Value], set[int]]:
        """Ask each source of ``targets`` once (``ask``), then take each target's part of the
        answer (``pick``, None: nothing for it); also the ids of the targets whose source could
        not answer (or is no longer configured): their numbers are unknown, not absent."""
        by_source: dict[str, list[TargetView]] = {}
        for target in targets:
            by_source.setdefault(target.origin or "", []).append(target)
        out: dict[int, _Value] = {}
        failed: set[int] = set()
        for name, members in by_source.items():
            source = self.get(name)
            try:
                if source is None:
                    raise SourceMissing(name)
                answer = ask(source)
            except (PromAPIError, SourceMissing) as exc:
                log.info("source %s: no %s (%s)", name, what, exc)
                failed.update(t.id for t in members)
                continue
            for target in members:
                value = pick(source, target, answer)
                if value is not None:
                    out[target.id] = value
        return out, failed

    def quantile_series(self, target: TargetView, signal: str, q: float | None, span: float, step: float,
                        lookback: float, end: float, model: str | None = None) -> list[dict]:
        """Points of a quantile over time for one discovered target (raises PromAPIError)."""
        source, only, where = self._scope(target)
        first = math.ceil((end - span) / step) * step
        return source.reader.quantile_series(signal, q, first, end, step, lookback, only, model, where)

    def first_samples(self, target: TargetView, signals: Sequence[str], span: float, end: float) -> dict[str, float]:
        """Per histogram signal one discovered target exports, its first sample in the ``span``
        before ``end`` (one query; raises PromAPIError)."""
        source, only, where = self._scope(target)
        return source.reader.first_samples(signals, span, end, only, where)

    def histogram_series(self, target: TargetView, signal: str, first: float, end: float, step: float,
                         lookback: float, model: str | None = None) -> list[tuple[float, WindowHistogram | None]]:
        """One discovered target's ``signal`` histogram (all models summed, or ``model``'s) over the
        ``lookback`` before each step from ``first`` to ``end`` (one range query; raises PromAPIError)."""
        source, only, where = self._scope(target)
        return source.reader.histogram_series(signal, first, end, step, lookback, only, model, where)

    def _scope(self, target: TargetView) -> tuple[PrometheusSource, TargetKey | None, dict[str, str] | None]:
        """The source of a discovered target and how its queries select it: a replica by its target
        label values, a service by its service label values (its replicas, summed)."""
        source = self.get(target.origin)
        if source is None:
            raise SourceMissing(f"source {target.origin!r} is not configured")
        if target.source == SERVICE_KIND:
            return source, None, {name: target.labels.get(name, "") for name in source.config.service_labels}
        return source, source.key_of(target), None
