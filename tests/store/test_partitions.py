"""PostgreSQL's time partitions: raw samples by hour (retention holds at most one hour more
than the raw period), levels by day; a span already covered by a day partition keeps it
until it expires and gets hour partitions only beside it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.store import partitions
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.store.test_storage import record

pytestmark = pytest.mark.postgres

DAY, HOUR = 86400.0, 3600.0
T0 = 1_700_006_400.0  # a UTC midnight (2023-11-15)


@pytest.fixture
def pg_store(request: pytest.FixtureRequest):
    url = request.getfixturevalue("postgres_database")
    from tests.conftest import _reset_postgres

    _reset_postgres(url)
    from app.store import db

    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    with sessions.begin() as session:
        target_id = target_repository.create_target(session, name="t1", url="http://127.0.0.1:1/metrics", engine="auto",
                                             labels={}, scrape_interval=15.0, scrape_timeout=5.0).id
    yield engine, sessions, target_id
    engine.dispose()


def spans(engine, table: str) -> list[tuple[float, float]]:
    with engine.connect() as conn:
        return sorted(s for s in map(partitions.span_of, partitions.partitions_of(conn, table)) if s is not None)


def rows_by_partition(engine, table: str) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT tableoid::regclass::text, count(*) FROM {table} GROUP BY 1")).all())


def test_raw_samples_are_partitioned_by_hour_and_levels_by_day(pg_store) -> None:
    engine, sessions, target_id = pg_store
    with engine.begin() as conn:
        assert partitions.ensure_ahead(conn, T0 + 30 * 60) == 25 + 4  # raw: 25 hours, levels: 4 days
    raw, levels = spans(engine, "scrape_samples"), spans(engine, "sample_levels")
    assert (T0, T0 + HOUR) in raw and (T0 + DAY, T0 + DAY + HOUR) in raw
    assert all(b - a == HOUR for a, b in raw) and all(b - a == DAY for a, b in levels)
    assert (T0, T0 + DAY) in levels and (T0 + 3 * DAY, T0 + 4 * DAY) in levels
    # the scrapes of 3 hours land in their hours' partitions, none in the default one
    SampleWriter(engine).write([record(target_id, T0 + i * 900.0, (1.0,) * 5, 1.0, 1.0) for i in range(12)])
    assert rows_by_partition(engine, "scrape_samples") == {
        "scrape_samples_h2023111500": 4, "scrape_samples_h2023111501": 4, "scrape_samples_h2023111502": 4}
    # a raw cut-off inside the third hour: the first two hours go, whole; the third stays
    with engine.begin() as conn:
        assert partitions.drop_before(conn, "scrape_samples", T0 + 2 * HOUR + 1) == 2
    assert rows_by_partition(engine, "scrape_samples") == {"scrape_samples_h2023111502": 4}


def test_rows_without_a_partition_wait_in_the_default_and_move_to_their_hour(pg_store) -> None:
    engine, sessions, target_id = pg_store
    SampleWriter(engine).write([record(target_id, T0 + 10 * HOUR + i * 60.0, (1.0,) * 5, 1.0, 1.0)
                                for i in range(90)])  # 1.5 hours written before any partition of that day exists
    assert rows_by_partition(engine, "scrape_samples") == {"scrape_samples_default": 90}
    with engine.begin() as conn:
        created = partitions.ensure(conn, "scrape_samples", T0 + 9 * HOUR, T0 + 9 * HOUR)
    assert created == 3  # the asked hour and the two holding the default partition's rows
    assert rows_by_partition(engine, "scrape_samples") == {
        "scrape_samples_h2023111510": 60, "scrape_samples_h2023111511": 30}


def test_day_partitions_of_an_older_layout_are_kept_until_they_expire(pg_store) -> None:
    """A span already covered by a longer partition (raw tables partitioned by day, as
    they were before hour partitions): no hour partition is made inside it (PostgreSQL
    refuses overlapping partitions), the hours after it get theirs, and the day goes whole
    once it ends before the cut-off."""
    engine, sessions, target_id = pg_store
    with engine.begin() as conn:
        conn.execute(text('CREATE TABLE "scrape_samples_d20231115" (LIKE "scrape_samples")'))
        conn.execute(text(f'ALTER TABLE "scrape_samples" ATTACH PARTITION "scrape_samples_d20231115" '
                          f"FOR VALUES FROM ({T0!r}) TO ({T0 + DAY!r})"))
        created = partitions.ensure(conn, "scrape_samples", T0 + 20 * HOUR, T0 + 26 * HOUR)
    assert created == 3  # 24:00, 25:00, 26:00 of the 15th; hours 20-23 are in the day partition
    raw = [s for s in spans(engine, "scrape_samples") if s[0] < T0 + 7 * DAY]  # not the migration's, of today
    assert raw == [(T0, T0 + DAY), *((T0 + h * HOUR, T0 + (h + 1) * HOUR) for h in (24, 25, 26))]
    SampleWriter(engine).write([record(target_id, T0 + h * HOUR, (1.0,) * 5, 1.0, 1.0) for h in (23, 24)])
    assert rows_by_partition(engine, "scrape_samples") == {"scrape_samples_d20231115": 1,
                                                              "scrape_samples_h2023111600": 1}
    with engine.begin() as conn:
        assert partitions.drop_before(conn, "scrape_samples", T0 + DAY - 1) == 0
        assert partitions.drop_before(conn, "scrape_samples", T0 + DAY + HOUR) == 2
    assert rows_by_partition(engine, "scrape_samples") == {}
