"""Engine creation and migrations.

The service uses SQLAlchemy's synchronous engine: scrapes are written by one writer
thread in batches and API handlers run in FastAPI's thread pool, so an async driver
would add complexity without removing any waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from alembic import command
from app.runtime.budget import BudgetExceeded, RequestBudget
from app.runtime.changes import changes
from app.runtime.resources import migrations_dir

#: Connections per process: anyio's default 40 API worker threads, the scrape writer and the
#: rounds' threads each get one without waiting (a smaller pool answers 500s under 50 clients:
#: "QueuePool limit ... reached"). PostgreSQL's default max_connections (100) holds two
#: replicas at their peak.
POOL_SIZE, POOL_OVERFLOW, POOL_TIMEOUT = 10, 40, 60.0


def sqlite_path(url: str) -> Path | None:
    """The absolute path of a SQLite database file; None for another database or one in memory."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).resolve()


def make_engine(url: str, echo: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = sqlite_path(url)
        if database is not None:
            database.parent.mkdir(parents=True, exist_ok=True)
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

        return _counting_commits(engine)
    return _counting_commits(create_engine(url, echo=echo, pool_pre_ping=True, pool_size=POOL_SIZE,
                                           max_overflow=POOL_OVERFLOW, pool_timeout=POOL_TIMEOUT))


#: How a statement that only reads begins; any other statement makes its transaction a change.
READING_STATEMENTS = ("select", "pragma", "show", "set ", "savepoint", "release", "explain")
#: The execution option that keeps a connection's commits from counting as changes (what the scrape
#: writer stores: :mod:`app.runtime.changes` says why).
NOT_A_CHANGE = "not_a_change"


def _counting_commits(engine: Engine) -> Engine:
    """Every commit of a transaction that wrote moves :data:`app.runtime.changes.changes` when it starts
    and again when its connection is back in the pool, after the commit completed (why twice:
    :mod:`app.runtime.changes`). A transaction that only read (the alert delivery's poll of its outbox
    every second, say) is no change, nor is one on a connection with the :data:`NOT_A_CHANGE`
    execution option."""

    @event.listens_for(engine, "before_cursor_execute")
    def _executing(connection, _cursor, statement: str, *_args) -> None:
        if (not statement.lstrip()[:9].lower().startswith(READING_STATEMENTS)
                and not connection.get_execution_options().get(NOT_A_CHANGE)):
            connection.connection.info["wrote"] = True  # the pool record's info

    @event.listens_for(engine, "commit")
    def _committing(connection) -> None:
        info = connection.connection.info
        if info.pop("wrote", False):
            info["committed"] = True
            changes.bump()

    @event.listens_for(engine, "rollback")
    def _rolled_back(connection) -> None:
        connection.connection.info.pop("wrote", None)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection, record) -> None:
        if record is not None and record.info.pop("committed", False):
            changes.bump()

    return engine


#: How often (SQLite virtual-machine instructions) a running statement checks a request's budget.
SQLITE_PROGRESS_STEPS = 10_000
PG_QUERY_CANCELED = "57014"  # SQLSTATE of a statement ended by statement_timeout


@contextmanager
def statement_budget(session: Session, budget: RequestBudget) -> Iterator[None]:
    """Bound every statement ``session`` runs in the block by what is left of ``budget``:
    PostgreSQL ends one at ``statement_timeout`` (``SET LOCAL``: this transaction only), SQLite
    interrupts one from its progress handler. Either raises :class:`BudgetExceeded`, so a
    single long read gets the same 503 as a long computation."""
    connection = session.connection()
    postgres = connection.dialect.name == "postgresql"
    raw = None
    if postgres:
        connection.execute(text(f"SET LOCAL statement_timeout = {max(1, int(budget.remaining() * 1000))}"))
    elif connection.dialect.name == "sqlite":
        raw = connection.connection.dbapi_connection
        raw.set_progress_handler(lambda: 1 if budget.remaining() < 0 else 0, SQLITE_PROGRESS_STEPS)  # type: ignore[union-attr]
    try:
        yield
    except OperationalError as exc:
        timed_out = getattr(exc.orig, "sqlstate", None) == PG_QUERY_CANCELED if postgres else \
            "interrupted" in str(exc.orig)
        if timed_out:
            raise BudgetExceeded(budget.seconds, budget.checks) from None
        raise
    finally:
        if raw is not None:
            raw.set_progress_handler(None, 0)  # the connection goes back to the pool


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def write_transaction(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """A session in one transaction that reads and then writes, committed at the end.

    On SQLite it takes the write lock when it begins (``BEGIN IMMEDIATE``, waiting up to the
    busy timeout for the scrape writer's batch): in WAL mode a transaction that has read cannot
    start writing once another connection has committed since (SQLITE_BUSY_SNAPSHOT, "database
    is locked" at once, no busy wait), and pysqlite leaves a SAVEPOINT's transaction deferred.
    Other writers wait for it instead; readers never do. PostgreSQL needs nothing of this."""
    with sessions.begin() as session:
        connection = session.connection()
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield session


def alembic_config(url: str) -> Config:
    """Alembic's configuration without alembic.ini: the migrations wherever this
    installation has them (app.runtime.resources), the database from ``url``."""
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
