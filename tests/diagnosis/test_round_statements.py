"""A diagnosis round over the built-in store reads every target's window in a fixed number of
set-based statements (not per target), and its results equal the per-target path's."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.diagnosis import engine as diagnosis_engine
from app.diagnosis import repository as diagnosis_repository
from app.diagnosis import rounds
from app.diagnosis.config import DiagnosisConfig
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.emulator.simulation import Simulation
from app.runtime import scheduling
from app.scrape.jobs import PageProcessor
from app.store import db, reads
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.api.conftest import counted_statements

T0 = 1_800_000_000.0
SCENARIOS = ("queueing", "healthy", "kv_cache_pressure")


def _pages() -> dict[str, list[tuple[float, object]]]:
    """75 s of 5 s scrapes of each scenario, parsed once (canonical samples)."""
    out = {}
    for scenario in SCENARIOS:
        sim, processor, pages = Simulation(scenario, engine="vllm", seed=1), PageProcessor("auto"), []
        sim.run_for(60.0)
        for _ in range(16):
            sim.run_for(5.0)
            page, canonical, error = processor.process(sim.render_metrics())
            assert error is None
            pages.append((round(T0 + sim.clock, 3), canonical))
        out[scenario] = pages
    return out


@pytest.fixture(scope="module")
def pages() -> dict[str, list[tuple[float, object]]]:
    return _pages()


def _fleet(tmp_path: Path, n: int, pages: dict) -> tuple:
    url = f"sqlite:///{tmp_path / f'fleet-{n}.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    with sessions.begin() as session:
        ids = [target_repository.create_target(session, name=f"t{i:03d}", url=f"http://127.0.0.1/{i}/metrics",
                                        engine="auto", labels={}).id for i in range(n)]
    writer = SampleWriter(engine)
    for i, target_id in enumerate(ids):
        writer.write([ScrapeRecord(target_id, ts, True, 0.001, 0, 1, 1, 0, "vllm", None, None, canonical)
                      for ts, canonical in pages[SCENARIOS[i % len(SCENARIOS)]]])
    return engine, sessions, ids, max(ts for ts, _ in pages[SCENARIOS[0]])


def test_statements_per_round_do_not_grow_with_the_number_of_targets(tmp_path: Path, pages: dict) -> None:
    counts = {}
    for n in (9, 60):
        engine, sessions, _, now = _fleet(tmp_path, n, pages)
        config = DiagnosisConfig(interval=30, window=60)
        rounds.evaluate_diagnoses(sessions, config, now=now)  # first round inserts findings and diagnoses
        with counted_statements(engine) as seen:
            results = rounds.evaluate_diagnoses(sessions, config, now=now + 5)
        counts[n] = len(seen)
        verdicts = {d.verdict for d, _ in results}
        assert len(results) == n and {"queueing", "healthy"} <= verdicts, verdicts
        engine.dispose()
    assert counts[9] == counts[60], counts
    assert counts[60] <= 40, counts


def test_a_rounds_windows_equal_each_targets_own(tmp_path: Path, pages: dict) -> None:
    engine, sessions, ids, now = _fleet(tmp_path, 6, pages)
    with sessions() as session:
        together = reads.store_windows(session, ids, now - 60, now, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
        for target_id in ids:
            alone = reads.store_window(session, [target_id], now - 60, now, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
            assert together[target_id] == alone, target_id
            # and the diagnosis made from it is the per-target path's
            a = diagnosis_engine.evaluate_target(session, target_id, "t", "vllm", now, 60.0,
                                                 DiagnosisConfig().thresholds, data=together[target_id])
            b = diagnosis_engine.evaluate_target(session, target_id, "t", "vllm", now, 60.0,
                                                 DiagnosisConfig().thresholds)
            assert [d.to_dict() for d in a] == [d.to_dict() for d in b]
            assert a[0].verdict != "insufficient_data"
    engine.dispose()


def test_a_target_that_fails_stops_no_other(tmp_path: Path, pages: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each target is judged in its own error boundary: the others are evaluated and saved, the
    failing one keeps its last verdict, and the failure is counted for /metrics."""
    engine, sessions, ids, now = _fleet(tmp_path, 3, pages)
    config = DiagnosisConfig(interval=30, window=60)
    rounds.evaluate_diagnoses(sessions, config, now=now - 5)
    real = diagnosis_engine.evaluate_target

    def failing(session, target_id, target, *args, **kwargs):
        if target == "t001":
            raise RuntimeError("a bug met by one target only")
        return real(session, target_id, target, *args, **kwargs)

    monkeypatch.setattr(diagnosis_engine, "evaluate_target", failing)
    errors = scheduling.target_errors["diagnosis"]
    results = rounds.evaluate_diagnoses(sessions, config, now=now)
    assert sorted(d.target for d, _ in results) == ["t000", "t002"]
    assert scheduling.target_errors["diagnosis"] == errors + 1
    with sessions() as session:
        evaluated = {row.target_id: row.evaluated_at for row in diagnosis_repository.diagnosis_rows(session).values()}
    assert evaluated == {ids[0]: now, ids[1]: now - 5, ids[2]: now}
    engine.dispose()
