"""PostgreSQL: the sample tables are partitioned by time, so retention drops whole partitions.

``scrape_samples`` (the raw samples) is partitioned on ``ts`` by UTC hour, named
``<table>_hYYYYMMDDHH``; ``sample_levels`` on ``bucket`` by UTC day, ``<table>_dYYYYMMDD``
(``PARTITION BY RANGE``). Dropping a partition is a catalog operation: no row-by-row
``DELETE``, no scan of the table, no dead rows for vacuum. A partition holds rows until its
whole span is older than the cut-off, so the tables hold up to one span (plus the prune
interval) more than their retention: hours for the raw samples (their 24 h would be up to 48 h
with days, doubling the raw rows, the largest table), a day for the levels (7 days of
retention, read by windows of up to 7 days: hour partitions would multiply the partitions a
7-day read visits by 24).

Partitions are created ahead (``ahead`` of :data:`PARTITIONED`) by the migration and by every
prune round, as a plain table then ``ATTACH PARTITION``: that locks the parent against other
schema changes only, where ``CREATE TABLE ... PARTITION OF`` locks out every read and write
of it until the statement ends. A ``<table>_default`` partition catches a sample whose span
has no partition yet (a clock far ahead, history written in the past), so a write is never
refused; ``ensure`` moves such rows into their own partition when it creates it. A span
already covered by a longer partition (the day partitions raw tables had before hour ones)
keeps it until it expires; hour partitions are only made for hours no partition covers.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import NamedTuple

from sqlalchemy import text
from sqlalchemy.engine import Connection

HOUR, DAY = 3600, 86400


class Layout(NamedTuple):
    column: str  # the partition key
    span: int  # seconds per partition
    ahead: int  # seconds of partitions made ahead of now


PARTITIONED = {"scrape_samples": Layout("ts", HOUR, DAY), "sample_levels": Layout("bucket", DAY, 3 * DAY)}
#: The raw tables of one row per series and scrape, before migration 0012 (its downgrade
#: and the migrations before it make their partitions).
FORMER = {"histogram_samples": Layout("ts", HOUR, DAY), "scalar_samples": Layout("ts", HOUR, DAY)}
_NAME = re.compile(r"_(?:d(\d{8})|h(\d{10}))$")


def layout_of(table: str) -> Layout:
    return PARTITIONED[table] if table in PARTITIONED else FORMER[table]


def partition_name(table: str, start: float) -> str:
    when = dt.datetime.fromtimestamp(start, dt.UTC)
    return f"{table}_h{when:%Y%m%d%H}" if layout_of(table).span == HOUR else f"{table}_d{when:%Y%m%d}"


def span_of(name: str) -> tuple[float, float] | None:
    """The ``[start, end)`` a partition's name says it holds; None for the default partition."""
    m = _NAME.search(name)
    if m is None:
        return None
    if m.group(1):
        start = dt.datetime.strptime(m.group(1), "%Y%m%d").replace(tzinfo=dt.UTC).timestamp()
        return start, start + DAY
    start = dt.datetime.strptime(m.group(2), "%Y%m%d%H").replace(tzinfo=dt.UTC).timestamp()
    return start, start + HOUR


def partitions_of(conn: Connection, table: str) -> list[str]:
    return list(conn.scalars(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t ORDER BY c.relname"), {"t": table}))


def _create(conn: Connection, table: str, start: float, has_default: bool) -> None:
    column, span, _ = layout_of(table)
    name, end = partition_name(table, start), start + span
    conn.execute(text(f'CREATE TABLE "{name}" (LIKE "{table}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'))
    if has_default and conn.scalar(text(f'SELECT 1 FROM "{table}_default" WHERE {column} >= :a AND {column} < :b '
                                        "LIMIT 1"), {"a": start, "b": end}):
        # rows of that span went to the default partition: move them into the new table
        conn.execute(text(f'WITH moved AS (DELETE FROM "{table}_default" WHERE {column} >= :a AND {column} < :b '
                          f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved'), {"a": start, "b": end})
    conn.execute(text(f'ALTER TABLE "{table}" ATTACH PARTITION "{name}" FOR VALUES FROM ({start!r}) TO ({end!r})'))


def ensure(conn: Connection, table: str, start: float, end: float) -> int:
    """Create the partitions covering ``[start, end]``, and those of any span whose rows are
    in the default partition, that no partition covers yet; how many."""
    column, span, _ = layout_of(table)
    existing = partitions_of(conn, table)
    covered = [s for s in map(span_of, existing) if s is not None]
    has_default = f"{table}_default" in existing
    wanted = set()
    at = start // span * span
    while at <= end:
        wanted.add(at)
        at += span
    if has_default:
        wanted.update(float(k) * span for k in conn.scalars(text(
            f'SELECT DISTINCT floor({column} / {span}) FROM "{table}_default"')))
    created = 0
    for at in sorted(wanted):
        if not any(a < at + span and at < b for a, b in covered):
            _create(conn, table, at, has_default)
            covered.append((at, at + span))
            created += 1
    if not has_default:
        conn.execute(text(f'CREATE TABLE "{table}_default" PARTITION OF "{table}" DEFAULT'))
    return created


def ensure_ahead(conn: Connection, now: float) -> int:
    """Every partitioned table's partitions from now to its ``ahead``."""
    return sum(ensure(conn, table, now, now + layout.ahead) for table, layout in PARTITIONED.items())


def drop_before(conn: Connection, table: str, before: float) -> int:
    """Drop the partitions of ``table`` that end at or before ``before`` and delete the
    default partition's older rows; returns partitions dropped."""
    dropped = 0
    names = partitions_of(conn, table)
    for name in names:
        held = span_of(name)
        if held is not None and held[1] <= before:
            conn.execute(text(f'DROP TABLE "{name}"'))
            dropped += 1
    if f"{table}_default" in names:
        conn.execute(text(f'DELETE FROM "{table}_default" WHERE {layout_of(table).column} < :b'), {"b": before})
    return dropped
