"""Diagnose an emulator scenario through parse -> adapter -> store -> signals -> rules,
driven by the emulator's offline clock (no HTTP, no sleeping) so tests run in seconds.

Scrape timestamps are the simulated times, so the windows are exact; everything after
the page bytes is the production code path. (``bench/diagnosis_matrix.py`` runs the same
scenarios over real HTTP scrapes.)
"""

from __future__ import annotations

from pathlib import Path

from app import latency
from app.core.thresholds import Thresholds
from app.diagnosis import engine as diagnosis_engine
from app.diagnosis.findings import Diagnosis
from app.diagnosis.profile import HardwareProfile
from app.emulator import scenarios
from app.emulator.simulation import Simulation
from app.scrape.jobs import PageProcessor
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from app.windows.store import StoreWindows
from tests.support.databases import migrated_sqlite

T0 = 1_800_000_000.0  # simulated seconds are placed after this epoch


def profile_of(scenario: str) -> HardwareProfile:
    """The hardware profile an operator of this scenario's deployment would configure."""
    dep = scenarios.resolve(scenario).phases[-1][1].deployment
    return HardwareProfile(gpu=dep.gpu.name, model=dep.model.name, weight_dtype=dep.weight_dtype)


class OfflineTarget:
    """One emulated engine as a target of the built-in store. ``paired``: an SGLang P/D decode worker
    whose prefill worker's page (:meth:`Simulation.render_prefill_metrics`) is scraped too, as the
    target ``<name>-prefill`` its ``llm_latency_prefill_target`` label names."""

    def __init__(self, tmp_path: Path, scenario: str, engine: str = "vllm", seed: int = 0,
                 hardware: HardwareProfile | None = None, name: str = "t", paired: bool = False) -> None:
        self.url = migrated_sqlite(tmp_path / f"{name}-{seed}.db")
        self.engine = db.make_engine(self.url)
        self.sessions = db.make_sessionmaker(self.engine)
        self.prefill_id: int | None = None
        with self.sessions.begin() as session:
            labels = {latency.PD_PREFILL_LABEL: f"{name}-prefill"} if paired else {}
            target = target_repository.create_target(session, name=name, url="http://127.0.0.1/metrics",
                                                     engine="auto", labels=labels,
                                                     hardware=hardware.model_dump() if hardware else None)
            self.target_id = target.id
            if paired:
                self.prefill_id = target_repository.create_target(session, name=f"{name}-prefill",
                                                           url="http://127.0.0.2/metrics", engine="auto",
                                                           labels={}).id
        self.name = name
        self.hardware = hardware
        self.sim = Simulation(scenario, engine=engine, seed=seed)
        self.processor = PageProcessor("auto")
        self.prefill_processor = PageProcessor("auto")
        self.writer = SampleWriter(self.engine)

    def run(self, seconds: float, scrape_every: float = 5.0) -> None:
        """Advance the simulation, scraping every ``scrape_every`` simulated seconds."""
        end = self.sim.clock + seconds
        while self.sim.clock + 1e-9 < end:
            self.sim.run_for(min(scrape_every, end - self.sim.clock))
            pages = [(self.target_id, self.processor, self.sim.render_metrics())]
            if self.prefill_id is not None:
                pages.append((self.prefill_id, self.prefill_processor, self.sim.render_prefill_metrics()))
            for target_id, processor, text in pages:
                page, canonical, error = processor.process(text)
                assert error is None, (error, page.errors)
                self.writer.write([ScrapeRecord(target_id, round(T0 + self.sim.clock, 3), True, 0.001, 0,
                                                page.samples_seen, page.samples_kept, page.malformed,
                                                processor.engine, None, None, canonical)])

    def diagnose(self, window: float = 120.0, thresholds: Thresholds | None = None) -> Diagnosis:
        end = round(T0 + self.sim.clock, 3)
        with self.sessions() as session:
            target = target_repository.get_target(session, self.name)
            assert target is not None
            prefill = StoreWindows().prefill_of(session, target, end - window, end, True)
            results = diagnosis_engine.evaluate_target(
                session, self.target_id, self.name, self.processor.engine or "vllm", end,
                window, thresholds or Thresholds(), self.hardware, prefill=prefill)
        assert len(results) == 1, [d.model for d in results]
        return results[0]

    def close(self) -> None:
        self.engine.dispose()
