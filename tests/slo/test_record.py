"""The SLO recording table: increments as Prometheus counts them, rows no longer than a minute,
sums per window, pruning by period, and its migration (both databases)."""

from __future__ import annotations

import math

from sqlalchemy import inspect

from app.core import quantiles
from app.core.quantiles import HistogramSnapshot
from app.slo import repository as slo_repository
from app.slo.record import ROW_SECONDS, chunk_rows, pair_increments
from app.store import db
from app.targets import repository as target_repository


def snaps(points: list[tuple[float, float, float]]) -> list[HistogramSnapshot]:
    """(ts, good bucket, count) -> snapshots with buckets (threshold bucket, +Inf)."""
    return [HistogramSnapshot(ts, (good, count), math.nan, count) for ts, good, count in points]


def test_increments_count_resets_as_prometheus_increase_does() -> None:
    points = [(0, 0, 0), (15, 10, 12), (30, 25, 30), (45, 3, 5), (60, 8, 20), (75, 8, 20)]  # a restart at 45
    pairs = pair_increments(snaps(points), 0)
    good, total = sum(p[1] for p in pairs), sum(p[2] for p in pairs)
    assert (good, total) == (25 + 3 + 5, 30 + 5 + 15)
    # the same as Prometheus' increase over exactly these samples (no extrapolation: range = samples)
    assert quantiles.increase([(t, g) for t, g, _ in points], 0, 75) == good
    assert quantiles.increase([(t, n) for t, _, n in points], 0, 75) == total


def test_rows_span_at_most_a_minute_and_keep_every_increment() -> None:
    pairs = [(float(t), 1.0, 2.0) for t in range(15, 15 * 41, 15)]  # ten minutes of 15 s scrapes
    rows = chunk_rows(pairs, 0.0)
    assert sum(r[2] for r in rows) == 40 and sum(r[3] for r in rows) == 80
    assert all(end - start <= ROW_SECONDS + 15 for start, end, _, _ in rows)
    assert [r[0] for r in rows[1:]] == [r[1] for r in rows[:-1]]  # contiguous
    assert chunk_rows([(15.0, 1.0, 1.0)], 0.0) == [(0.0, 15.0, 1.0, 1.0)]  # a normal round: one row


def test_window_sums_and_pruning(migrated_url: str) -> None:
    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            target = target_repository.create_target(session, name="t", url="http://127.0.0.1:1/metrics", engine="vllm",
                                              labels={})
            rows = [{"slo": "s", "target_id": target.id, "ts_end": float(t), "signal": "ttft", "threshold": 2.5,
                     "ts_start": float(t - 60), "good": 9.0, "total": 10.0} for t in range(60, 7201, 60)]
            rows.append({**rows[-1], "slo": "old", "ts_end": 100.0})
            slo_repository.add_increments(session, rows)
            target_id = target.id
        with sessions() as session:
            sums = slo_repository.window_sums(session, "s", "ttft", 2.5, [target_id], [300, 3600, 86400], 7200.0)
            assert sums[target_id] == [(45.0, 50.0, 6900.0), (540.0, 600.0, 3600.0), (1080.0, 1200.0, 0.0)]
            assert slo_repository.last_recorded(session, "s", "ttft", 2.5) == {target_id: 7200.0}
        with sessions.begin() as session:
            assert slo_repository.forget_changed(session, "old", "ttft", 2.5) == 0
            assert slo_repository.prune(session, {"s": 3600.0}, 7200.0) == 1 + 59  # an unconfigured SLO, older rows
        with sessions() as session:
            sums = slo_repository.window_sums(session, "s", "ttft", 2.5, [target_id], [86400], 7200.0)
            assert sums[target_id] == [(549.0, 610.0, 3540.0)]  # rows ending at 3600 .. 7200 are kept
        with sessions.begin() as session:  # the SLO edited to another threshold: its rows go
            assert slo_repository.forget_changed(session, "s", "ttft", 5.0) == 61
            assert slo_repository.last_recorded(session, "s", "ttft", 2.5) == {}
    finally:
        engine.dispose()


def test_migration_creates_the_slo_table_as_the_model_says(database_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from app.store.models import Base

    db.upgrade(database_url)
    engine = db.make_engine(database_url)
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert [d for d in diff if "slo_increments" in repr(d)] == []
        db.downgrade(database_url, "0006")
        assert "slo_increments" not in set(inspect(engine).get_table_names())
        db.upgrade(database_url)
        assert "slo_increments" in set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_old_rows_are_merged_keeping_every_request(migrated_url: str) -> None:
    """Four days of 15 s rows: the last 6 h stay, 6 h .. 3 d become 5 m rows, older ones 1 h
    rows; nothing is lost, and the windows' sums move by at most one coarse row at their edge."""
    from app.slo.config import SloObjective
    from app.slo.record import compact

    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    slo = SloObjective(name="s", signal="ttft", threshold=2.5, objective=0.99)
    now = 1_800_000_000.0
    try:
        with sessions.begin() as session:
            target_id = target_repository.create_target(session, name="t", url="http://127.0.0.1:1/metrics",
                                                 engine="vllm", labels={}).id
            start = now - 4 * 86400
            slo_repository.add_increments(session, [
                {"slo": "s", "target_id": target_id, "ts_end": start + k * 15.0, "signal": "ttft", "threshold": 2.5,
                 "ts_start": start + (k - 1) * 15.0, "good": 1.0 if k % 10 else 0.0, "total": 1.0}
                for k in range(1, 4 * 5760 + 1)])
        windows = [*slo.windows(), slo.period]
        with sessions() as session:
            before = slo_repository.window_sums(session, "s", "ttft", 2.5, [target_id], windows, now)[target_id]
        with sessions.begin() as session:
            removed = compact(session, slo, now, full=True)
        with sessions() as session:
            after = slo_repository.window_sums(session, "s", "ttft", 2.5, [target_id], windows, now)[target_id]
            count = len(slo_repository.rows_to_compact(session, "s", "ttft", 2.5, now + 1, None, 1e9))
        # 6 h of 15 s rows, 66 h of 5 m rows, a day of 1 h rows (and a row or two where the tiers meet)
        assert 1440 + 792 + 24 <= count <= 1440 + 792 + 24 + 3 and removed == 4 * 5760 - count
        assert after[-1][:2] == before[-1][:2] == (4 * 5760 * 0.9, 4 * 5760)  # every request kept
        for window, (good_b, total_b, _), (good_a, total_a, _) in zip(windows, before, after, strict=True):
            edge = 0 if window <= 6 * 3600 - 300 else (300 if window < 3 * 86400 else 3600) / 15
            assert abs(total_a - total_b) <= edge, window
            assert abs(good_a / total_a - good_b / total_b) < 0.002, window
        with sessions.begin() as session:  # a later round compacts only what newly crossed an age
            assert compact(session, slo, now) == 0
    finally:
        engine.dispose()
