"""The scheduler scrapes on its own, with the right headers, gzip, and PostgreSQL policy."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.runtime import scheduling
from app.settings import Settings
from tests.api.conftest import make_service
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer


def test_targets_are_scraped_on_schedule_with_prometheus_text_and_gzip(migrated_url: str, tmp_path: Path) -> None:
    page = VllmPage()
    page.observe(ttft=[0.2] * 5)
    config = tmp_path / "targets.yaml"
    with StaticPageServer(page.render()) as server:
        server.gzip = True
        config.write_text(f"targets:\n  - name: v\n    url: {server.url}\n    scrape_interval: 1s\n"
                          f"    scrape_timeout: 800ms\n")
        for svc in make_service(migrated_url, tmp_path, config_file=config, write_batch_interval="200ms"):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                scrapes = svc.client.get("/api/v1/targets/v/scrapes").json()
                if len(scrapes) >= 3:
                    break
                time.sleep(0.2)
            target = svc.client.get("/api/v1/targets/v").json()
    assert len(scrapes) >= 3 and all(s["up"] and s["error_class"] is None for s in scrapes)
    gaps = [a["ts"] - b["ts"] for a, b in zip(scrapes, scrapes[1:])]
    assert all(0.7 < gap < 1.3 for gap in gaps), gaps  # 1 s interval, 5 % jitter
    # the stored size is the decompressed page; the wire carried the gzip body
    assert scrapes[0]["bytes"] == len(page.render()) > len(gzip.compress(page.render()))
    headers = server.request_headers[0]
    assert headers["Accept"].startswith("text/plain;version=0.0.4")
    assert "gzip" in headers["Accept-Encoding"]
    assert (target["source"], target["detected_engine"]) == ("config", "vllm")


@pytest.mark.postgres
def test_service_refuses_an_unmigrated_postgresql(postgres_database: str, tmp_path: Path) -> None:
    from app.store.db import head_revision
    from tests.conftest import _reset_postgres

    head = head_revision()
    assert head is not None and head.isdigit()  # a numbered revision, so the message below names it exactly
    _reset_postgres(postgres_database)
    app = create_app(Settings(database_url=postgres_database, data_dir=tmp_path))
    with pytest.raises(RuntimeError,
                       match=rf"schema is at revision none, the service needs {head}: run `llm-latency db upgrade`"):
        with TestClient(app):
            pass


def test_sqlite_upgrades_itself(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path))
    with TestClient(app) as client:
        assert client.get("/readyz").json()["status"] == "ok"
    assert (tmp_path / "llm-latency.db").exists()


def test_the_rounds_that_read_every_window_start_out_of_step(service) -> None:
    """Summaries, diagnosis and alerts (15 s, 30 s, 15 s by default) do not start together: the
    diagnosis round comes a sixth of its interval later and the alert round half of its."""
    monitor = service.monitor
    runs = {job: scheduling.next_run_at(monitor.scheduler, job)
            for job in (scheduling.SUMMARIES_JOB, scheduling.DIAGNOSIS_JOB, scheduling.ALERTS_JOB)}
    settings, diagnosis = monitor.settings, monitor.diagnosis_config.interval
    assert (settings.summary_interval, diagnosis, settings.alert_interval) == (15.0, 30.0, 15.0)
    started = runs[scheduling.SUMMARIES_JOB] - settings.summary_interval  # when the rounds were added
    assert abs(runs[scheduling.DIAGNOSIS_JOB] - (started + 35.0)) < 1.0
    assert abs(runs[scheduling.ALERTS_JOB] - (started + 22.5)) < 1.0
