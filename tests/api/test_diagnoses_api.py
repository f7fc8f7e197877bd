"""Diagnosis endpoints on a running service fed by real HTTP scrapes of emulated engines."""

from __future__ import annotations

import pytest

from app.emulator.simulation import Simulation
from tests.support.pages import StaticPageServer


def stepping_page(scenario: str, seconds_per_scrape: float = 5.0, warmup: float = 30.0):
    """A page callable: every request advances the emulated engine, like real time passing."""
    sim = Simulation(scenario, seed=4)
    sim.run_for(warmup)

    def page() -> bytes:
        sim.run_for(seconds_per_scrape)
        return sim.render_metrics()
    return page


def test_diagnoses_lifecycle_and_runbooks_over_http(service) -> None:
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued, StaticPageServer(stepping_page("healthy")) as fine:
        assert c.post("/api/v1/targets", json={"name": "busy", "url": queued.url}).status_code == 201
        assert c.post("/api/v1/targets", json={
            "name": "calm", "url": fine.url,
            "hardware": {"gpu": "A100-80G", "model": "llama-3.1-8b", "weight_dtype": "bf16"}}).status_code == 201
        last = None
        for _ in range(24):
            service.scrape("busy")
            last = service.scrape("calm")
    first = service.monitor.evaluate_diagnoses(now=last.ts)
    assert {(d.target, d.verdict) for d, _ in first} == {("busy", "queueing"), ("calm", "healthy")}
    body = c.get("/api/v1/diagnoses").json()
    busy = next(d for d in body if d["target"] == "busy")
    assert busy["verdict"] == "queueing" and busy["active"] == []  # pending after one evaluation
    assert busy["findings"][0]["state"] == "pending"
    service.monitor.evaluate_diagnoses(now=last.ts + 1)
    busy = next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "busy")
    assert busy["active"] == ["queueing"]
    finding = busy["findings"][0]
    assert finding["primary"] and finding["severity"] == "critical"
    share = next(e for e in finding["evidence"] if e["name"] == "queue share of TTFT")
    assert share["value"] > 0.9 and share["threshold"] == 0.5 and share["met"]
    assert any("--max-num-seqs" in r for r in finding["remedies"])
    assert finding["runbook_url"].endswith("/runbooks/queueing")
    # the window every evidence number of the finding was computed over: the latest evaluation's
    assert finding["window"]["end"] == last.ts + 1
    assert finding["window"]["start"] == pytest.approx(last.ts + 1 - 60.0)
    assert finding["window"]["seconds"] == pytest.approx(60.0)
    calm = next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "calm")
    assert calm["verdict"] == "healthy" and calm["signals"]["decode_floor_seconds"] > 0.007

    metrics = c.get("/metrics").text
    assert 'llm_latency_diagnosis_verdict{model="meta-llama/Llama-3.1-8B-Instruct",target="busy",' \
        'verdict="queueing"} 1.0' in metrics
    assert 'regime="queueing",severity="critical",state="active",target="busy"}' in metrics
    assert 'llm_latency_finding_threshold{evidence="queue share of TTFT",model="meta-llama/Llama-3.1-8B-Instruct",' \
           'regime="queueing",target="busy"} 0.5' in metrics
    assert 'llm_latency_finding_remedy_info{model="meta-llama/Llama-3.1-8B-Instruct",rank="1",regime="queueing",' \
        'remedy="The batch is full at 8 running requests while the KV cache has room: raise --max-num-seqs"' in metrics

    history = c.get("/api/v1/diagnoses/history", params={"target": "busy"}).json()
    assert [(h["regime"], h["state"]) for h in history] == [("queueing", "active")]
    assert history[0]["activated_at"] == last.ts + 1
    assert history[0]["window"] == finding["window"]  # persisted with the finding
    on_demand = c.get("/api/v1/targets/busy/diagnosis", params={"window": "2m", "end": last.ts}).json()
    assert on_demand[0]["verdict"] == "queueing" and on_demand[0]["window"]["seconds"] == 120.0
    assert on_demand[0]["findings"][0]["window"] == on_demand[0]["window"]
    exact = c.get("/api/v1/targets/busy/diagnosis", params={"start": last.ts - 120, "end": last.ts}).json()
    assert exact[0]["window"]["seconds"] == 120.0 and exact[0]["window"]["end"] == last.ts
    assert exact[0]["findings"][0]["evidence"] == on_demand[0]["findings"][0]["evidence"]
    backwards = c.get("/api/v1/targets/busy/diagnosis", params={"start": last.ts, "end": last.ts - 1})
    assert backwards.status_code == 422 and backwards.json()["detail"][0]["loc"] == ["query", "start"]
    assert c.get("/api/v1/targets/nope/diagnosis").status_code == 404
    runbook = c.get("/runbooks/queueing")
    assert runbook.status_code == 200 and "<strong>Verify the fix.</strong>" in runbook.text
    assert c.get("/runbooks/slow").status_code == 404
    bad = c.post("/api/v1/targets", json={"name": "x", "url": "http://127.0.0.1:1/m", "hardware": {"gpu": "TPU"}})
    assert bad.status_code == 422 and "unknown gpu 'TPU'" in bad.text
