"""app/changes.py: what moves the process' change count (a kept answer is reused only while it
stands still: app/api/coalesce.py)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from app.changes import Changing, changes
from app.store import db


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
