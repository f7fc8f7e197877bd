"""Query plans of the statements a read runs, on SQLite and PostgreSQL: for tests that a read
looks rows up in an index instead of scanning a table that grows with the history."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, event


@contextmanager
def executed(engine: Engine, parameters: bool = False) -> Iterator[list]:
    """The SQL statements run on ``engine`` inside the block, in order; with ``parameters``,
    each as (statement, parameters), for :func:`plan`."""
    statements: list = []

    def keep(conn, cursor, statement, params, context, executemany) -> None:
        statements.append((statement, params) if parameters else statement)

    event.listen(engine, "before_cursor_execute", keep)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", keep)


def plan(engine: Engine, statement: str, parameters: object) -> list[str]:
    """The plan's lines: SQLite's ``EXPLAIN QUERY PLAN`` steps; PostgreSQL's ``EXPLAIN`` with
    sequential scans off, since on a test's few rows it would otherwise scan everything."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return [row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
        conn.exec_driver_sql("SET enable_seqscan = off")
        return [row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)]
