"""``GET /api/v1/capacity`` and the ``llm_latency_capacity_*`` gauges over HTTP, from real
scrapes of emulated engines: both say the same thing after a diagnosis round."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.api.test_diagnoses_api import stepping_page
from tests.support.pages import StaticPageServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _gauges(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("llm_latency_capacity_"):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_capacity_api_and_metrics_agree(service) -> None:
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued, StaticPageServer(stepping_page("healthy")) as fine, \
            StaticPageServer(stepping_page("prefill_interference")) as stalled:
        for name, server in (("busy", queued), ("calm", fine), ("stalled", stalled)):
            assert c.post("/api/v1/targets", json={"name": name, "url": server.url}).status_code == 201
        for _ in range(24):
            service.scrape("busy")
            service.scrape("stalled")
            last = service.scrape("calm")
    assert c.get("/api/v1/capacity").json() == []  # nothing diagnosed yet
    service.monitor.evaluate_diagnoses(now=last.ts)

    body = {a["target"]: a for a in c.get("/api/v1/capacity").json()}
    assert set(body) == {"busy", "calm", "stalled"}
    busy, calm, stalled = body["busy"], body["calm"], body["stalled"]
    assert (busy["reason"], busy["scaling_helps"], busy["current_replicas"]) == ("queueing", True, 1)
    assert busy["desired_replicas"] >= 5 and busy["bound_by"] == "slots"
    assert (calm["reason"], calm["scaling_helps"], calm["desired_replicas"]) == ("healthy", True, 1)
    assert calm["utilization"] < 0.9
    assert (stalled["reason"], stalled["scaling_helps"], stalled["desired_replicas"]) == \
        ("prefill_interference", False, 1)
    assert [a["target"] for a in c.get("/api/v1/capacity", params={"target": "busy"}).json()] == ["busy"]
    assert c.get("/api/v1/capacity", params={"target": "nope"}).status_code == 404

    gauges = _gauges(c.get("/metrics").text)
    for name, answer in body.items():
        key = (("model", MODEL), ("target", name))
        assert gauges["llm_latency_capacity_desired_replicas"][key] == answer["desired_replicas"]
        assert gauges["llm_latency_capacity_current_replicas"][key] == answer["current_replicas"]
        assert gauges["llm_latency_capacity_utilization"][key] == answer["utilization"]
        assert gauges["llm_latency_capacity_scaling_helps"][(*key[:1], ("reason", answer["reason"]), *key[1:])] \
            == (1.0 if answer["scaling_helps"] else 0.0)
        for input_name, value in answer["inputs"].items():
            assert gauges["llm_latency_capacity_input_utilization"][
                (("input", input_name), *key)] == value
