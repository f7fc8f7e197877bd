"""The window interface's contract, on one scripted engine history: the built-in store and the
in-memory backend answer every :class:`app.windows.base.WindowReader` method alike, exactly
(the Prometheus source joins them in tests/promsource/test_matrix_both_modes.py, against a real
Prometheus). Two emulated engines (vLLM queueing with data-parallel-free ranks, SGLang healthy,
restarted at 150 s) are scraped every 5 simulated seconds; one scrape fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.emulator.simulation import Simulation
from app.latency import PD_PREFILL_LABEL, report_from_window, summaries_dict
from app.scrape.jobs import PageProcessor
from app.sources.base import HISTOGRAM_SIGNALS
from app.store import db
from app.store.models import ScrapeSample, Target
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from app.window import TargetWindow
from app.windows.base import WindowReader
from app.windows.memory import MemoryWindows
from app.windows.store import StoreWindows
from tests.support.databases import migrated_sqlite

T0 = 1_800_000_000.0
SCRAPE_S = 5.0
RUN_S = 240.0
ENGINES = {"q": ("queueing", "vllm"), "h": ("healthy->healthy@150!", "sglang")}


def _history(target_id: int, scenario: str, engine: str) -> list[ScrapeRecord]:
    sim, processor, records = Simulation(scenario, engine=engine, seed=3), PageProcessor("auto"), []
    while sim.clock + 1e-9 < RUN_S:
        sim.run_for(SCRAPE_S)
        page, canonical, error = processor.process(sim.render_metrics())
        assert error is None
        ts = round(T0 + sim.clock, 3)
        records.append(ScrapeRecord(target_id, ts, True, 0.001, 0, page.samples_seen, page.samples_kept,
                                    page.malformed, processor.engine, None, None, canonical))
    records.insert(10, ScrapeRecord(target_id, records[9].ts + 1.0, False, 0.001, error_class="timeout"))
    return records


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Any:
    url = migrated_sqlite(tmp_path_factory.mktemp("contract") / "store.db")
    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    memory = MemoryWindows()
    with sessions.begin() as session:
        ids = {name: target_repository.create_target(session, name=name, url=f"http://127.0.0.1/{name}",
                                                     engine="auto", labels={}).id for name in ENGINES}
        target_repository.create_target(session, name="d", url="http://127.0.0.1/d", engine="auto",
                                        labels={PD_PREFILL_LABEL: "h"})
    for name, (scenario, engine_name) in ENGINES.items():
        records = _history(ids[name], scenario, engine_name)
        SampleWriter(engine).write(records)
        memory.add(ids[name], name, records)
    yield sessions, {"store": StoreWindows(), "memory": memory}
    engine.dispose()


def _plain(value: Any) -> Any:
    """A window's numbers as nested plain data, floats to 12 significant digits."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def _infos(window: TargetWindow) -> list[tuple[str, str, str, dict[str, str]]]:
    return sorted((i.name, i.model, i.rank, i.labels) for i in window.infos)


def _answers(backend: WindowReader, session: Any, end: float) -> dict[str, Any]:
    q, h, d = (session.query(Target).filter_by(name=n).one() for n in ("q", "h", "d"))
    out: dict[str, Any] = {}
    for start in (end - 60.0, end - 120.0, T0):
        window = backend.window(session, q, start, end, HISTOGRAM_SIGNALS)
        diagnosis = backend.windows(session, [q, h], start, end, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
        assert diagnosis.failed == set()
        histograms = backend.histograms(session, [q, h], start, end, ["ttft", "itl", "queue_time"])
        out[f"window {start}"] = {"report": _plain(report_from_window(window)), "infos": _infos(window),
                                  "models": _plain(window.models), "overall": _plain(window.overall)}
        out[f"diagnosis {start}"] = {tid: {"scrapes": w.scrapes, "restarts": w.restarts, "infos": _infos(w),
                                           "models": _plain(w.models)}
                                     for tid, w in diagnosis.found.items()}
        out[f"histograms {start}"] = _plain(histograms.found)
        out[f"fleet {start}"] = {tid: summaries_dict(s) for tid, s in
                                 backend.fleet_summaries(session, [q, h], start, end).items()}
        history = backend.history(session, q, ("ttft", "itl", "queue_time"), start, end)
        out[f"history {start}"] = {"signals": sorted(history.signals), "first": history.first_sample(["ttft"]),
                                   "merged": _plain(history.merged(end - 30.0, end, "ttft"))}
    out["series"] = [_plain(backend.quantile_series(session, t, signal, qq, 180.0, 15.0, 30.0, end, None))
                     for t in (q, h) for signal in ("ttft", "itl") for qq in (0.5, 0.99, None)]
    paired = backend.prefill_of(session, d, end - 60.0, end, decode=True)
    assert paired is not None
    out["prefill_of"] = {"names": paired[0], "report": _plain(report_from_window(paired[1], per_model=False))}
    out["unpaired"] = backend.prefill_of(session, q, end - 60.0, end, decode=True)
    return out


def test_the_store_and_the_in_memory_backend_answer_alike(backends: Any) -> None:
    sessions, readers = backends
    end = T0 + RUN_S
    with sessions() as session:
        store = _answers(readers["store"], session, end)
        memory = _answers(readers["memory"], session, end)
    assert store.keys() == memory.keys()
    for part in store:
        assert memory[part] == store[part], part
    # the answers hold numbers: a queueing vLLM with its waiting requests, 47 good scrapes of 49 in 240 s
    report = store[f"window {end - 60.0}"]["report"]
    assert report["ttft"]["count"] > 10 and report["queue_time"]["mean"] > 0.5
    assert report["gauges"]["waiting"]["max"] > 1
    assert {w["scrapes"] for w in store[f"diagnosis {T0}"].values()} == {48}
    # the SGLang engine's restart at 150 s is in the windows that hold it, and only there
    q, h = (store[f"diagnosis {T0}"][n] for n in sorted(store[f"diagnosis {T0}"]))
    assert (q["restarts"], h["restarts"]) == (0, 1)
    assert [w["restarts"] for w in store[f"diagnosis {end - 60.0}"].values()] == [0, 0]
    assert store["prefill_of"]["names"] == ["h"] and store["unpaired"] is None
    assert any(point["value"] is not None for series in store["series"] for point in series)


def test_the_in_memory_backend_answers_nothing_for_a_target_it_does_not_hold(backends: Any) -> None:
    sessions, readers = backends
    with sessions() as session:
        d = session.query(Target).filter_by(name="d").one()
        for name, reader in readers.items():
            window = reader.window(session, d, T0, T0 + RUN_S, HISTOGRAM_SIGNALS)
            assert (window.overall.histograms, window.models, window.infos) == ({}, {}, []), name
            assert reader.histograms(session, [d], T0, T0 + RUN_S, ["ttft"]).found == {d.id: {}}, name
            assert reader.slo_sums(sessions, [], T0) == ({}, {}) and reader.statuses() == [], name


def test_a_diagnosis_round_reads_only_through_its_windows(backends: Any, tmp_path: Path) -> None:
    """The diagnosis round over the in-memory backend, on a database that holds the targets and
    no sample: the verdicts are the engines' regimes, so every number came through the interface."""
    from app.diagnosis.config import DiagnosisConfig
    from app.diagnosis.rounds import evaluate_diagnoses

    _, readers = backends
    engine = db.make_engine(migrated_sqlite(tmp_path / "targets-only.db"))
    sessions = db.make_sessionmaker(engine)
    try:
        with sessions.begin() as session:
            for name in ENGINES:  # the same ids as the backend's targets
                target_repository.create_target(session, name=name, url=f"http://127.0.0.1/{name}", engine="auto",
                                                labels={})
        results = evaluate_diagnoses(sessions, DiagnosisConfig(window=120.0), now=T0 + RUN_S,
                                     windows=readers["memory"])
        verdicts = {d.target: d.verdict for d, _ in results}
        assert verdicts == {"q": "queueing", "h": "healthy"}
        with sessions() as session:
            assert (session.query(Target).count(), session.query(ScrapeSample).count()) == (2, 0)
    finally:
        engine.dispose()
