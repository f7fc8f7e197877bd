"""The stored diagnoses as the status page and ``/api/v1/diagnoses`` read them, on SQLite and
PostgreSQL: details decoded once per distinct text, every open finding's state."""

from __future__ import annotations

from sqlalchemy import event

from app.store import repository

PAYLOAD = {"severity": "warning", "confidence": 0.8, "primary": True, "summary": "s", "evidence": [],
           "remedies": ["r"], "runbook": "rb", "caused_by": None, "window": 300}


def test_latest_diagnoses_decode_each_stored_text_once_and_follow_every_change(store) -> None:
    _, sessions, target_id = store
    details = {"engine": "vllm", "findings": [{"regime": "queueing", "severity": "warning"}],
               "signals": {"waiting_mean": 12.5, "ttft_p99": 1.75}, "window": 300}
    with sessions.begin() as session:
        repository.save_diagnosis(session, target_id, "m1", "queueing", 1000.0, details)
        repository.save_diagnosis(session, target_id, "m2", "healthy", 1000.0, {"engine": "vllm", "findings": []})
    with sessions() as session:
        first = repository.latest_diagnoses(session)
        again = repository.latest_diagnoses(session)
    assert [(d.target, d.model, d.verdict, d.evaluated_at) for d in first] == [
        ("t1", "m1", "queueing", 1000.0), ("t1", "m2", "healthy", 1000.0)]
    assert first[0].details == details
    assert again[0].details is first[0].details  # the same text is not decoded again
    # the next round's details (same evaluation time, as a test's fixed clock gives) are read, not the cached ones
    changed = {**details, "signals": {"waiting_mean": 0.0, "ttft_p99": 0.25}}
    with sessions.begin() as session:
        repository.save_diagnosis(session, target_id, "m1", "healthy", 1000.0, changed)
    with sessions() as session:
        (one,) = repository.latest_diagnoses(session, target_id)[:1]
    assert one.verdict == "healthy" and one.details["signals"] == {"waiting_mean": 0.0, "ttft_p99": 0.25}


def test_open_finding_states_cover_every_open_finding(store) -> None:
    _, sessions, target_id = store
    with sessions.begin() as session:
        rows = [repository.create_finding(session, target_id, f"m{i:03d}", "queueing", 100.0 + i, PAYLOAD,
                                          flush=False) for i in range(600)]
        session.flush()
        for row in rows[:450]:
            repository.set_finding_state(session, row, "active", 900.0, flush=False)
        repository.set_finding_state(session, rows[599], "resolved", 950.0, flush=False)
    with sessions() as session:
        states = repository.open_finding_states(session)
        only = repository.open_finding_states(session, target_id + 1)
    # 599 open (more than the 500 newest a history read returns), the resolved one left out
    assert len(states) == 599 and only == {}
    assert states[("t1", "m000", "queueing")] == ("active", 900.0)
    assert states[("t1", "m598", "queueing")] == ("pending", None)
    assert ("t1", "m599", "queueing") not in states


def test_the_open_findings_of_all_targets_are_read_by_state_not_by_scanning_the_history(store) -> None:
    """Resolved findings stay as history and outnumber the open ones; the reads of every
    target's open findings (status page, diagnoses, each round) look them up in
    ``ix_findings_state`` instead of scanning that history."""
    engine, sessions, target_id = store
    with sessions.begin() as session:
        rows = [repository.create_finding(session, target_id, f"m{i:03d}", "queueing", 100.0 + i, PAYLOAD,
                                          flush=False) for i in range(40)]
        session.flush()
        for row in rows[:30]:
            repository.set_finding_state(session, row, "resolved", 900.0, flush=False)
    statements: list[tuple[str, object]] = []

    def keep(conn, cursor, statement, parameters, context, executemany) -> None:
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", keep)
    try:
        with sessions() as session:
            states = repository.open_finding_states(session)
            history = repository.finding_history(session, states=("pending", "active"))
            every_open = repository.all_open_findings(session)
    finally:
        event.remove(engine, "before_cursor_execute", keep)
    assert len(states) == len(history) == 10 and sum(map(len, every_open.values())) == 10
    assert len(statements) == 3
    with engine.connect() as conn:
        for statement, parameters in statements:
            if engine.dialect.name == "sqlite":
                plan = [row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
                assert not [step for step in plan if step.startswith("SCAN findings")], plan
                assert any(step.startswith("SEARCH findings USING INDEX ix_findings_state (state=?)")
                           for step in plan), plan
            else:
                conn.exec_driver_sql("SET enable_seqscan = off")  # 40 rows: else everything is a seq scan
                plan = "\n".join(row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}", parameters))
                assert "on ix_findings_state" in plan or "using ix_findings_state" in plan, plan
