"""Engine creation and migrations.

The service uses SQLAlchemy's synchronous engine: scrapes are written by one writer
thread in batches and API handlers run in FastAPI's thread pool, so an async driver
would add complexity without removing any waiting.
"""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from alembic import command
from app.resources import migrations_dir

#: Connections per process: anyio's default 40 API worker threads, the scrape writer and the
#: rounds' threads each get one without waiting (the old 5 + 10 gave 500s under 50 clients:
#: "QueuePool limit of size 5 overflow 10 reached"). PostgreSQL's default max_connections
#: (100) holds two replicas at their peak.
POOL_SIZE, POOL_OVERFLOW, POOL_TIMEOUT = 10, 40, 60.0


def make_engine(url: str, echo: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        # Pool: every API worker thread (anyio's 40) plus the writer and the rounds can hold a
        # connection at once, so 50 concurrent clients queue for a thread, never for the pool.
        engine = create_engine(url, echo=echo, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW, pool_timeout=POOL_TIMEOUT)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):
            # WAL lets the API read while the writer writes; NORMAL sync is durable
            # across process crashes (only an OS crash can lose the last commits).
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, echo=echo, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW,
                         pool_timeout=POOL_TIMEOUT)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    """Alembic's configuration without alembic.ini: the migrations wherever this
    installation has them (app.resources), the database from ``url``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
