"""Answers serialized in the request's worker thread (``app.api.common.serialized``) are the
bytes FastAPI's own ``response_model`` path makes of the same value, on a service with data."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from app.api.common import current_diagnoses, serialized
from app.api.schemas import DiagnosisOut, FleetLatencyOut, TargetLatencyOut
from tests.api.test_diagnoses_api import stepping_page
from tests.support.pages import StaticPageServer


def fastapi_bytes(model: Any, value: Any) -> bytes:
    """What FastAPI answers for ``value`` returned by a route with this response model."""
    side = FastAPI()

    @side.get("/", response_model=model, response_model_exclude_unset=True)
    def answer() -> Any:
        return value
    return TestClient(side).get("/").content


def test_the_answers_are_fastapis_own_bytes(service) -> None:
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued:
        assert c.post("/api/v1/targets", json={"name": "busy", "url": queued.url}).status_code == 201
        last = None
        for _ in range(24):
            last = service.scrape("busy")
    service.monitor.evaluate_diagnoses(now=last.ts)
    service.monitor.evaluate_diagnoses(now=last.ts + 1)
    with service.monitor.sessions() as session:
        diagnoses = current_diagnoses(session, service.monitor)
    answer = c.get("/api/v1/diagnoses")
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == fastapi_bytes(list[DiagnosisOut], diagnoses)
    assert answer.json()[0]["verdict"] == "queueing" and answer.json()[0]["active"] == ["queueing"]

    window = f"start={last.ts - 60}&end={last.ts}"
    for path, model in ((f"/api/v1/targets/busy/latency?{window}", TargetLatencyOut),
                        (f"/api/v1/latency?{window}", FleetLatencyOut)):
        answer = c.get(path)
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        body = answer.json()
        assert body["ttft"]["count"] > 0
        assert model is FleetLatencyOut or "pd_role" not in body  # unset: left out, as exclude_unset does
        # the same value with a key the model does not know: dropped by both
        assert answer.content == fastapi_bytes(model, {**body, "unknown": 1}) == \
            serialized(TypeAdapter(model), {**body, "unknown": 1}, exclude_unset=True).body
