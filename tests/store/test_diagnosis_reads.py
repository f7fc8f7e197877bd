"""The stored diagnoses as the status page and ``/api/v1/diagnoses`` read them, on SQLite and
PostgreSQL: details fetched and decoded once per distinct content, every open finding's state."""

from __future__ import annotations

from app.diagnosis import repository as diagnosis_repository
from tests.support.plans import executed, plan

PAYLOAD = {"severity": "warning", "confidence": 0.8, "primary": True, "summary": "s", "evidence": [],
           "remedies": ["r"], "runbook": "rb", "caused_by": None, "window": 300}


def stored_findings(sessions, target_id: int, n: int, *moves: tuple[range, str, float]) -> None:
    """``n`` pending findings of models m000, m001, ..., then those in each range moved to a state."""
    with sessions.begin() as session:
        rows = [diagnosis_repository.create_finding(session, target_id, f"m{i:03d}", "queueing", 100.0 + i, PAYLOAD,
                                          flush=False) for i in range(n)]
        session.flush()
        for indices, state, at in moves:
            for i in indices:
                diagnosis_repository.set_finding_state(session, rows[i], state, at, flush=False)


def test_latest_diagnoses_decode_each_stored_text_once_and_follow_every_change(store) -> None:
    _, sessions, target_id = store
    details = {"engine": "vllm", "findings": [{"regime": "queueing", "severity": "warning"}],
               "signals": {"waiting_mean": 12.5, "ttft_p99": 1.75}, "window": 300}
    with sessions.begin() as session:
        diagnosis_repository.save_diagnosis(session, target_id, "m1", "queueing", 1000.0, details)
        diagnosis_repository.save_diagnosis(session, target_id, "m2", "healthy", 1000.0, {"engine": "vllm",
                                            "findings": []})
    with sessions() as session:
        first = diagnosis_repository.latest_diagnoses(session)
        again = diagnosis_repository.latest_diagnoses(session)
    assert [(d.target, d.model, d.verdict, d.evaluated_at) for d in first] == [
        ("t1", "m1", "queueing", 1000.0), ("t1", "m2", "healthy", 1000.0)]
    assert first[0].details == details
    assert again[0].details is first[0].details  # the same text is not decoded again
    # the next round's details (same evaluation time, as a test's fixed clock gives) are read, not the cached ones
    changed = {**details, "signals": {"waiting_mean": 0.0, "ttft_p99": 0.25}}
    with sessions.begin() as session:
        diagnosis_repository.save_diagnosis(session, target_id, "m1", "healthy", 1000.0, changed)
    with sessions() as session:
        (one,) = diagnosis_repository.latest_diagnoses(session, target_id)[:1]
    assert one.verdict == "healthy" and one.details["signals"] == {"waiting_mean": 0.0, "ttft_p99": 0.25}


def test_a_read_fetches_only_the_details_it_has_not_decoded(store) -> None:
    """The rows are read without their details; the details of a row are fetched only when
    the last whole-fleet read did not decode its digest, together with the row again."""
    engine, sessions, target_id = store
    with sessions.begin() as session:
        for i in range(30):
            diagnosis_repository.save_diagnosis(session, target_id, f"m{i:02d}", "healthy", 1000.0,
                                      {"engine": "vllm", "findings": [], "signals": {"i": i}})
    with sessions() as session:
        diagnosis_repository.latest_diagnoses(session)  # decodes all 30
    with executed(engine, parameters=True) as statements, sessions() as session:
        unchanged = diagnosis_repository.latest_diagnoses(session)
    assert len(unchanged) == 30 and [d.details["signals"]["i"] for d in unchanged] == list(range(30))
    assert len(statements) == 1 and "details" not in statements[0][0].split("FROM")[0], statements
    with sessions.begin() as session:
        diagnosis_repository.save_diagnosis(session, target_id, "m07", "queueing", 1015.0,
                                  {"engine": "vllm", "findings": [{"regime": "queueing"}], "signals": {"i": 77}})
    with executed(engine, parameters=True) as statements, sessions() as session:
        after = diagnosis_repository.latest_diagnoses(session)
    assert len(statements) == 2, statements
    fetch, parameters = statements[1]
    assert "details" in fetch.split("FROM")[0]
    assert "m07" in str(parameters) and "m08" not in str(parameters), parameters  # that row's details only
    assert (after[7].verdict, after[7].evaluated_at, after[7].details["signals"]) == ("queueing", 1015.0, {"i": 77})
    assert [d.details["signals"]["i"] for d in after] == [*range(7), 77, *range(8, 30)]
    assert after[8].details is unchanged[8].details  # the others are the ones decoded before


def test_a_row_written_without_a_digest_of_its_evaluation_is_read_in_full(store) -> None:
    """A replica of a version without digests updates verdict, time and details and leaves
    the digest of the evaluation before: the reader must not take those details for the old ones."""
    from sqlalchemy import update

    from app.store.models import DiagnosisRow

    _, sessions, target_id = store
    old = {"engine": "vllm", "findings": [], "signals": {"waiting_mean": 0.0}}
    with sessions.begin() as session:
        diagnosis_repository.save_diagnosis(session, target_id, "m1", "healthy", 1000.0, old)
    with sessions() as session:
        (before,) = diagnosis_repository.latest_diagnoses(session)
    assert before.version == diagnosis_repository.details_digest(old)
    new = {"engine": "vllm", "findings": [{"regime": "queueing"}], "signals": {"waiting_mean": 12.0}}
    with sessions.begin() as session:  # what an older writer does: the digest columns untouched
        session.execute(update(DiagnosisRow).values(verdict="queueing", evaluated_at=1015.0, details=new))
    with sessions() as session:
        (after,) = diagnosis_repository.latest_diagnoses(session)
    assert (after.verdict, after.evaluated_at, after.details) == ("queueing", 1015.0, new)
    assert after.version != before.version  # keyed by its text, not by the stale digest
    with sessions.begin() as session:  # the next evaluation by a current writer has a digest again
        diagnosis_repository.save_diagnosis(session, target_id, "m1", "queueing", 1030.0, new)
    with sessions() as session:
        (current,) = diagnosis_repository.latest_diagnoses(session)
    assert current.version == diagnosis_repository.details_digest(new) and current.details == new


def test_open_finding_states_cover_every_open_finding(store) -> None:
    _, sessions, target_id = store
    stored_findings(sessions, target_id, 600, (range(450), "active", 900.0), (range(599, 600), "resolved", 950.0))
    with sessions() as session:
        states = diagnosis_repository.open_finding_states(session)
        only = diagnosis_repository.open_finding_states(session, target_id + 1)
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
    stored_findings(sessions, target_id, 40, (range(30), "resolved", 900.0))
    with executed(engine, parameters=True) as statements, sessions() as session:
        states = diagnosis_repository.open_finding_states(session)
        history = diagnosis_repository.finding_history(session, states=("pending", "active"))
        every_open = diagnosis_repository.all_open_findings(session)
    assert len(states) == len(history) == 10 and sum(map(len, every_open.values())) == 10
    assert len(statements) == 3
    for statement, parameters in statements:
        steps = plan(engine, statement, parameters)
        if engine.dialect.name == "sqlite":
            assert not [step for step in steps if step.startswith("SCAN findings")], steps
            assert any(step.startswith("SEARCH findings USING INDEX ix_findings_state (state=?)")
                       for step in steps), steps
        else:
            assert any("on ix_findings_state" in step or "using ix_findings_state" in step for step in steps), steps
