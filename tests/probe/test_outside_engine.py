"""Time lost outside the engine, end to end: an emulated engine with its own traffic, a canary
that reaches it through a delaying gateway (the DelayProxy) while the monitor scrapes the
engine directly, the scheduled diagnosis round, the alert, and the API that shows the
comparison. The same canary without the gateway gives no finding."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from app.emulator.server import EmulatorFleet, TargetSpec
from app.probe.canary import CanaryConfig, run_canary
from app.store import repository
from tests.api.conftest import make_service
from tests.probe.servers import DelayProxy

pytestmark = pytest.mark.slow

DELAY = 0.3
CANARY = {"enabled": True, "interval": "1h", "prompt_tokens": 256, "max_tokens": 8, "requests": 3}


def evidence(finding, name: str):
    return next(e for e in finding.evidence if e.name == name)


def test_a_slow_gateway_in_front_of_the_engine_is_an_outside_engine_finding(migrated_url: str,
                                                                           tmp_path: Path) -> None:
    # time_scale 1: the engine's histograms and the client share one clock
    with EmulatorFleet([TargetSpec("gw", "healthy", warmup_s=30, seed=3),
                        TargetSpec("direct", "healthy", warmup_s=30, seed=4)]) as fleet, \
            DelayProxy(fleet.urls["gw"], delay=DELAY) as proxy:
        config = tmp_path / "targets.yaml"
        config.write_text(yaml.safe_dump({"targets": [
            {"name": "gw", "url": fleet.urls["gw"] + "/metrics", "canary": {**CANARY, "url": proxy.base}},
            {"name": "direct", "url": fleet.urls["direct"] + "/metrics", "canary": CANARY},
        ], "diagnosis": {"window": "30s"}}))
        for svc in make_service(migrated_url, tmp_path, config_file=config):
            runs = {}
            for name in ("gw", "direct"):
                with svc.monitor.sessions() as session:
                    target = repository.get_target(session, name)
                first = svc.scrape(name)
                runs[name] = run_canary(svc.monitor.sessions, target, CanaryConfig.model_validate(target.canary))
                assert runs[name].state == "done" and runs[name].summary["failed"] == 0
                time.sleep(1.0)
                last = svc.scrape(name)
                assert first.ts < runs[name].started_at and last.ts > runs[name].finished_at
            now = time.time()
            rounds = [svc.monitor.evaluate_diagnoses(now=now), svc.monitor.evaluate_diagnoses(now=now + 1)]
            svc.monitor.evaluate_alerts(now=now + 2)
            alerts = svc.monitor.telemetry.diagnosis.alerts
            by_target = {name: svc.client.get(f"/api/v1/targets/{name}/consistency").json() for name in runs}
            run_view = svc.client.get(f"/api/v1/probes/{runs['gw'].id}").json()
            current = svc.client.get("/api/v1/targets/gw/diagnosis").json()
            empty = svc.client.get("/api/v1/targets/gw/consistency", params={"end": now - 3600}).json()

    diagnoses = {d.target: (d, transitions) for d, transitions in rounds[-1]}
    gw, gw_transitions = diagnoses["gw"]
    finding = next(f for f in gw.findings if f.regime == "outside_engine")
    gap = evidence(finding, "client TTFT - engine TTFT")
    # the gateway holds each request 0.3 s before the engine sees it; the canary's 256-token
    # prompt and the engine's own chat traffic cost about the same prefill, so the means differ
    # by the delay
    assert gap.value == pytest.approx(DELAY, abs=0.05) and gap.threshold == 0.25 and gap.met
    share = evidence(finding, "share of client TTFT outside the engine")
    assert 0.6 < share.value < 0.95 and share.threshold == 0.3
    client = evidence(finding, "client TTFT mean (probes)").value
    server = evidence(finding, "engine TTFT mean, same periods").value
    assert client == pytest.approx(server + gap.value, rel=1e-9) and 0.005 < server < 0.15
    # 3 canary requests + 1 preflight, and the engine's own traffic mixed into the same periods
    assert evidence(finding, "probe requests compared").value == 4
    engine_requests = evidence(finding, "engine requests in those periods")
    assert engine_requests.value > 4 and engine_requests.note == "other traffic mixed in"
    assert f"probe run(s) {runs['gw'].id}" in evidence(finding, "compared period").note
    assert any("proxy_buffering off" in r for r in finding.remedies)
    assert any("--api-server-count" in r for r in finding.remedies)
    assert finding.severity == "warning" and finding.runbook == "docs/runbooks/outside_engine.md"
    assert any(n.startswith(f"client-side probe run(s) {runs['gw'].id} vs. the engine's TTFT: time is lost")
               for n in gw.notes), gw.notes
    assert {"regime": "outside_engine", "state": "active", "ts": now + 1} in gw_transitions
    assert ("LLMLatencyOutsideEngine", "gw", "warning", "firing") in alerts  # alerts.diagnosis_for is 0

    # without the gateway: client and engine agree, no finding
    direct, _ = diagnoses["direct"]
    assert all(f.regime != "outside_engine" for f in direct.findings), direct.findings
    assert direct.signals["probe_consistency"]["status"] == "ok"
    assert abs(direct.signals["probe_consistency"]["gap_seconds"]) < 0.05
    assert not any(a[0] == "LLMLatencyOutsideEngine" and a[1] == "direct" for a in alerts)

    # the API shows the comparison per target and per run, with the same numbers
    assert by_target["gw"]["status"] == "finding" and by_target["gw"]["runs"] == [runs["gw"].id]
    assert by_target["gw"]["gap_seconds"] == pytest.approx(gap.value, rel=1e-9)
    assert by_target["direct"]["status"] == "ok" and by_target["direct"]["finding"] is False
    assert run_view["consistency"]["status"] == "finding" and run_view["consistency"]["runs"] == [runs["gw"].id]
    assert run_view["consistency"]["gap_seconds"] == pytest.approx(gap.value, rel=1e-9)
    assert any(f["regime"] == "outside_engine" for d in current for f in d["findings"])
    assert empty["status"] == "no_probes" and "no probe run of 'gw'" in empty["message"]
