"""PostgreSQL: the sample tables are partitioned by day, so retention drops whole partitions.

``histogram_samples`` and ``scalar_samples`` are partitioned on ``ts``, ``sample_levels`` on
``bucket`` (``PARTITION BY RANGE``, one partition per UTC day named ``<table>_dYYYYMMDD``).
Dropping a day is a catalog operation: no row-by-row ``DELETE``, no scan of the table, no
dead rows for vacuum. Partitions are created ahead (:data:`DAYS_AHEAD`) by the migration
and by every prune round; a ``<table>_default`` partition catches a sample whose day has
no partition yet (a clock far ahead), so a write is never refused - its rows are deleted by
time like before.
"""

from __future__ import annotations

import datetime as dt
import re

from sqlalchemy import text
from sqlalchemy.engine import Connection

DAY = 86400
DAYS_AHEAD = 3
#: table -> partition key column
PARTITIONED = {"histogram_samples": "ts", "scalar_samples": "ts", "sample_levels": "bucket"}
_NAME = re.compile(r"_d(\d{8})$")


def partition_name(table: str, day_start: float) -> str:
    return f"{table}_d{dt.datetime.fromtimestamp(day_start, dt.UTC):%Y%m%d}"


def _day_of(name: str) -> float | None:
    m = _NAME.search(name)
    if m is None:
        return None
    return dt.datetime.strptime(m.group(1), "%Y%m%d").replace(tzinfo=dt.UTC).timestamp()


def partitions_of(conn: Connection, table: str) -> list[str]:
    return list(conn.scalars(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t ORDER BY c.relname"), {"t": table}))


def _create(conn: Connection, table: str, day: float, has_default: bool) -> None:
    name, bounds = partition_name(table, day), f"FROM ({day!r}) TO ({day + DAY!r})"
    column = PARTITIONED[table]
    if has_default and conn.scalar(text(f'SELECT 1 FROM "{table}_default" WHERE {column} >= :a AND {column} < :b '
                                        "LIMIT 1"), {"a": day, "b": day + DAY}):
        # rows of that day went to the default partition: move them into the new day's table
        conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
        conn.execute(text(f'WITH moved AS (DELETE FROM "{table}_default" WHERE {column} >= :a AND {column} < :b '
                          f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved'), {"a": day, "b": day + DAY})
        conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES {bounds}'))
    else:
        conn.execute(text(f'CREATE TABLE "{name}" PARTITION OF "{table}" FOR VALUES {bounds}'))


def ensure(conn: Connection, table: str, start: float, end: float) -> int:
    """Create the day partitions covering ``[start, end]``, and those of any day whose rows
    are in the default partition, that do not exist; how many."""
    existing = set(partitions_of(conn, table))
    has_default = f"{table}_default" in existing
    days = set()
    day = start // DAY * DAY
    while day <= end:
        days.add(day)
        day += DAY
    if has_default:
        column = PARTITIONED[table]
        days.update(float(d) * DAY for d in conn.scalars(text(
            f'SELECT DISTINCT floor({column} / {DAY}) FROM "{table}_default"')))
    created = 0
    for day in sorted(days):
        if partition_name(table, day) not in existing:
            _create(conn, table, day, has_default)
            created += 1
    if not has_default:
        conn.execute(text(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT'))
    return created


def ensure_ahead(conn: Connection, now: float) -> int:
    """Every partitioned table's partitions from today to :data:`DAYS_AHEAD` days ahead."""
    return sum(ensure(conn, table, now, now + DAYS_AHEAD * DAY) for table in PARTITIONED)


def drop_before(conn: Connection, table: str, before: float) -> int:
    """Drop the day partitions of ``table`` that end at or before ``before`` and delete the
    default partition's older rows; returns partitions dropped."""
    dropped = 0
    for name in partitions_of(conn, table):
        day = _day_of(name)
        if day is not None and day + DAY <= before:
            conn.execute(text(f'DROP TABLE "{name}"'))
            dropped += 1
    column = PARTITIONED[table]
    if f"{table}_default" in partitions_of(conn, table):
        conn.execute(text(f'DELETE FROM "{table}_default" WHERE {column} < :b'), {"b": before})
    return dropped
