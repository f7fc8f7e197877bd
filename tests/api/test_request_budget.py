"""Expensive reads are bounded: past ``api_request_budget`` they end with a 503 naming the
budget, and a client that disconnects stops the work (counted in checks, not wall time)."""

from __future__ import annotations

import html
import logging
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app import summaries
from app.runtime.budget import POLL_EVERY, BudgetExceeded, ClientGone, RequestBudget, bounded, checkpoint
from app.sources.base import HISTOGRAM_SIGNALS
from app.store import db, repository, writer
from app.store.db import statement_budget
from app.targets import repository as target_repository
from app.windows import default_windows
from tests.api.conftest import Service, make_service
from tests.status.helpers import history_records

SPENT = ("the request exceeded its time budget of 1e-06 s (LLM_LATENCY_API_REQUEST_BUDGET); "
         "ask for a shorter window, fewer targets or a larger step")
QUIET = {"summary_interval": "1h", "alert_interval": "1h", "delivery_interval": "1h", "downsample_interval": "1h",
         "replica_heartbeat": "1h", "replica_expiry": "2h"}


def _fleet(service: Service, n: int) -> float:
    """``n`` targets with an hour of minute-spaced history each; returns its end."""
    end = float(int(time.time()))
    for i in range(n):
        assert service.client.post("/api/v1/targets", json={"name": f"t{i:02d}",
                                                            "url": "http://127.0.0.1:9/metrics"}).status_code == 201
    with service.monitor.sessions() as session:
        ids = [t.id for t in target_repository.list_targets(session)]
    service.monitor.scraping.writer.write(history_records(ids, end, snapshots=61))
    return end


def test_a_budget_is_spent_at_an_exact_check_on_a_simulated_clock() -> None:
    ticks = iter(range(1000))
    budget = RequestBudget(10.0, clock=lambda: float(next(ticks)))  # created at 0; every check advances 1 s
    with bounded(budget), pytest.raises(BudgetExceeded) as caught:
        for _ in range(100):
            checkpoint()
    assert caught.value.checks == 11 and budget.checks == 11  # 11 s > 10 s at the 11th check
    assert "time budget of 10 s (LLM_LATENCY_API_REQUEST_BUDGET)" in str(caught.value)
    checkpoint()  # outside a budget: nothing happens
    assert budget.checks == 11


def test_a_disconnected_client_stops_the_fleet_computation_early(quiet_service: Service) -> None:
    end = _fleet(quiet_service, 25)
    sessions = quiet_service.monitor.sessions
    polls: list[int] = []
    full = RequestBudget(3600.0, disconnected=lambda: polls.append(1) is not None)  # always there
    with sessions() as session, bounded(full):
        report = summaries.fleet_report(session, default_windows(), 3600.0, end)
    assert len(report["targets"]) == 25 and report["ttft"]["count"] > 0
    assert full.checks > 10 * (POLL_EVERY + 1)  # the whole fleet: one check per series and window combined
    assert len(polls) == (full.checks - 1) // POLL_EVERY + 1

    answers = iter([False, True])  # there at the first poll, gone at the second
    gone = RequestBudget(3600.0, disconnected=lambda: next(answers))
    with sessions() as session, bounded(gone), pytest.raises(ClientGone) as caught:
        summaries.fleet_report(session, default_windows(), 3600.0, end)
    assert caught.value.checks == gone.checks == POLL_EVERY + 1  # stopped at the second poll
    assert gone.checks * 10 < full.checks  # a tenth of the work, or less


def _asgi_get(service: Service, path: str, query: str) -> list[dict]:
    """GET through the whole ASGI stack with a client that disconnects right after its request."""
    app = service.client.app
    incoming = [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"testserver")], "client": ("127.0.0.1", 50000), "server": ("testserver", 80)}
    service.client.portal.call(app, scope, receive, send)
    return sent


#: read -> (targets in the fleet, path, what a client that stays gets)
STOPPED_READS = {
    "fleet view": (20, "/api/v1/latency", lambda r: r.json()["ttft"]["count"] > 0),
    "target page": (1, "/targets/t00",
                    lambda r: "<h1>t00</h1>" in r.text and "TTFT over the last 60 min: p50" in r.text),
}


@pytest.mark.parametrize("read", sorted(STOPPED_READS))
def test_a_read_whose_client_went_away_stops(quiet_service: Service, caplog: pytest.LogCaptureFixture,
                                            read: str) -> None:
    targets, path, whole = STOPPED_READS[read]
    _fleet(quiet_service, targets)
    stopped = quiet_service.monitor.telemetry.requests_stopped
    with caplog.at_level(logging.INFO, logger="app.api.errors"):
        sent = _asgi_get(quiet_service, path, "window=1h")
    assert sent[0]["status"] == 499
    # the first poll found the request, the second (POLL_EVERY checks later) the disconnect
    assert f"the work stopped after {POLL_EVERY + 1} checks" in caplog.text
    assert stopped.labels("disconnect")._value.get() == 1.0
    assert stopped.labels("budget")._value.get() == 0.0
    # a client that stays gets the whole answer
    response = quiet_service.client.get(path, params={"window": "1h"})
    assert response.status_code == 200 and whole(response)


def test_a_request_past_its_budget_gets_503_naming_it(migrated_url: str, tmp_path: Path) -> None:
    for service in make_service(migrated_url, tmp_path, api_request_budget=1e-6, **QUIET):
        _fleet(service, 2)
        c = service.client
        for path, params in (("/api/v1/targets/t00/latency", {"window": "1h"}),
                             ("/api/v1/targets/t00/series", {"window": "1h", "step": "1m"}),
                             ("/api/v1/latency", {"window": "1h"})):
            response = c.get(path, params=params)
            assert response.status_code == 503, (path, response.text)
            assert response.json()["detail"] == SPENT
            assert response.headers["retry-after"] == "30"
        assert service.monitor.telemetry.requests_stopped.labels("budget")._value.get() == 3.0
        service.monitor.refresh_summaries()  # the fleet's default window is the round's: nothing to compute
        assert c.get("/api/v1/latency").status_code == 200


def test_the_status_pages_past_their_budget_get_503_naming_it(migrated_url: str, tmp_path: Path) -> None:
    """The target's page and an index the round's summaries do not answer compute a window for
    the request: past the budget they answer a short HTML page with the API's message."""
    config = tmp_path / "config.yaml"
    config.write_text("diagnosis:\n  interval: 1h\n")  # no round runs unless the test runs one
    for service in make_service(migrated_url, tmp_path, config_file=config, api_request_budget=1e-6, **QUIET):
        _fleet(service, 2)
        c = service.client
        stopped = service.monitor.telemetry.requests_stopped.labels("budget")
        for n, (path, params) in enumerate((("/targets/t00", {"window": "1h"}), ("/", {"window": "1h"})), 1):
            response = c.get(path, params=params)
            assert response.status_code == 503, (path, response.text)
            assert response.headers["content-type"].startswith("text/html")
            assert response.headers["retry-after"] == "30"
            assert f"<p>{html.escape(SPENT)}</p>" in response.text
            assert stopped._value.get() == float(n)  # one count per stopped page
        assert c.get("/targets/nobody").status_code == 404  # nothing to compute: no budget spent
        service.monitor.evaluate_diagnoses()  # the index's default window is the round's: nothing to compute
        index = c.get("/")
        assert index.status_code == 200 and 'data-target="t01"' in index.text
        assert stopped._value.get() == 2.0


def test_one_long_statement_is_ended_by_the_budget(migrated_url: str) -> None:
    """A single read that outlives the budget is ended by the database (PostgreSQL's
    statement_timeout, SQLite's progress handler) with the same BudgetExceeded, and the
    pooled connection carries no budget afterwards."""
    engine = db.make_engine(migrated_url)
    sessions = db.make_sessionmaker(engine)
    postgres = engine.dialect.name == "postgresql"
    slow = "SELECT pg_sleep(60)" if postgres else \
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000000) SELECT count(*) FROM c"
    try:
        with sessions() as session, pytest.raises(BudgetExceeded, match="time budget of 0.2 s"):
            with statement_budget(session, RequestBudget(0.2)):
                session.execute(text(slow))
        with sessions() as session:  # the same pooled connection, no budget: runs to the end
            if postgres:
                assert session.execute(text("SHOW statement_timeout")).scalar() == "0"
            counted = session.execute(text("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                                           "WHERE x < 200000) SELECT count(*) FROM c")).scalar()
            assert counted == 200000
    finally:
        engine.dispose()


def test_a_raw_read_interrupted_while_its_rows_are_fetched_is_ended_by_the_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite steps a read as its rows are fetched, so the progress handler can end a raw
    read after ``execute`` returned, inside the driver's ``fetchmany``: that error too comes
    out as BudgetExceeded, and the read runs to the end without a budget."""
    url = f"sqlite:///{tmp_path / 'raw.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            target_id = target_repository.create_target(session, name="t1", url="http://127.0.0.1:9/metrics").id
        end = float(int(time.time()))
        writer.SampleWriter(engine).write(history_records([target_id], end, snapshots=400, every=15.0))  # 100 min
        with sessions() as session:
            series = [s.id for s in repository.find_series(session, [target_id], HISTOGRAM_SIGNALS)]
            lo_ms, hi_ms = int((end - 7200) * 1000), int(end * 1000)
            whole = repository._raw_chunks(session, series, lo_ms, hi_ms, True)
            assert sorted(len(chunks) for chunks in whole.values()) == [400] * len(series)
            # 400 rows (a row a scrape) are ~3,500 of SQLite's steps: the handler every 100
            monkeypatch.setattr(db, "SQLITE_PROGRESS_STEPS", 100)
            calls = iter(range(10**6))  # every look at the clock advances it by 1 s
            budget = RequestBudget(3.0, clock=lambda: float(next(calls)))
            with pytest.raises(BudgetExceeded), statement_budget(session, budget):
                repository._raw_chunks(session, series, lo_ms, hi_ms, True)
            assert budget.checks == 0  # ended by the database's progress handler, not by a checkpoint
            assert next(calls) > 3  # the handler looked at the clock while the rows were fetched
    finally:
        engine.dispose()
