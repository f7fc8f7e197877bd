"""Canaries inside the service: scheduled per target that enables one, stored, exported,
and used by the diagnosis as the single-request baseline (the evidence says so)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from app.emulator.server import EmulatorFleet, TargetSpec
from app.probe.canary import CanaryConfig, run_canary
from app.scrape.jobs import ScrapeSpec
from tests.api.conftest import make_service

pytestmark = pytest.mark.slow


def test_canary_is_scheduled_stored_exported_and_cited_by_the_diagnosis(migrated_url: str, tmp_path: Path) -> None:
    with EmulatorFleet([TargetSpec("q", "queueing", time_scale=5, warmup_s=120, seed=7),
                        TargetSpec("h", "healthy", time_scale=5, warmup_s=60, seed=7)]) as fleet:
        canary = {"enabled": True, "interval": "1h", "prompt_tokens": 64, "max_tokens": 16, "requests": 1}
        config = tmp_path / "targets.yaml"
        config.write_text(yaml.safe_dump({"targets": [
            {"name": "q", "url": fleet.urls["q"] + "/metrics", "canary": canary},
            {"name": "h", "url": fleet.urls["h"] + "/metrics"},
        ], "diagnosis": {"window": "30s"}}))
        for svc in make_service(migrated_url, tmp_path, config_file=config):
            scheduler = svc.monitor.scheduler
            assert scheduler.get_job("canary:q") is not None and scheduler.get_job("canary:h") is None
            target = svc.client.get("/api/v1/targets/q").json()
            assert target["canary"]["enabled"] is True and target["canary"]["prompt_tokens"] == 64
            run = run_canary(svc.monitor.sessions, ScrapeSpec(target["name"] and 1, "q", fleet.urls["q"] + "/metrics"),
                             CanaryConfig.model_validate(canary), on_result=svc.monitor.telemetry.probes.observe)
            assert run is not None and run.state == "done", run and run.error
            first = svc.scrape("q")
            time.sleep(2.0)
            last = svc.scrape("q")
            results = svc.monitor.evaluate_diagnoses(now=last.ts)
            metrics = svc.client.get("/metrics").text
            page = svc.client.get("/targets/q").text
    diagnosis = next(d for d, _ in results if d.target == "q")
    assert diagnosis.verdict == "queueing"
    assert any(n.startswith(f"single-request baseline from client-side probe run {run.id} (canary") for n in
               diagnosis.notes), diagnosis.notes
    probe_line = next(e for e in diagnosis.findings[0].evidence if e.name == "single-request TTFT p50 (client probe)")
    # On a queueing server the canary waits in the same queue: its client-side TTFT (real
    # seconds; the emulator runs 5x faster than its simulated clock) matches the server's
    # TTFT, queue included, which is what the evidence line shows next to it.
    server_ttft = next(e for e in diagnosis.findings[0].evidence if e.name == "TTFT mean").value
    assert last.ts > first.ts and server_ttft > 5.0
    assert probe_line.value * 5 == pytest.approx(server_ttft, rel=0.5)
    assert 'llm_latency_probe_ttft_seconds{concurrency="1",kind="canary",quantile="0.5",target="q"}' in metrics
    # the status page shows it on the target's page
    assert f'data-probe-run="{run.id}"' in page
    assert "concurrency 1, 64 prompt tokens: TTFT p50" in " ".join(page.split())
