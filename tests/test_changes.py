"""app/runtime/changes.py: what moves the process' change count (a kept answer is reused only while it
stands still: app/api/coalesce.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from app.runtime.changes import Changing, changes
from app.store import db
from app.store.models import Target
from app.store.writer import SampleWriter
from tests.store.test_storage import record


def test_a_commit_moves_the_count_when_it_starts_and_when_its_connection_is_back_a_read_does_not(
        tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'changes.db'}")
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (a INTEGER)"))
        before = changes.current
        with engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM t")).scalar() == 0
        with db.make_sessionmaker(engine)() as session:
            session.execute(text("SELECT * FROM t")).all()
        assert changes.current == before  # reads change nothing
        with engine.connect() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
            connection.commit()
            assert changes.current == before + 1  # as the commit began
        assert changes.current == before + 2  # and once it was done and the connection back in the pool
    finally:
        engine.dispose()


def test_a_transaction_that_only_read_is_no_change_even_committed_and_a_rolled_back_write_leaves_nothing(
        tmp_path: Path) -> None:
    """The alert delivery polls its outbox every second in a transaction it commits; counted,
    that alone made every kept answer useless within a second."""
    engine = db.make_engine(f"sqlite:///{tmp_path / 'changes.db'}")
    try:
        with engine.begin() as connection:
            connection.execute(text("CREATE TABLE t (a INTEGER)"))
        before = changes.current
        with engine.begin() as connection:  # commits
            connection.execute(text("  select count(*) FROM t"))
            connection.execute(text("PRAGMA foreign_keys"))
        with db.make_sessionmaker(engine).begin() as session:  # commits too
            session.execute(text("SELECT * FROM t")).all()
        assert changes.current == before
        with engine.connect() as connection:
            connection.execute(text("INSERT INTO t VALUES (1)"))
            connection.rollback()  # the write is undone: no change
            connection.execute(text("SELECT * FROM t")).all()
            connection.commit()  # and a read after it on the same connection is none either
        assert changes.current == before
        with engine.begin() as connection:
            connection.execute(text("UPDATE t SET a = 2"))  # a write that matched no row still counts
        assert changes.current == before + 2
    finally:
        engine.dispose()


def test_what_the_scrape_writer_stores_is_no_change_the_same_engine_s_other_writes_are(store) -> None:
    """Scraped samples reach a kept answer by its age (``read_max_age``), like the clock; they
    come every half second and would otherwise keep every answer from being reused."""
    engine, sessions, target_id = store
    before = changes.current
    writer = SampleWriter(engine)
    assert writer.write([record(target_id, 1_700_000_000.0 + 15 * i, (1.0, 2.0, 3.0, 4.0, 4.0 + i), 2.5, 100.0 * i)
                         for i in range(3)]) == 3
    assert changes.current == before
    with sessions.begin() as session:
        session.get(Target, target_id).scrape_interval = 30.0
    assert changes.current == before + 2


def test_assigning_a_changing_attribute_is_a_change() -> None:
    class Holder:
        result = Changing[list[int]]()

    holder = Holder()
    assert holder.result is None  # unset
    before = changes.current
    holder.result = [1, 2]
    assert holder.result == [1, 2] and changes.current == before + 1
    holder.result = None
    assert holder.result is None and changes.current == before + 2
