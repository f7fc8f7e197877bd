"""Stopping the service closes every database connection it opened, including one a worker
thread (a round, a delivery, a write) still holds when the stop begins."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import Engine, event, text

from tests.api.conftest import make_service


def hold_a_connection(engine: Engine, held: list[int], holding: threading.Event, release: threading.Event) -> None:
    """What a round in a worker thread does: a connection checked out until it finishes."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
        held.append(id(connection.connection.dbapi_connection))
        holding.set()
        release.wait(30)


def test_stop_waits_for_a_connection_a_worker_thread_still_holds(migrated_url: str, tmp_path: Path) -> None:
    closed: list[int] = []
    held: list[int] = []
    holding, release = threading.Event(), threading.Event()
    for svc in make_service(migrated_url, tmp_path):
        engine = svc.monitor.engine
        event.listen(engine, "close", lambda dbapi_connection, record: closed.append(id(dbapi_connection)))
        worker = threading.Thread(target=hold_a_connection, args=(engine, held, holding, release))
        worker.start()
        assert holding.wait(30)
        # the round finishes while the service is stopping (leaving TestClient runs the stop)
        threading.Timer(0.3, release.set).start()
    worker.join(30)
    assert not worker.is_alive()
    assert engine.pool.checkedout() == 0
    assert held[0] in closed  # closed by the stop's dispose, not left to the garbage collector


def test_a_reload_that_read_the_targets_before_a_new_one_never_drops_its_scraper(migrated_url: str,
                                                                                 tmp_path: Path) -> None:
    """A heartbeat's reload reads the targets, then a target is created through the API (its
    own reload), then the heartbeat's reload goes on with what it read: one reload at a time,
    so the new target's scraper is there afterwards (interleaved, the stale reload removed it)."""
    running = make_service(migrated_url, tmp_path, replica_heartbeat="1h", replica_expiry="2h")
    svc = next(running)
    try:
        monitor = svc.monitor
        read_first, go_on = threading.Event(), threading.Event()
        original = monitor.target_specs
        calls: list[list[str]] = []

        def specs_then_wait():  # the first reload reads, then waits; the others just read
            specs = original()
            calls.append([s.name for s in specs])
            if len(calls) == 1:
                read_first.set()
                assert go_on.wait(30)
            return specs

        monitor.target_specs = specs_then_wait  # type: ignore[method-assign]
        stale = svc.client.portal.start_task_soon(monitor.reload_targets)
        assert read_first.wait(30)
        threading.Timer(0.5, go_on.set).start()  # the heartbeat's reload goes on while the POST waits
        assert svc.client.post("/api/v1/targets", json={"name": "late",
                                                        "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        stale.result(30)
        assert "late" in monitor.scraping.scrapers
        # the write's reload (and any other queued meanwhile) read the targets after the stale one had synced
        assert calls[0] == [] and calls[1:] and all(names == ["late"] for names in calls[1:])
    finally:
        running.close()  # leaves the service's TestClient: the stop


def connect_after_the_dispose(engine: Engine, opened: list[object]) -> None:
    """What work handed to a thread just before the stop does when it reaches the database
    only after the stop disposed the engine (``dispose`` replaces the pool)."""
    stopped_pool = engine.pool
    deadline = time.monotonic() + 30
    while engine.pool is stopped_pool and time.monotonic() < deadline:
        time.sleep(0.01)
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
        opened.append(connection.connection.dbapi_connection)


def test_a_connection_a_worker_thread_opens_after_the_stop_disposed_the_engine_is_closed(
        migrated_url: str, tmp_path: Path) -> None:
    """Work handed to a thread just before the stop (a delivery poll, a round, a detected engine's
    write) may reach the database only after the stop found no connection in use and disposed
    the engine: its connection came from the new pool nobody disposes, and was left open for
    the garbage collector (psycopg's "deleted while still open" warning, in a later test)."""
    opened: list[object] = []
    for svc in make_service(migrated_url, tmp_path):
        engine = svc.monitor.engine
        worker = threading.Thread(target=connect_after_the_dispose, args=(engine, opened))
        worker.start()
    worker.join(30)
    assert not worker.is_alive() and opened
    assert engine.pool.checkedout() == 0
    # closed when it was returned, not kept in a pool that is never disposed
    assert getattr(opened[0], "closed", None) is True or _sqlite_closed(opened[0])


def _sqlite_closed(dbapi: object) -> bool:
    import sqlite3

    if not isinstance(dbapi, sqlite3.Connection):
        return False
    try:
        dbapi.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return True
    return False
