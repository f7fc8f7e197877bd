"""SLOs of emulated engines in simulated time: the emulator's pages go through parse ->
adapter -> store (as in tests/diagnosis/harness.py), and every ``round`` simulated seconds
the recording round and the SLO computation run at that simulated time, as the alerting
round does in the service. Nothing waits on a wall clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.emulator.simulation import Simulation
from app.scrape.jobs import PageProcessor
from app.slo.config import SloObjective
from app.slo.record import record_increments
from app.slo.status import SloStatus, slo_statuses
from app.store import db
from app.store.record import ScrapeRecord
from app.store.writer import SampleWriter
from app.targets import repository as target_repository
from tests.support.databases import migrated_sqlite

T0 = 1_800_000_000.0
RETENTION = 7 * 86400.0


@dataclass
class Engine:
    name: str
    sim: Simulation
    target_id: int
    processor: PageProcessor = field(default_factory=lambda: PageProcessor("auto"))
    pages: list[tuple[float, str]] = field(default_factory=list)  # kept when ``keep_pages``


class SloHarness:
    def __init__(self, tmp_path: Path, slos: list[dict], engines: dict[str, Simulation],
                 labels: dict[str, dict[str, str]] | None = None, url: str | None = None,
                 keep_pages: bool = False) -> None:
        self.url = url or migrated_sqlite(tmp_path / "slo.db")
        if url is not None:
            db.upgrade(self.url)
        self.db = db.make_engine(self.url)
        self.sessions = db.make_sessionmaker(self.db)
        self.slos = [SloObjective.model_validate(s) for s in slos]
        self.keep_pages = keep_pages
        self.engines: list[Engine] = []
        with self.sessions.begin() as session:
            for name, sim in engines.items():
                row = target_repository.create_target(session, name=name, url=f"http://127.0.0.1/{name}", engine="auto",
                                               labels=(labels or {}).get(name, {}))
                self.engines.append(Engine(name, sim, row.id))
        self.writer = SampleWriter(self.db)
        self.clock = 0.0

    def scrape(self) -> None:
        records = []
        for engine in self.engines:
            text = engine.sim.render_metrics()
            page, canonical, error = engine.processor.process(text)
            assert error is None, (error, page.errors)
            ts = round(T0 + self.clock, 3)
            records.append(ScrapeRecord(engine.target_id, ts, True, 0.001, 0, page.samples_seen, page.samples_kept,
                                        page.malformed, engine.processor.engine, None, None, canonical))
            if self.keep_pages:
                engine.pages.append((ts, text.decode() if isinstance(text, bytes) else text))
        self.writer.write(records)

    def evaluate(self) -> list[SloStatus]:
        """The recording round and the SLOs at the current simulated time."""
        now = T0 + self.clock
        with self.sessions.begin() as session:
            record_increments(session, self.slos, now, RETENTION)
        with self.sessions() as session:
            return slo_statuses(session, self.slos, now, RETENTION)

    def run(self, seconds: float, scrape_every: float = 15.0, round_every: float = 60.0) -> Iterator[list[SloStatus]]:
        """Advance every engine, scraping every ``scrape_every`` and yielding the SLOs every
        ``round_every`` simulated seconds."""
        end = self.clock + seconds
        next_round = self.clock + round_every
        while self.clock + 1e-9 < end:
            step = min(scrape_every, end - self.clock)
            for engine in self.engines:
                engine.sim.run_for(step)
            self.clock += step
            self.scrape()
            if self.clock + 1e-9 >= next_round:
                next_round += round_every
                yield self.evaluate()

    def close(self) -> None:
        self.db.dispose()
