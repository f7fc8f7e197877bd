"""Storage on SQLite and real PostgreSQL: migrations, batch writes, windows across resets."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import inspect

from app.alerts import repository as alert_repository
from app.core import quantiles
from app.sources.base import Canonical, CanonicalHistogram, CanonicalInfo, CanonicalScalar
from app.store import db, reads, repository, retention
from app.store.models import Scrape, Target
from app.store.record import ScrapeRecord
from app.store.writer import DatabaseUnavailable, SampleWriter
from app.targets import repository as target_repository
from tests.support.plans import executed, plan

TTFT_BOUNDS = (0.1, 0.5, 1.0, 2.5, math.inf)
TABLES = {"targets", "series", "scrape_samples", "scrapes", "target_info", "findings", "diagnoses",
          "alerts", "silences", "receivers", "notifications", "delivery_attempts", "probe_runs", "probe_requests",
          "notification_log", "sample_levels", "level_progress",
          "slo_increments", "change_events", "change_detectors"}


def test_migrations_upgrade_and_downgrade(database_url: str) -> None:
    db.upgrade(database_url)
    engine = db.make_engine(database_url)
    assert TABLES <= set(inspect(engine).get_table_names())
    assert db.current_revision(engine) == db.head_revision() == "0014"
    db.downgrade(database_url, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert db.current_revision(engine) is None
    db.upgrade(database_url)
    assert TABLES <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_notification_log_migration_keeps_what_was_notified(database_url: str) -> None:
    """0005 replaces alerts.notified_state (one state shared by every receiver) with a log
    per (receiver, group): seeded from the old column for each receiver that was notified
    of the group and that its match routes the alert to. The downgrade sets it back to
    'firing' for every alert some receiver was told is firing and to NULL for the rest
    ('resolved' is not restored)."""
    import sqlalchemy as sa

    from app.alerts.schemas import fingerprint

    db.upgrade(database_url, "0004")
    engine = db.make_engine(database_url)
    alerts = sa.table("alerts", *(sa.column(c) for c in ("fingerprint", "alertname", "state", "group_key",
                                                          "active_since", "last_evaluated", "notified_state")),
                      sa.column("labels", sa.JSON), sa.column("annotations", sa.JSON))
    receivers = sa.table("receivers", sa.column("name"), sa.column("source"), sa.column("created_at"),
                         sa.column("config", sa.JSON))
    notifications = sa.table("notifications", *(sa.column(c) for c in (
        "id", "receiver", "group_key", "seq", "status", "body", "state", "attempts", "created_at", "next_attempt_at")))
    group = '{}:{alertname="LLMLatencyTargetDown"}'
    labels = {name: {"alertname": "LLMLatencyTargetDown", "target": name, "cluster": cluster}
              for name, cluster in (("a", "east"), ("c", "west"), ("d", "east"), ("e", "east"))}
    fp = {name: fingerprint(value) for name, value in labels.items()}
    notified = {"a": "firing", "c": "firing", "d": None, "e": "resolved"}
    with engine.begin() as connection:
        connection.execute(receivers.insert(), [
            {"name": "all", "source": "config", "created_at": 1.0, "config": {"name": "all", "url": "http://h/"}},
            {"name": "east", "source": "api", "created_at": 1.0,
             "config": {"name": "east", "url": "http://h/", "match": {"cluster": "east"}}}])
        connection.execute(alerts.insert(), [
            {"fingerprint": fp[name], "alertname": "LLMLatencyTargetDown", "state": "firing", "group_key": group,
             "active_since": 10.0, "last_evaluated": 10.0, "notified_state": notified[name], "labels": labels[name],
             "annotations": {}} for name in labels])
        connection.execute(notifications.insert(), [
            {"id": f"n{i}", "receiver": receiver, "group_key": group, "seq": i, "status": "firing", "body": "{}",
             "state": "delivered", "attempts": 1, "created_at": created, "next_attempt_at": created}
            for i, (receiver, created) in enumerate((("all", 100.0), ("all", 200.0), ("east", 150.0),
                                                     ("removed", 120.0)))])
    db.upgrade(database_url)
    assert "notified_state" not in {c["name"] for c in inspect(engine).get_columns("alerts")}
    with engine.connect() as connection:
        log = {(r, g): (sorted(firing), sent_at) for r, g, firing, sent_at in connection.execute(
            sa.select(sa.table("notification_log", sa.column("receiver"), sa.column("group_key"),
                               sa.column("firing", sa.JSON), sa.column("sent_at"))))}
    assert log == {("all", group): (sorted([fp["a"], fp["c"]]), 200.0), ("east", group): ([fp["a"]], 150.0)}
    db.downgrade(database_url, "0004")
    with engine.connect() as connection:
        restored = dict(connection.execute(sa.select(alerts.c.fingerprint, alerts.c.notified_state)).all())
    assert restored == {fp["a"]: "firing", fp["c"]: "firing", fp["d"]: None, fp["e"]: None}
    assert "notification_log" not in inspect(engine).get_table_names()
    engine.dispose()


def record(target_id: int, ts: float, counts: tuple[float, ...], total: float, tokens: float,
           kv: float = 0.5, model: str = "m") -> ScrapeRecord:
    canonical = Canonical(engine="vllm")
    canonical.histograms.append(CanonicalHistogram("ttft", model, "0", TTFT_BOUNDS, counts, total, counts[-1]))
    canonical.scalars.append(CanonicalScalar("generation_tokens_total", "counter", model, "0", tokens))
    canonical.scalars.append(CanonicalScalar("kv_usage", "gauge", model, "0", kv))
    canonical.infos.append(CanonicalInfo("cache_config", model, "0", {"enable_prefix_caching": "True"}))
    return ScrapeRecord(target_id, ts, True, 0.002, 1000, 40, 30, 0, "vllm", None, None, canonical)


def test_the_series_identity_migration_keeps_old_rows_and_their_series(database_url: str) -> None:
    """0013: a database at 0012 (series identified by their bounds text, samples in the first
    entry encoding) reads back after the upgrade, and the writer finds its series by their
    ``bounds_key`` instead of making new ones; the models match the migrated tables, and the
    downgrade puts the bounds back in the identity."""
    import struct
    import time

    import sqlalchemy as sa
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from app.store.models import Base

    db.upgrade(database_url, "0012")
    engine = db.make_engine(database_url)
    ts = float(int(time.time())) + 60  # inside the partitions PostgreSQL keeps ahead
    counts = (1, 3, 4, 5, 5)
    histogram = struct.pack("<c5I", b"I", *counts) + struct.pack("<dd", 4.0, 5.0)
    with engine.begin() as conn:
        target = conn.execute(sa.text(
            "INSERT INTO targets (name, url, engine, labels, source, created_at, updated_at) "
            "VALUES ('t1', 'http://127.0.0.1:1/metrics', 'vllm', '{}', 'api', 0, 0) RETURNING id")).scalar_one()
        ttft, tokens = (conn.execute(sa.text(
            "INSERT INTO series (target_id, signal, kind, model, rank, bounds) VALUES (:t, :s, :k, 'm', '0', :b) "
            "RETURNING id"), {"t": target, "s": signal, "k": kind, "b": bounds}).scalar_one()
            for signal, kind, bounds in (("ttft", "histogram", repository.encode_floats(TTFT_BOUNDS)),
                                         ("generation_tokens_total", "counter", "")))
        old_row = (struct.pack("<IBH", ttft, 0, len(histogram)) + histogram
                   + struct.pack("<IBHd", tokens, 1, 8, 100.0))
        conn.execute(sa.text("INSERT INTO scrape_samples (target_id, ts, samples) VALUES (:t, :ts, :blob)")
                     .bindparams(sa.bindparam("blob", type_=sa.LargeBinary())),
                     {"t": target, "ts": ts, "blob": old_row})
    db.upgrade(database_url)
    with engine.connect() as conn:
        keys = dict(conn.execute(sa.text("SELECT id, bounds_key FROM series")).all())
        diff = [d for d in compare_metadata(MigrationContext.configure(conn), Base.metadata)  # but partitions
                if not (d[0] == "remove_table" and d[1].name.startswith(("scrape_samples_", "sample_levels_")))]
    assert keys == {ttft: repository.bounds_key(repository.encode_floats(TTFT_BOUNDS)), tokens: ""} and diff == []
    assert SampleWriter(engine).write([record(target, ts + 15, (2, 6, 9, 10, 10), 9.5, 250.0)]) == 1
    sessions = db.make_sessionmaker(engine)
    with sessions() as session:
        series = {s.signal: s.id for s in repository.find_series(
            session, [target], ["ttft", "generation_tokens_total", "kv_usage"])}
        snapshots = repository.histogram_snapshots(session, [ttft], ts, ts + 15)[ttft]
        points = repository.scalar_points(session, [tokens], ts, ts + 15)[tokens]
    assert len(series) == 3 and (series["ttft"], series["generation_tokens_total"]) == (ttft, tokens)  # kv_usage new
    assert [(s.ts, s.counts, s.sum, s.count) for s in snapshots] == [
        (ts, counts, 4.0, 5.0), (ts + 15, (2, 6, 9, 10, 10), 9.5, 10)]
    assert points == [(ts, 100.0), (ts + 15, 250.0)]
    db.downgrade(database_url, "0012")
    identity = [c["column_names"] for c in inspect(engine).get_unique_constraints("series")]
    assert identity == [["target_id", "signal", "model", "rank", "bounds"]]
    assert not {"sample_limit", "series_limit", "stored_series_limit"} & {
        c["name"] for c in inspect(engine).get_columns("targets")}
    db.upgrade(database_url)
    engine.dispose()


def test_snapshots_round_trip_exactly_and_windows_span_a_restart(store) -> None:
    engine, sessions, target_id = store
    t0 = 1_700_000_000.0
    # cumulative counts; the engine restarts between t0+30 and t0+45 (counters drop)
    snapshots = [
        (t0, (1, 3, 4, 5, 5), 4.0, 100.0),
        (t0 + 15, (2, 6, 9, 10, 10), 9.5, 250.0),
        (t0 + 30, (3, 8, 12, 14, 15), 20.0, 400.0),
        (t0 + 45, (0, 1, 2, 2, 2), 1.5, 30.0),       # after the restart
        (t0 + 60, (1, 3, 5, 6, 6), 6.25, 90.0),
    ]
    writer = SampleWriter(engine)
    assert writer.write([record(target_id, ts, tuple(map(float, c)), s, tok) for ts, c, s, tok in snapshots]) == 5
    with sessions() as session:
        series = repository.find_series(session, [target_id], ["ttft"])
        assert ([(s.signal, s.kind, s.model, s.rank, s.bounds) for s in series]
                == [("ttft", "histogram", "m", "0", TTFT_BOUNDS)])
        stored = repository.histogram_snapshots(session, [series[0].id], t0, t0 + 60)[series[0].id]
        assert [(p.ts, p.counts, p.sum) for p in stored] == [(ts, tuple(map(float, c)), s) for ts, c, s, _ in snapshots]
        report = reads.latency_report(session, [target_id], 60.0, t0 + 60)
        infos = repository.target_infos(session, target_id)
    # The window [t0, t0+60] starts and ends on samples, so nothing is extrapolated:
    # per bucket, increase = last - first + (the value before each drop).
    # bucket 0.1: 1,2,3 | 0,1 -> 1 - 1 + 3 = 3;   +Inf: 5,10,15 | 2,6 -> 6 - 5 + 15 = 16
    per_bucket = [1 - 1 + 3, 3 - 3 + 8, 5 - 4 + 12, 6 - 5 + 14, 6 - 5 + 15]
    assert per_bucket == [3, 8, 13, 15, 16]
    ttft = report["ttft"]
    assert ttft["count"] == 16.0
    # p50: rank 8 falls in (0.1, 0.5], which holds 8 - 3 = 5 -> 0.1 + 0.4 * (8 - 3) / 5
    assert ttft["p50"] == pytest.approx(0.1 + 0.4 * 5 / 5, rel=1e-12)
    assert ttft["p50"] == pytest.approx(quantiles.histogram_quantile(0.5, TTFT_BOUNDS, per_bucket), rel=1e-12)
    # p90: rank 14.4 falls in (1.0, 2.5], which holds 15 - 13 = 2 -> 1.0 + 1.5 * 1.4 / 2
    assert ttft["p90"] == pytest.approx(1.0 + 1.5 * 1.4 / 2, rel=1e-12)
    # p99: rank 15.84 is in the +Inf bucket -> the highest finite bound
    assert ttft["p99"] == 2.5
    assert ttft["mean"] == pytest.approx((6.25 - 4.0 + 20.0) / 16, rel=1e-12)
    # tokens: 90 - 100 + 400 = 390 over 60 s
    assert report["rates"]["generation_tokens_per_second"] == pytest.approx(390 / 60, rel=1e-12)
    assert report["gauges"]["kv_usage"] == {"last": 0.5, "mean": 0.5, "max": 0.5}
    assert report["models"]["m"]["ttft"]["p50"] == ttft["p50"]
    assert [(i.name, i.labels) for i in infos] == [("cache_config", {"enable_prefix_caching": "True"})]


def test_ranks_are_summed_and_kv_usage_averaged(store) -> None:
    engine, sessions, target_id = store
    t0 = 1_700_000_000.0
    records = []
    for i, ts in enumerate((t0, t0 + 10)):
        scrape = None
        for rank, kv in (("0", 0.2), ("1", 0.8)):
            r = record(target_id, ts, (0.0, 0.0, 0.0, 0.0, 0.0) if i == 0 else (4.0, 4.0, 4.0, 4.0, 4.0),
                       0.0 if i == 0 else 0.2, 0.0, kv)
            for h in r.canonical.histograms:
                h.rank = rank
            for s in r.canonical.scalars:
                s.rank = rank
            if scrape is None:
                scrape = r
            else:  # one page holds both ranks' series
                scrape.canonical.histograms.extend(r.canonical.histograms)
                scrape.canonical.scalars.extend(r.canonical.scalars)
        records.append(scrape)
    assert SampleWriter(engine).write(records) == 2
    with sessions() as session:
        report = reads.latency_report(session, [target_id], 10.0, t0 + 10)
    assert report["ttft"]["count"] == 8.0
    assert report["gauges"]["kv_usage"]["last"] == pytest.approx(0.5)


def test_one_bad_scrape_does_not_drop_the_batch(store) -> None:
    engine, sessions, target_id = store
    t0 = 1_700_000_000.0
    good = [record(target_id, t0 + i, (1.0,) * 5, 1.0, 1.0) for i in range(3)]
    duplicate = record(target_id, t0 + 1, (1.0,) * 5, 1.0, 1.0)  # same series and ts: violates the primary key
    written = SampleWriter(engine).write([good[0], good[1], duplicate, good[2]])
    assert written == 3
    with sessions() as session:
        log = repository.scrape_log(session, target_id, 10)
    assert len(log) == 4
    failed = [s for s in log if not s.up]
    assert len(failed) == 1 and failed[0].error_class == "storage_error" and failed[0].ts == t0 + 1


def test_latest_scrape_of_one_target_is_the_one_all_targets_give(store) -> None:
    engine, sessions, target_id = store
    with sessions.begin() as session:
        other = target_repository.create_target(session, name="t2", url="http://127.0.0.1:2/metrics", engine="auto",
                                         labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
    t0 = 1_700_000_000.0
    SampleWriter(engine).write([record(target_id, t0 + i * 15, (1.0,) * 5, 1.0, 1.0) for i in range(3)]
                               + [record(other, t0 + 100 + i * 15, (1.0,) * 5, 1.0, 1.0) for i in range(2)])
    with sessions() as session:
        everything = repository.latest_scrapes(session)
        mine, theirs = repository.latest_scrape(session, target_id), repository.latest_scrape(session, other)
        assert (mine.ts, theirs.ts) == (t0 + 30, t0 + 115)
        assert (mine.id, theirs.id) == (everything[target_id].id, everything[other].id)
        assert repository.latest_scrape(session, other + 1) is None


def test_the_latest_scrapes_are_read_by_one_index_lookup_per_target(store) -> None:
    """The status page and the targets list read every target's latest scrape per request:
    the query looks each target up in ``ix_scrapes_target_ts`` (its plan has no scan of the
    scrape log, whose length is 7 days of scrapes), and gives the newest scrape of each."""
    engine, sessions, target_id = store
    with sessions.begin() as session:
        other = target_repository.create_target(session, name="t2", url="http://127.0.0.1:2/metrics").id
        target_repository.create_target(session, name="t3", url="http://127.0.0.1:3/metrics")  # never scraped
    t0 = 1_700_000_000.0
    SampleWriter(engine).write([record(target_id, t0 + i * 15, (1.0,) * 5, 1.0, 1.0) for i in range(40)]
                               + [record(other, t0 + 7 + i * 15, (1.0,) * 5, 1.0, 1.0) for i in range(30)])
    with executed(engine, parameters=True) as statements, sessions() as session:
        latest = repository.latest_scrapes(session)
        some = repository.latest_scrapes(session, [other])
    assert {t: s.ts for t, s in latest.items()} == {target_id: t0 + 39 * 15, other: t0 + 7 + 29 * 15}
    assert {t: s.ts for t, s in some.items()} == {other: t0 + 7 + 29 * 15}
    (statement, parameters), _ = statements
    steps = plan(engine, statement, parameters)
    if engine.dialect.name == "sqlite":
        assert not [step for step in steps if step.startswith("SCAN scrapes")], steps
        assert any(step.startswith("SEARCH scrapes USING") and "INDEX ix_scrapes_target_ts (target_id=?)" in step
                   for step in steps), steps
    else:
        lookups = [i for i, step in enumerate(steps) if "using ix_scrapes_target_ts" in step]
        assert lookups and all("Index Cond: (target_id = targets.id)" in steps[i + 1] for i in lookups), steps


def test_the_read_only_rows_carry_what_the_orm_objects_do(store) -> None:
    """The status page, the targets list, the fleet view and TargetDown read targets and latest
    scrapes as Core rows (``target_rows``, ``latest_scrapes``): every column the ORM object has,
    decoded the same way (JSON labels as a dict, ``up`` as a bool on SQLite's integers too)."""
    engine, sessions, target_id = store
    with sessions.begin() as session:
        other = target_repository.create_target(session, name="t2", url="http://127.0.0.1:2/metrics",
                                         labels={"pool": "a", "zone": "b"}, hardware={"gpu": "L4", "count": 2},
                                         scrape_interval=30.0, source="file_sd", origin="pods.json").id
    t0 = 1_700_000_000.0
    down = ScrapeRecord(other, t0 + 7, False, 0.5, 0, 0, 0, 0, None, "timeout", "no answer in 5s", None)
    SampleWriter(engine).write([record(target_id, t0, (1.0,) * 5, 1.0, 1.0), down])
    columns = [c.key for c in inspect(Target).column_attrs]
    scrape_columns = [c.key for c in inspect(Scrape).column_attrs]
    with sessions() as session:
        rows, objects = target_repository.target_rows(session), target_repository.list_targets(session)
        latest = repository.latest_scrapes(session)
        orm_scrapes = {t: repository.latest_scrape(session, t) for t in (target_id, other)}
    assert [r.name for r in rows] == [o.name for o in objects] == ["t1", "t2"]
    for row, obj in zip(rows, objects, strict=True):
        assert {c: getattr(row, c) for c in columns} == {c: getattr(obj, c) for c in columns}
    assert rows[1].labels == {"pool": "a", "zone": "b"} and rows[1].hardware == {"gpu": "L4", "count": 2}
    for t in (target_id, other):
        assert {c: getattr(latest[t], c) for c in scrape_columns} == {c: getattr(orm_scrapes[t], c)
                                                                      for c in scrape_columns}
    assert latest[target_id].up is True and latest[other].up is False
    assert (latest[other].ts, latest[other].error_class, latest[other].error) == (t0 + 7, "timeout", "no answer in 5s")
    # a target and a scrape added to the session and not yet flushed are seen, as an ORM read sees them
    with sessions.begin() as session:
        third = target_repository.create_target(session, name="t0", url="http://127.0.0.1:3/metrics")
        session.add(Scrape(target_id=other, ts=t0 + 60, up=True, duration=0.1, bytes=10, samples_seen=1,
                           samples_kept=1, malformed=0))
        assert [r.name for r in target_repository.target_rows(session)] == ["t0", "t1", "t2"]
        latest = repository.latest_scrapes(session)
        assert latest[other].ts == t0 + 60 and third.id not in latest


def test_prune_removes_only_old_rows(store) -> None:
    """SQLite deletes rows older than the cut-off (in batches); PostgreSQL drops the hour
    partitions that ended before it, so rows of the cut-off's own hour stay."""
    engine, sessions, target_id = store
    day = 86400.0
    t0 = 1_700_006_400.0  # a UTC midnight
    assert t0 % day == 0
    SampleWriter(engine).write([record(target_id, t0 + i * 100, (1.0,) * 5, 1.0, 1.0) for i in range(4)])
    SampleWriter(engine).write([record(target_id, t0 + day + i * 100, (1.0,) * 5, 1.0, 1.0) for i in range(2)])
    retention.downsample(sessions, now=t0 + 2 * day)
    deleted = retention.prune(sessions, 400.0, now=t0 + day + 450.0)  # cut-off: t0 + day + 50
    assert deleted["scrapes"] == 5
    if engine.dialect.name == "postgresql":
        assert deleted["scrape_samples_partitions"] == 1  # day one's hour
        remaining = {t0 + day, t0 + day + 100}
    else:
        assert deleted["scrape_samples"] == 5
        remaining = {t0 + day + 100}
    with sessions() as session:
        assert len(repository.scrape_log(session, target_id)) == 1
        series = repository.find_series(session, [target_id], ["ttft"])
        kept = repository.histogram_snapshots(session, [series[0].id], 0, 2 * t0)[series[0].id]
    assert {p.ts for p in kept} == remaining


def test_retention_prunes_finished_notifications_and_their_attempts_but_never_a_pending_one(store) -> None:
    """Delivered and expired notifications older than the cut-off go with their delivery
    attempts; a recent one stays, and a pending one stays whatever its age (the outbox loses
    nothing); one created before the cut-off but delivered after it stays too."""
    _, sessions, _ = store
    t0 = 1_700_000_000.0
    with sessions.begin() as session:
        for name, created, state, delivered in (("old-delivered", t0, "delivered", t0 + 5),
                                                ("old-expired", t0 + 1, "expired", None),
                                                ("old-pending", t0 + 2, "pending", None),
                                                ("late-delivered", t0 + 3, "delivered", t0 + 500),
                                                ("new-delivered", t0 + 400, "delivered", t0 + 405)):
            row = alert_repository.enqueue_notification(session, name, "hook", "{}:{}", "firing", "{}", created)
            for attempt in range(2):
                alert_repository.record_attempt(session, row, created + attempt, 500 if attempt == 0 else 200, 0.01,
                                                None,
                                          None)
            row.state, row.delivered_at = state, delivered
    deleted = retention.prune(sessions, 250.0, now=t0 + 450)  # cut-off: t0 + 200
    assert deleted["notifications"] == 2 and deleted["delivery_attempts"] == 4
    with sessions() as session:
        left = alert_repository.list_notifications(session)
        attempts = alert_repository.attempts_of(session, [n.id for n in left])
    assert sorted(n.id for n in left) == ["late-delivered", "new-delivered", "old-pending"]
    assert sorted(len(a) for a in attempts.values()) == [2, 2, 2]


def test_the_retention_round_prunes_the_store_and_the_tables_features_pass_in(store) -> None:
    """The store's tables and each feature's pruner (probe runs in the service) get the same
    cut-off, ``now - retention``; rows deleted per table and name."""
    engine, sessions, target_id = store
    t0 = 1_700_000_000.0
    SampleWriter(engine).write([record(target_id, t0 + i * 100, (1.0,) * 5, 1.0, 1.0) for i in range(4)])
    cutoffs: list[float] = []

    def prune_extra(session, before: float) -> int:
        cutoffs.append(before)
        return 7

    deleted = retention.prune(sessions, 250.0, now=t0 + 400, also={"extra": prune_extra})
    assert deleted["scrapes"] == 2 and deleted["findings"] == 0 and deleted["extra"] == 7
    assert cutoffs == [t0 + 150]
    with sessions() as session:
        assert len(repository.scrape_log(session, target_id)) == 2


def test_unreachable_database_raises_so_the_batch_is_kept() -> None:
    engine = db.make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    with pytest.raises(DatabaseUnavailable):
        SampleWriter(engine).write([record(1, 1.0, (1.0,) * 5, 1.0, 1.0)])
    engine.dispose()
