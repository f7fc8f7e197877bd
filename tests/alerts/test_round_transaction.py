"""The alerting round's transactions on SQLite: another writer (the scrape flusher) commits while
the round reads, and the round still records its SLO increments and writes its alerts.

SQLite in WAL mode cannot turn a read transaction into a write one once another connection
has committed since its first read (SQLITE_BUSY_SNAPSHOT: "database is locked" at once, the
busy timeout does not apply). The SLO recording reads and then writes in one transaction, so
it takes the write lock when it begins and a concurrent writer waits for it instead; the
alert round proper reads outside any transaction until its first write, so other writers are
not held up while it computes its conditions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.alerts import engine as alerts_engine
from app.alerts import repository as alert_repository
from app.alerts.config import AlertsConfig
from app.alerts.rounds import evaluate_alerts
from app.emulator.simulation import Simulation
from app.slo import record as slo_record
from app.slo import repository as slo_repository
from app.store.record import ScrapeRecord
from tests.slo.harness import T0, SloHarness

SLO = {"name": "ttft-99", "signal": "ttft", "threshold": "2.5s", "objective": "99%"}


def another_writer(path: str) -> str:
    """A write from another connection that does not wait ("committed", or why it was refused)."""
    other = sqlite3.connect(path, timeout=0)  # no busy wait: a held write lock refuses at once
    try:
        other.execute("UPDATE targets SET url = url || '?'")  # a new value: the same one commits nothing
        other.commit()
        return "committed"
    except sqlite3.OperationalError as exc:
        return f"refused: {exc}"
    finally:
        other.close()


def test_a_commit_between_the_rounds_read_and_its_write_does_not_fail_the_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = SloHarness(tmp_path, [SLO], {"a": Simulation("healthy", seed=0)})
    try:
        for _ in range(8):  # two minutes of 15 s scrapes
            h.engines[0].sim.run_for(15.0)
            h.clock += 15.0
            h.scrape()
        # the last scrape failed: the round has a TargetDown condition to write (pending, for 60 s)
        h.writer.write([ScrapeRecord(h.engines[0].target_id, T0 + h.clock + 1, False, 0.001,
                                     error_class="connect", error="refused")])
        path = h.url.removeprefix("sqlite:///")
        concurrent: list[str] = []
        original = slo_record.matched_targets

        def matched_then_another_writer_commits(session, *args, **kwargs):
            targets = original(session, *args, **kwargs)
            if not concurrent:  # once, right after the recording's first reads inside its transaction
                concurrent.append(another_writer(path))
            return targets

        monkeypatch.setattr(slo_record, "matched_targets", matched_then_another_writer_commits)
        during_conditions: list[str] = []
        original_down = alerts_engine.target_down_conditions

        def target_down_while_another_writer_commits(session, config):
            during_conditions.append(another_writer(path))
            return original_down(session, config)

        monkeypatch.setattr(alerts_engine, "target_down_conditions", target_down_while_another_writer_commits)
        config = AlertsConfig.model_validate({"slos": []})
        now = T0 + h.clock
        result = evaluate_alerts(h.sessions, config, generator_url="http://127.0.0.1/alerts", eval_interval=15.0,
                                 now=now, slos=h.slos)
        # The round held the write lock from its start, so the other writer could not slip in
        # between its read and its write (the flusher, with its busy timeout, waits instead) ...
        assert concurrent == ["refused: database is locked"], concurrent
        # ... while the alert round's condition reads hold no lock: a writer gets in meanwhile ...
        assert during_conditions == ["committed"], during_conditions
        # ... and the round did all of its work: the increments of the two minutes are recorded
        # and the TargetDown alert is written, pending.
        assert result == {"conditions": 1, "notifications": 0}, result
        with h.sessions() as session:
            recorded = slo_repository.last_recorded(session, "ttft-99", "ttft", 2.5)
            alerts = [(row.alertname, row.state) for row in alert_repository.open_alerts(session)]
        assert recorded == {h.engines[0].target_id: now}, recorded
        assert alerts == [(alerts_engine.TARGET_DOWN, "pending")], alerts
        # The round's lock is gone with its commit: the other writer gets in now.
        assert another_writer(path) == "committed"
    finally:
        h.close()
