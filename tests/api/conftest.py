from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.lifespan import Monitor
from app.main import create_app
from app.settings import Settings
from tests.support.plans import executed


@dataclass
class Service:
    client: TestClient
    monitor: Monitor

    def scrape(self, name: str):
        """Scrape ``name`` now and write the result (deterministic, no waiting for the schedule)."""
        record = self.client.portal.call(self.monitor.scraping.scrape_now, name)
        self.client.portal.call(self.monitor.scraping.flush)
        return record


def make_service(url: str, tmp_path: Path, **settings: object) -> Iterator[Service]:
    # A one-hour interval keeps the scheduler from scraping on its own during a test.
    base = {"database_url": url, "data_dir": tmp_path, "default_scrape_interval": "1h",
            "default_scrape_timeout": "2s", "max_page_bytes": 200_000}
    app = create_app(Settings(**{**base, **settings}))
    with TestClient(app) as client:
        yield Service(client, app.state.monitor)


@pytest.fixture
def service(migrated_url: str, tmp_path: Path) -> Iterator[Service]:
    yield from make_service(migrated_url, tmp_path)


def make_quiet_service(url: str, tmp_path: Path, **settings: object) -> Iterator[Service]:
    """A service whose scheduled jobs (summaries, diagnosis, alerts, outbox, downsampling, the replica
    heartbeat and lease, and the scrapes of the targets a test adds: one may be due within a second
    of its creation) do not run during the test, so every statement on the engine belongs to the
    request under test."""
    config = tmp_path / "config.yaml"
    config.write_text("diagnosis:\n  interval: 1h\n")
    for service in make_service(url, tmp_path, config_file=config, summary_interval="1h", alert_interval="1h",
                                delivery_interval="1h", downsample_interval="1h", replica_heartbeat="1h",
                                replica_expiry="2h", **settings):
        service.client.portal.call(service.monitor.scheduler.pause)
        yield service


@pytest.fixture
def quiet_service(migrated_url: str, tmp_path: Path) -> Iterator[Service]:
    yield from make_quiet_service(migrated_url, tmp_path)


#: the SQL statements run on an engine inside a block, in order (one hook for every test that counts them)
counted_statements = executed
