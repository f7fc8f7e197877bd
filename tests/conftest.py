"""Shared fixtures. Storage and API suites run twice: on SQLite and on real PostgreSQL.

PostgreSQL: ``LLM_LATENCY_TEST_POSTGRES_URL`` (default: the local server, trust auth,
database ``test``). Each test session creates its own database and drops it at the end,
so parallel runs and leftovers cannot interfere. Under ``CI=true`` an unreachable
PostgreSQL fails the tests that need it instead of skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support.components import missing_component

#: Every read computed anew: the tests of other features read right after writing behind the API's
#: back (a scrape stored, a heartbeat), which a reused answer shows only once it is read_max_age old
#: (app/changes.py). tests/api/test_coalesce.py tests the reuse with its own setting; a service
#: started by a test as a process inherits this.
os.environ.setdefault("LLM_LATENCY_READ_MAX_AGE", "0")
POSTGRES_ADMIN_URL = os.environ.get("LLM_LATENCY_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FIXTURES = Path(__file__).parent / "fixtures"


@dataclass
class ScratchDatabase:
    url: str
    drop: Callable[[], None]  # drops it now, its connections terminated (an outage, for a test)


@contextmanager
def scratch_postgres_database(prefix: str = "llm_latency_test") -> Iterator[ScratchDatabase]:
    """A new PostgreSQL database, dropped on exit (and its connections terminated); fails,
    or skips outside CI, when PostgreSQL is not reachable."""
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        missing_component(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}: {type(exc).__name__}: {exc}")

    def drop() -> None:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    try:
        yield ScratchDatabase(make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False),
                              drop)
    finally:
        drop()
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session; yields its URL."""
    with scratch_postgres_database() as database:
        yield database.url


def _reset_postgres(url: str) -> None:
    """Drop every table (and Alembic's version table) so each test starts from nothing."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text("DROP SCHEMA public CASCADE"))
        connection.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema yet) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    url = request.getfixturevalue("postgres_database")
    _reset_postgres(url)
    yield url


@pytest.fixture
def migrated_url(database_url: str) -> str:
    from app.store.db import upgrade

    upgrade(database_url)
    return database_url


@pytest.fixture
def store(migrated_url: str) -> Iterator[tuple]:
    """A migrated database with one target ``t1``: (SQLAlchemy engine, sessionmaker, target id)."""
    from app.store import db, repository

    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    with sessions.begin() as session:
        target = repository.create_target(session, name="t1", url="http://127.0.0.1:1/metrics", engine="auto",
                                          labels={}, scrape_interval=15.0, scrape_timeout=5.0)
        target_id = target.id
    yield engine, sessions, target_id
    engine.dispose()
