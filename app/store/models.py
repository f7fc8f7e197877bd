"""Database schema (SQLAlchemy 2 typed mappings). Alembic migrations mirror this file.

Layout, and why:

* ``targets``: what is scraped. ``source`` says whether a row came from the config
  file (re-synced at start) or from the API.
* ``series``: one row per (target, canonical signal, model, data-parallel rank,
  bucket layout). Histogram bucket bounds are stored here **once**, not per sample.
  A changed layout (engine restarted with custom buckets) is a new series, so old
  and new counts are never mixed.
* ``scrape_samples``: the raw samples, one row per target per scrape holding every
  series' sample (app/store/encoding.py): a histogram's cumulative snapshot (bucket
  counts, sum, count), a gauge's or counter's value. Cumulative snapshots, not deltas,
  so that any window can be computed later with Prometheus' own increase()/reset rules.
* ``sample_levels``: the same series downsampled to 5 min and 1 h intervals, kept
  longer than the raw samples (docs/operations.md#storage); ``level_progress`` says how far.
  On PostgreSQL both sample tables are partitioned by time (app/store/partitions.py).
* ``scrapes``: the health log — every scrape attempt, up or down, with timing, size,
  samples kept and the error class.
* ``findings``: one row per occurrence of a diagnosed regime on a target/model, from
  first firing (pending) through active to resolved; the diagnosis history.
* ``diagnoses``: the latest verdict per target/model (healthy, insufficient_data, or
  the primary regime), so the API answers without re-evaluating.
* ``alerts``: one row per alert instance (fingerprint of its labels) with its lifecycle
  (pending -> firing -> resolved); ``silences``: label matchers that mute alerts.
* ``receivers``: webhook / Alertmanager destinations (config file or API).
* ``notifications``: the outbox. A row is written in the same transaction as the alert
  state change it reports; ``delivery_attempts`` records every try.
* ``notification_log``: per receiver and alert group, which alerts that receiver was last
  told are firing and when (Alertmanager's notification log). A change is "news" for a
  receiver until a notification carrying it is enqueued for that receiver.
* ``target_info``: engine configuration revealed by info metrics
  (``vllm:cache_config_info`` labels), latest value per target/model/rank.
* ``slo_increments``: the SLO recording rule's output (app/slo/record.py): per SLO, target
  and alerting round, the good and total requests between consecutive stored snapshots,
  so a burn rate over any window up to the SLO's period is a SUM over few rows. Kept for
  the longest SLO period (they are tiny), so a 28-day budget outlives a 7-day retention.
* ``change_events``: what happened to a target (restarts, configuration, replica set, load and
  workload steps; app/attribution/events.py), one row per event; ``change_detectors``: what
  each target's event detector remembers between rounds (its last configuration, replicas,
  and its change-point tests' state), one JSON row per target.

Timestamps are unix seconds as doubles: exact, cheap to compare, and identical on
SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, dict[str, str]: JSON, list[dict[str, Any]]: JSON}


SOURCE_KIND = "prometheus"  # Target.source of a replica a Prometheus source discovered
SERVICE_KIND = "service"  # Target.source of a group of those replicas (the source's service_labels)
DISCOVERED_BY_SOURCES = frozenset({SOURCE_KIND, SERVICE_KIND})  # targets the scraper never scrapes itself
# Target.source values owned by discovery (file/HTTP SD, a Prometheus source's replicas and services)
DISCOVERED_SOURCES = frozenset({"file_sd", "http_sd", *DISCOVERED_BY_SOURCES})
#: widths of the identity columns a page's labels fill: a longer label is refused by the writer
MODEL_WIDTH, RANK_WIDTH, INFO_NAME_WIDTH = 256, 16, 64


class Target(Base):
    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column(Text)
    engine: Mapped[str] = mapped_column(String(16), default="auto")
    detected_engine: Mapped[str | None] = mapped_column(String(16), nullable=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    scrape_interval: Mapped[float | None] = mapped_column(Float, nullable=True)
    scrape_timeout: Mapped[float | None] = mapped_column(Float, nullable=True)
    # per-scrape and stored limits (app/core/limits.py); None: the service's defaults
    sample_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    series_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stored_series_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # api | config | file_sd | http_sd | prometheus (the last three are discovered)
    source: Mapped[str] = mapped_column(String(16), default="api")
    origin: Mapped[str | None] = mapped_column(String(128), nullable=True)  # discovery config or source name
    gone_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # discovered target no longer present
    hardware: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # HardwareProfile fields
    canary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # CanaryConfig fields
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class TargetView(Protocol):
    """A target as the read-only pages read it: a :class:`Target` or a Core row of the
    ``targets`` table (:func:`app.targets.repository.target_rows`): the pages that only read
    need no ORM object per target."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def engine(self) -> str: ...
    @property
    def detected_engine(self) -> str | None: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def scrape_interval(self) -> float | None: ...
    @property
    def scrape_timeout(self) -> float | None: ...
    @property
    def sample_limit(self) -> int | None: ...
    @property
    def series_limit(self) -> int | None: ...
    @property
    def stored_series_limit(self) -> int | None: ...
    @property
    def source(self) -> str: ...
    @property
    def origin(self) -> str | None: ...
    @property
    def gone_at(self) -> float | None: ...
    @property
    def hardware(self) -> dict[str, Any] | None: ...
    @property
    def canary(self) -> dict[str, Any] | None: ...
    @property
    def created_at(self) -> float: ...
    @property
    def updated_at(self) -> float: ...


def known_engine(target: TargetView) -> str | None:
    """The target's engine: detected from its metrics, else configured (None: ``auto`` and not
    detected yet)."""
    return target.detected_engine or (target.engine if target.engine != "auto" else None)


class Series(Base):
    """One series of a target. Its identity holds the bounds by their digest (``bounds_key``,
    :func:`app.store.repository.bounds_key`): an index entry of the bounds themselves would
    be too large for PostgreSQL's btree past a few hundred buckets."""

    __tablename__ = "series"
    __table_args__ = (UniqueConstraint("target_id", "signal", "model", "rank", "bounds_key",
                                       name="uq_series_identity"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    signal: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(12))  # histogram | gauge | counter
    model: Mapped[str] = mapped_column(String(MODEL_WIDTH))
    rank: Mapped[str] = mapped_column(String(RANK_WIDTH))
    bounds: Mapped[str] = mapped_column(Text, default="")  # comma-joined upper bounds, "" for scalars
    bounds_key: Mapped[str] = mapped_column(String(32), default="", server_default="")  # bounds digest; "" scalars


class ScrapeSample(Base):
    """Every sample of one scrape of one target, encoded by
    :func:`app.store.encoding.encode_scrape` (a series absent from the scrape, or a NaN
    scalar, has no entry). One row a scrape instead of one per series:
    docs/operations.md#encoding."""

    __tablename__ = "scrape_samples"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    ts: Mapped[float] = mapped_column(Float, primary_key=True)
    samples: Mapped[bytes] = mapped_column(LargeBinary)


class SampleLevel(Base):
    """One downsampled interval of one series (app/store/levels.py): what Prometheus'
    ``increase()`` reads of the interval's raw samples - the first and the last sample,
    how many there were, and every counter reset between them - plus the sum and the
    maximum of a gauge's values. ``level`` is the interval length in seconds, ``bucket``
    its start (unix seconds, a multiple of ``level``)."""

    __tablename__ = "sample_levels"

    series_id: Mapped[int] = mapped_column(ForeignKey("series.id", ondelete="CASCADE"), primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[float] = mapped_column(Float, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)  # raw samples in the interval (distinct milliseconds)
    first_ts: Mapped[float] = mapped_column(Float)
    first: Mapped[bytes] = mapped_column(LargeBinary)  # app.store.encoding snapshot / value
    last_ts: Mapped[float] = mapped_column(Float)
    last: Mapped[bytes] = mapped_column(LargeBinary)
    resets: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)  # (component, value before) pairs
    total: Mapped[float | None] = mapped_column(Float, nullable=True)  # gauges: sum of the values
    peak: Mapped[float | None] = mapped_column(Float, nullable=True)  # gauges: maximum


class LevelProgress(Base):
    """Up to where each level is complete: intervals starting before ``done_until`` exist."""

    __tablename__ = "level_progress"

    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    done_until: Mapped[float] = mapped_column(Float)


class Scrape(Base):
    __tablename__ = "scrapes"
    __table_args__ = (Index("ix_scrapes_target_ts", "target_id", "ts"), Index("ix_scrapes_ts", "ts"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    up: Mapped[bool] = mapped_column(Boolean)
    duration: Mapped[float] = mapped_column(Float)
    bytes: Mapped[int] = mapped_column(Integer)
    samples_seen: Mapped[int] = mapped_column(Integer)
    samples_kept: Mapped[int] = mapped_column(Integer)
    malformed: Mapped[int] = mapped_column(Integer)
    engine: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ScrapeView(Protocol):
    """A scrape as the read-only pages read it: a :class:`Scrape` or a Core row of the
    ``scrapes`` table (every target's latest, :func:`app.store.repository.latest_scrapes`)."""

    @property
    def id(self) -> int: ...
    @property
    def target_id(self) -> int: ...
    @property
    def ts(self) -> float: ...
    @property
    def up(self) -> bool: ...
    @property
    def duration(self) -> float: ...
    @property
    def bytes(self) -> int: ...
    @property
    def samples_seen(self) -> int: ...
    @property
    def samples_kept(self) -> int: ...
    @property
    def malformed(self) -> int: ...
    @property
    def engine(self) -> str | None: ...
    @property
    def error_class(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...


class TargetInfo(Base):
    __tablename__ = "target_info"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(INFO_NAME_WIDTH), primary_key=True)
    model: Mapped[str] = mapped_column(String(MODEL_WIDTH), primary_key=True)
    rank: Mapped[str] = mapped_column(String(RANK_WIDTH), primary_key=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    ts: Mapped[float] = mapped_column(Float)


class FindingRow(Base):
    __tablename__ = "findings"
    # ix_findings_state: every read of the open findings (status page, diagnoses, each round)
    # asks for all targets' by state; resolved ones are kept as history and outnumber them
    __table_args__ = (Index("ix_findings_open", "target_id", "model", "state"),
                      Index("ix_findings_last_seen", "last_seen"), Index("ix_findings_state", "state"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(256))
    regime: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(12))  # pending | active | resolved | dropped
    severity: Mapped[str] = mapped_column(String(12))
    confidence: Mapped[float] = mapped_column(Float)
    is_primary: Mapped[bool] = mapped_column(Boolean, default=False)
    summary: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON)  # evidence, remedies, runbook, caused_by
    first_seen: Mapped[float] = mapped_column(Float)
    last_seen: Mapped[float] = mapped_column(Float)
    activated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    resolved_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    consecutive: Mapped[int] = mapped_column(Integer, default=1)  # evaluations in a row that fired
    clear_count: Mapped[int] = mapped_column(Integer, default=0)  # evaluations in a row that were clear


class DiagnosisRow(Base):
    __tablename__ = "diagnoses"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    verdict: Mapped[str] = mapped_column(String(32))
    evaluated_at: Mapped[float] = mapped_column(Float)
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    # what the details are (a digest of them) and the evaluation it was written with: a reader
    # that has those details decoded need not fetch them (app.diagnosis.repository.latest_diagnoses);
    # a writer that predates the columns leaves digest_at behind evaluated_at, and its rows are read
    digest: Mapped[str | None] = mapped_column(String(32), nullable=True)
    digest_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AlertRow(Base):
    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_state", "state"), Index("ix_alerts_group", "group_key"))

    fingerprint: Mapped[str] = mapped_column(String(16), primary_key=True)
    alertname: Mapped[str] = mapped_column(String(128))
    labels: Mapped[dict[str, str]] = mapped_column(JSON)
    annotations: Mapped[dict[str, str]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(10))  # pending | firing | resolved
    group_key: Mapped[str] = mapped_column(Text)
    active_since: Mapped[float] = mapped_column(Float)  # condition first seen true (this episode)
    # became firing / resolved, in the latest episode that fired: a new episode keeps them
    # while pending, so a resolution not yet sent can still be reported with its times
    starts_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ends_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_evaluated: Mapped[float] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)


class SilenceRow(Base):
    __tablename__ = "silences"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    matchers: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    starts_at: Mapped[float] = mapped_column(Float)
    ends_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class ReceiverRow(Base):
    __tablename__ = "receivers"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # ReceiverConfig fields
    source: Mapped[str] = mapped_column(String(8))  # config | api
    created_at: Mapped[float] = mapped_column(Float)


class NotificationRow(Base):
    __tablename__ = "notifications"
    __table_args__ = (Index("ix_notifications_due", "state", "next_attempt_at"),
                      Index("ix_notifications_group", "receiver", "group_key", "seq"))

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # also the Idempotency-Key
    receiver: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(Text)
    seq: Mapped[int] = mapped_column(Integer)  # order within (receiver, group_key)
    status: Mapped[str] = mapped_column(String(10))  # firing | resolved (the payload's status)
    # the exact JSON sent (and signed); a kind: alertmanager post is sent with its firing
    # alerts' endsAt moved on by the time it waited (app/alerts/delivery.py)
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(10))  # pending | delivered | expired
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class NotificationLogRow(Base):
    """What one receiver was last told about one alert group. Written only together with
    the notification that told it, so an alert that starts or stops firing while the group
    is not due stays news for that receiver until its next notification."""

    __tablename__ = "notification_log"

    receiver: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_key: Mapped[str] = mapped_column(Text, primary_key=True)
    firing: Mapped[list[str]] = mapped_column(JSON)  # fingerprints last sent as firing
    sent_at: Mapped[float] = mapped_column(Float)  # when the last notification was enqueued


class DeliveryAttemptRow(Base):
    __tablename__ = "delivery_attempts"
    __table_args__ = (Index("ix_attempts_notification", "notification_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    notification_id: Mapped[str] = mapped_column(ForeignKey("notifications.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    ts: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency: Mapped[float] = mapped_column(Float)
    response: Mapped[str | None] = mapped_column(Text, nullable=True)  # truncated
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ProbeRunRow(Base):
    """One active probe run (app/probe): ad hoc (API/CLI), a scheduled canary, or a sweep.

    ``target`` is the monitored target's name, or the URL probed when it is not a target;
    ``target_id`` survives only while the target exists. ``summary`` is
    ``ProbeResult.summary()`` (per-level stats, errors, protocol used)."""

    __tablename__ = "probe_runs"
    __table_args__ = (Index("ix_probe_runs_target", "target", "kind", "started_at"),
                      Index("ix_probe_runs_target_id", "target_id", "kind", "started_at"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id", ondelete="SET NULL"), nullable=True)
    target: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(8))  # adhoc | canary | sweep
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(10))  # running | done | error | cancelled
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ProbeRequestRow(Base):
    """One request of a probe run, as the client saw it (seconds); ITL summarised per request."""

    __tablename__ = "probe_requests"
    __table_args__ = (Index("ix_probe_requests_run", "run_id", "level", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("probe_runs.id", ondelete="CASCADE"))
    level: Mapped[int] = mapped_column(Integer)  # index of the level in the run
    concurrency: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer)  # planned
    max_tokens: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    ttft: Mapped[float | None] = mapped_column(Float, nullable=True)
    e2e: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_p50: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_p99: Mapped[float | None] = mapped_column(Float, nullable=True)
    itl_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens: Mapped[int] = mapped_column(Integer)
    prompt_tokens_seen: Mapped[int | None] = mapped_column(Integer, nullable=True)  # usage.prompt_tokens
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    finish_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(16), nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)


class ReplicaRow(Base):
    """A running replica of the service (app/replicas/membership.py): live while ``heartbeat_at`` is
    fresher than the replica expiry."""
    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)


class LeaseRow(Base):
    """A lease only one replica holds at a time (``leader``: diagnosis and alert rounds,
    notification delivery, retention). ``token`` grows with every change of holder, so a
    round that started under an older token can tell it was deposed."""
    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    token: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[float] = mapped_column(Float)


class SloIncrementRow(Base):
    """Good (``bucket{le=threshold}``) and total (``count``) requests a target served between
    two stored snapshots, ``ts_start`` < ts <= ``ts_end``, for one SLO (signal + threshold:
    an edited SLO's rows are deleted and its record starts again from the stored samples)."""

    __tablename__ = "slo_increments"
    __table_args__ = (Index("ix_slo_increments_window", "slo", "signal", "threshold", "ts_end"),)

    slo: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    ts_end: Mapped[float] = mapped_column(Float, primary_key=True)
    signal: Mapped[str] = mapped_column(String(32))
    threshold: Mapped[float] = mapped_column(Float)
    ts_start: Mapped[float] = mapped_column(Float)
    good: Mapped[float] = mapped_column(Float)
    total: Mapped[float] = mapped_column(Float)


class ChangeEventRow(Base):
    """Something that happened to a target at ``ts`` (app/attribution/events.py): a restart, a
    configuration label's new value, a replica gone or new, a load or workload step."""

    __tablename__ = "change_events"
    __table_args__ = (Index("ix_change_events_target_ts", "target_id", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"))
    ts: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(12))
    subject: Mapped[str] = mapped_column(String(256))
    before: Mapped[str | None] = mapped_column(Text, nullable=True)
    after: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[str] = mapped_column(Text)
    detected_at: Mapped[float] = mapped_column(Float)


class ChangeDetectorRow(Base):
    """What the event detector of one target remembers between rounds, and the end of the
    last window it read (the next round reads on from there)."""

    __tablename__ = "change_detectors"

    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id", ondelete="CASCADE"), primary_key=True)
    read_until: Mapped[float] = mapped_column(Float)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
