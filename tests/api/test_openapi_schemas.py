"""/openapi.json documents every JSON answer with a schema, and the schemas are true:
answers of a service with data (real scrapes, diagnoses, an alert, a probe) validate
against them with jsonschema."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from app.api.schemas import SignalsLatency
from app.emulator import EmulatorFleet, TargetSpec
from app.main import create_app
from app.settings import Settings
from app.sources.base import HISTOGRAM_SIGNALS
from tests.api.test_diagnoses_api import stepping_page
from tests.support.pages import StaticPageServer


def free_form(schema: dict[str, Any]) -> bool:
    """A schema that says nothing about the answer: ``{}``, an object without properties
    (any keys allowed), or an array of such."""
    if not schema:
        return True
    if schema.get("type") == "array":
        return free_form(schema.get("items", {}))
    return (schema.get("type") == "object" and "properties" not in schema
            and schema.get("additionalProperties", True) in (True, {}))


def json_responses(spec: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(method, path, status) -> schema of every 2xx JSON answer."""
    out = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                content = response.get("content", {}).get("application/json")
                if code.startswith("2") and content is not None:
                    out[(method.upper(), path, code)] = content["schema"]
    return out


def test_every_json_answer_has_a_schema(tmp_path: Path) -> None:
    spec = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path)).openapi()
    responses = json_responses(spec)
    assert ("GET", "/api/v1/targets/{name}/latency", "200") in responses
    assert len(responses) >= 29  # every JSON route of today
    offenders = sorted(f"{method} {path} {code}" for (method, path, code), schema in responses.items()
                       if free_form(schema))
    assert offenders == []


def test_the_latency_model_names_every_histogram_signal() -> None:
    """The response model drops keys it does not know: a new signal must be added to it."""
    assert [name for name in SignalsLatency.model_fields if name not in ("rates", "gauges")] == list(HISTOGRAM_SIGNALS)


def validator(spec: dict[str, Any], method: str, path: str, code: str = "200") -> jsonschema.Draft202012Validator:
    """A validator of the documented answer, resolving ``#/components/schemas/...`` in the spec."""
    schema = spec["paths"][path][method.lower()]["responses"][code]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**schema, "components": spec["components"]})


def wait_done(client: Any, run_id: int, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/api/v1/probes/{run_id}").json()
        if body["state"] != "running":
            return body
        time.sleep(0.05)
    raise AssertionError(f"probe {run_id} still running after {timeout}s")


def test_answers_with_data_validate_against_their_schemas(service: Any) -> None:
    c = service.client
    spec = c.get("/openapi.json").json()
    with StaticPageServer(stepping_page("queueing")) as queued, \
            EmulatorFleet([TargetSpec("quiet", "healthy", synthetic=False)]) as fleet:
        assert c.post("/api/v1/targets", json={"name": "busy", "url": queued.url}).status_code == 201
        assert c.post("/api/v1/targets", json={"name": "quiet", "url": fleet.urls["quiet"] + "/metrics"}
                      ).status_code == 201
        assert c.post("/api/v1/targets", json={"name": "gone", "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        for _ in range(24):
            last = service.scrape("busy")
        service.scrape("gone")  # refused: down
        service.scrape("quiet")
        started = c.post("/api/v1/probes", json={"target": "quiet", "prompt_tokens": 64, "max_tokens": 4,
                                                 "requests": 3})
        assert started.status_code == 202, started.text
        run_id = started.json()["id"]
        assert wait_done(c, run_id)["state"] == "done"
        service.scrape("quiet")
    service.monitor.evaluate_diagnoses(now=last.ts)
    service.monitor.evaluate_alerts()
    silence = c.post("/api/v1/silences", json={"matchers": ['target="gone"'], "duration": "1h", "createdBy": "me",
                                               "comment": "maintenance"})
    receiver = c.post("/api/v1/receivers", json={"name": "pager", "url": "http://127.0.0.1:9/hook",
                                                 "headers": {"X-Team": "inference"}})
    answers = [
        ("GET", "/api/v1/targets/{name}/latency", c.get("/api/v1/targets/busy/latency", params={"window": "1h"})),
        ("GET", "/api/v1/latency", c.get("/api/v1/latency", params={"window": "1h"})),
        ("GET", "/api/v1/diagnoses", c.get("/api/v1/diagnoses")),
        ("GET", "/api/v1/capacity", c.get("/api/v1/capacity")),
        ("GET", "/api/v1/diagnoses/history", c.get("/api/v1/diagnoses/history")),
        ("GET", "/api/v1/targets/{name}/diagnosis", c.get("/api/v1/targets/busy/diagnosis",
                                                          params={"window": "2m", "end": last.ts})),
        ("GET", "/api/v1/alerts", c.get("/api/v1/alerts")),
        ("GET", "/api/v1/silences", c.get("/api/v1/silences")),
        ("GET", "/api/v1/receivers", c.get("/api/v1/receivers")),
        ("GET", "/api/v1/probes/{run_id}", c.get(f"/api/v1/probes/{run_id}", params={"requests": True})),
        ("GET", "/api/v1/probes", c.get("/api/v1/probes")),
        ("GET", "/api/v1/targets/{name}/consistency", c.get("/api/v1/targets/quiet/consistency")),
        ("GET", "/api/v1/targets/{name}/consistency", c.get("/api/v1/targets/busy/consistency")),
        ("GET", "/api/v1/scrape-health", c.get("/api/v1/scrape-health")),
        ("GET", "/readyz", c.get("/readyz")),
    ]
    assert (silence.status_code, receiver.status_code) == (201, 201)
    answers += [("POST", "/api/v1/silences", silence), ("POST", "/api/v1/receivers", receiver)]
    for method, path, response in answers:
        code = str(response.status_code)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator(spec, method, path, code)
                  .iter_errors(response.json())]
        assert errors == [], f"{method} {path}"

    # the answers hold what the schemas describe, not empty lists
    latency = answers[0][2].json()
    assert latency["ttft"]["count"] > 0 and len(latency["models"]) == 1
    assert all(value is not None for value in latency.values())  # a signal without data is absent, not null
    assert [d["verdict"] for d in answers[2][2].json() if d["target"] == "busy"] == ["queueing"]
    assert answers[2][2].json()[0]["findings"][0]["evidence"][0]["name"]
    assert [(a["reason"], a["scaling_helps"]) for a in answers[3][2].json() if a["target"] == "busy"] == [
        ("queueing", True)]
    down = [a for a in answers[6][2].json() if a["alertname"] == "LLMLatencyTargetDown"]
    assert [(a["labels"]["target"], a["silencedBy"]) for a in down] == [("gone", [silence.json()["id"]])]
    assert answers[8][2].json()[0]["headers"] == {"X-Team": "<redacted>"}
    probe = answers[9][2].json()
    assert len(probe["requests"]) >= 3 and probe["consistency"]["client_requests"] >= 3
    assert answers[11][2].json()["status"] in ("ok", "insufficient_data")
    assert answers[12][2].json()["status"] == "no_probes" and "target_id" not in answers[12][2].json()

    # and the validator is not vacuous: a wrong type or a missing field is caught
    check = validator(spec, "GET", "/api/v1/targets/{name}/latency")
    assert not check.is_valid({**latency, "ttft": {**latency["ttft"], "count": "thirty"}})
    assert not check.is_valid({k: v for k, v in latency.items() if k != "window_seconds"})
    assert not validator(spec, "GET", "/api/v1/alerts").is_valid([{**down[0], "labels": None}])


@pytest.mark.parametrize(("path", "fields"), [
    ("/api/v1/targets/{name}/latency", {"target", "window_seconds", "ttft", "itl", "rates", "gauges", "models"}),
    ("/api/v1/diagnoses", {"target", "model", "verdict", "findings", "signals"}),
    ("/api/v1/alerts", {"fingerprint", "state", "labels", "startsAt", "silencedBy"}),
    ("/api/v1/receivers", {"name", "url", "headers", "has_secret", "source"}),
    ("/api/v1/probes/{run_id}", {"id", "state", "summary", "requests", "consistency"}),
])
def test_key_answers_are_documented_field_by_field(tmp_path: Path, path: str, fields: set[str]) -> None:
    spec = create_app(Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", data_dir=tmp_path)).openapi()
    schema = spec["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    ref = schema.get("items", schema)["$ref"]
    properties = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
    assert fields <= set(properties)
