"""Stopping the service closes every database connection it opened, including one a worker
thread (a round, a delivery, a write) still holds when the stop begins."""

from __future__ import annotations

import threading
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
