"""Answers serialized in the request's worker thread (``app.api.common.serialized``) are the
bytes FastAPI's own ``response_model`` path makes of the same value, on a service with data."""

from __future__ import annotations

import operator
import time
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import TypeAdapter

from app.api.common import current_diagnoses, serialized
from app.api.routes import diagnoses as diagnoses_route
from app.api.routes import targets as targets_route
from app.api.schemas import DiagnosisOut, FleetLatencyOut, TargetLatencyOut, TargetOut
from app.store import repository
from app.store.models import Target
from app.targets import repository as target_repository
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


def test_kept_answers_follow_every_change(service) -> None:
    """The diagnoses' JSON kept per diagnosis and the round's fleet answer kept per round are
    FastAPI's bytes for the current value after every change: a new evaluation, a finding that
    turns active, a deleted target, a new summary round."""
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued, StaticPageServer(stepping_page("healthy")) as fine:
        for name, url in (("busy", queued.url), ("calm", fine.url)):
            assert c.post("/api/v1/targets", json={"name": name, "url": url}).status_code == 201
        last = None
        for _ in range(24):
            service.scrape("busy")
            last = service.scrape("calm")

    def expected() -> bytes:
        with service.monitor.sessions() as session:
            return fastapi_bytes(list[DiagnosisOut], current_diagnoses(session, service.monitor))

    service.monitor.evaluate_diagnoses(now=last.ts)
    first = c.get("/api/v1/diagnoses").content
    assert first == expected() and [d["findings"][0]["state"] for d in c.get("/api/v1/diagnoses").json()
                                    if d["target"] == "busy"] == ["pending"]
    kept = dict(diagnoses_route.DIAGNOSIS_JSON._kept)
    assert len(kept) == 2 and c.get("/api/v1/diagnoses").content == first
    assert all(a is b for a, b in zip(kept.values(), diagnoses_route.DIAGNOSIS_JSON._kept.values(),
                                      strict=True))  # reused
    service.monitor.evaluate_diagnoses(now=last.ts + 1)  # busy's finding turns active
    second = c.get("/api/v1/diagnoses").content
    assert second != first and second == expected()
    assert next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "busy")["active"] == ["queueing"]
    assert c.delete("/api/v1/targets/calm").status_code == 204
    third = c.get("/api/v1/diagnoses")
    assert third.content == expected() and [d["target"] for d in third.json()] == ["busy"]
    assert len(diagnoses_route.DIAGNOSIS_JSON) == 1

    service.monitor.refresh_summaries()
    kept_round = service.monitor.fleet_summary
    fleet = c.get("/api/v1/latency")
    assert fleet.content == fastapi_bytes(FleetLatencyOut, {"window": "5m", **kept_round.body})
    assert fleet.json()["targets"] == ["busy"] and c.get("/api/v1/latency").content == fleet.content
    assert c.get("/api/v1/latency?window=300s").json()["window"] == "300s"  # per spelling of the window
    assert targets_route.FLEET_ANSWERS._state[0] is kept_round and len(targets_route.FLEET_ANSWERS._state[1]) == 2
    service.monitor.refresh_summaries()  # a new round: a new answer
    assert service.monitor.fleet_summary is not kept_round
    assert c.get("/api/v1/latency").content == fastapi_bytes(
        FleetLatencyOut, {"window": "5m", **service.monitor.fleet_summary.body})
    assert targets_route.FLEET_ANSWERS._state[0] is service.monitor.fleet_summary


def test_the_targets_list_keeps_each_targets_json_until_it_changes(service) -> None:
    """The list is FastAPI's bytes for every target's current value; a target's JSON is made
    again only when it changed: its scrape, its labels, its removal."""
    c = service.client

    def expected() -> bytes:
        with service.monitor.sessions() as session:
            latest = repository.latest_scrapes(session)
            return fastapi_bytes(list[TargetOut], [targets_route.target_out(service.monitor, t, latest.get(t.id))
                                                   for t in target_repository.list_targets(session)])

    def kept() -> list[bytes]:
        return list(targets_route.TARGET_JSON._kept.values())

    with StaticPageServer(stepping_page("healthy")) as one, StaticPageServer(stepping_page("healthy")) as two:
        for name, url in (("a", one.url), ("b", two.url), ("c", two.url)):
            assert c.post("/api/v1/targets", json={"name": name, "url": url}).status_code == 201
        service.scrape("a")
        service.scrape("b")
        deadline = time.monotonic() + 30  # the detected engine is stored beside the scrape, in the background
        while [t["detected_engine"] for t in c.get("/api/v1/targets").json()] != ["vllm", "vllm", None]:
            assert time.monotonic() < deadline, "the detected engines were never stored"
            time.sleep(0.05)
        first = c.get("/api/v1/targets")
        assert first.content == expected()
        assert [t["last_scrape"] is None for t in first.json()] == [False, False, True]
        before = kept()
        assert c.get("/api/v1/targets").content == first.content and all(map(operator.is_, kept(), before))
        service.scrape("b")  # b's JSON is new, a's and c's are reused
        second = c.get("/api/v1/targets")
        assert second.content == expected()
        assert second.json()[1]["last_scrape"]["ts"] > first.json()[1]["last_scrape"]["ts"]
        assert [x is y for x, y in zip(kept(), before, strict=True)] == [True, False, True]
    assert c.patch("/api/v1/targets/c", json={"labels": {"team": "infra"}}).status_code == 200
    third = c.get("/api/v1/targets")
    assert third.content == expected() and third.json()[2]["labels"] == {"team": "infra"}
    assert c.delete("/api/v1/targets/a").status_code == 204
    assert c.get("/api/v1/targets").content == expected() and len(targets_route.TARGET_JSON) == 2


def test_a_targets_key_covers_every_column_of_the_targets_table() -> None:
    """A column left out of :func:`target_key` would let the list show an old value: a change
    of every column but the JSON ones (stood for by ``updated_at``, which every update sets)
    changes the key, and a column added to the table fails this until the key covers it."""
    stood_for_by_updated_at = {"labels", "hardware", "canary"}
    values = {"id": 1, "name": "a", "url": "http://127.0.0.1:1/metrics", "engine": "auto", "detected_engine": None,
              "scrape_interval": None, "scrape_timeout": None, "sample_limit": None, "series_limit": None,
              "stored_series_limit": None, "source": "api", "origin": None, "gone_at": None,
              "created_at": 1.0, "updated_at": 1.0}
    assert {c.key for c in Target.__table__.columns} == set(values) | stood_for_by_updated_at
    monitor = SimpleNamespace(settings=SimpleNamespace(
        default_scrape_interval=15.0, default_scrape_timeout=10.0, default_sample_limit=50_000,
        default_series_limit=5_000, default_stored_series_limit=10_000))
    key = targets_route.target_key(monitor, Target(**values), None, True)  # type: ignore[arg-type]
    for column in values:
        changed = {**values, column: "other" if isinstance(values[column], str) or values[column] is None else 2.0}
        assert targets_route.target_key(monitor, Target(**changed), None, True) != key, column  # type: ignore[arg-type]
