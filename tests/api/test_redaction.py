"""What readers without the API token see of secrets and of text fetched from elsewhere
(README "Security"): scrape errors name the line and the kind of problem but never quote the
page; receiver header values are redacted for everyone; a receiver's answer and a probed
server's error body are shown only to requests carrying the token. Every server here is a
real local HTTP server; the service is the real app on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.api.redaction import REDACTED
from app.scrape.client import ScrapeError
from tests.alerts.harness import alerting
from tests.api.conftest import make_service
from tests.probe.servers import FakeOpenAI
from tests.probe.test_api import wait_done
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer
from tests.support.raw_http import fetch_raw

TOKEN = "redaction-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-token"}
SECRET = "sk-live-"  # every secret below starts with this


def test_a_page_with_secret_lines_is_reported_by_position_and_never_quoted(migrated_url: str,
                                                                          tmp_path: Path) -> None:
    env_file = "# deployment settings\nAPI_HOST=10.0.0.5\nSECRET_API_KEY=sk-live-envfile-0001\n"
    lines = VllmPage().render().decode().splitlines()
    mixed = "\n".join(lines[:5] + ["SECRET_API_KEY=sk-live-mixed-0002"] + lines[5:]) + "\n"  # line 6
    with StaticPageServer(env_file) as env, StaticPageServer(mixed) as vllm, StaticPageServer("") as refusing:
        refusing.status, refusing.reason = 503, "Unavailable SECRET_API_KEY=sk-live-reason-0003"
        for svc in make_service(migrated_url, tmp_path, api_token=TOKEN):
            c = svc.client
            for name, server in (("env", env), ("mixed", vllm), ("refusing", refusing)):
                assert c.post("/api/v1/targets", json={"name": name, "url": server.url},
                              headers=AUTH).status_code == 201
                svc.scrape(name)
            paths = ["/api/v1/scrape-health", "/api/v1/targets", "/", "/targets/env", "/targets/mixed",
                     "/targets/refusing"] + [f"/api/v1/targets/{n}/scrapes" for n in ("env", "mixed", "refusing")]
            anonymous = {path: c.get(path) for path in paths}
            holder = {path: c.get(path, headers=AUTH) for path in paths if path.startswith("/api/")}
    assert {path: r.status_code for path, r in anonymous.items()} == dict.fromkeys(paths, 200)
    assert [path for path, r in anonymous.items() if SECRET in r.text or "SECRET_API_KEY" in r.text] == []
    # never stored, so a token shows nothing more
    assert {path: r.json() for path, r in holder.items()} == {path: anonymous[path].json() for path in holder}

    def last(name: str) -> tuple:
        [scrape] = anonymous[f"/api/v1/targets/{name}/scrapes"].json()
        return (scrape["up"], scrape["error_class"], scrape["samples_seen"], scrape["malformed_lines"],
                scrape["error"])

    assert last("env") == (False, "parse_error", 0, 2, "line 2: invalid metric name; line 3: invalid metric name")
    assert last("mixed")[:2] == (True, "partial") and last("mixed")[3:] == (1, "line 6: invalid metric name")
    assert last("refusing") == (False, "http_status", 0, 0, "HTTP 503 Service Unavailable")
    health = {h["target"]: h["last"]["error"] for h in anonymous["/api/v1/scrape-health"].json()}
    assert health == {"env": "line 2: invalid metric name; line 3: invalid metric name",
                      "mixed": "line 6: invalid metric name", "refusing": "HTTP 503 Service Unavailable"}
    # the status page shows the same words
    assert "line 2: invalid metric name; line 3: invalid metric name" in anonymous["/"].text
    assert "line 6: invalid metric name" in anonymous["/targets/mixed"].text
    assert "HTTP 503 Service Unavailable" in anonymous["/targets/refusing"].text


@pytest.mark.parametrize(("response", "error_class", "message"), [
    (b"SECRET_API_KEY=sk-live-status-0004\r\n\r\n", "http_protocol",
     "malformed HTTP response (status line, headers or chunk framing)"),
    (b"HTTP/1.1 200 OK\r\nX-Debug SECRET_API_KEY=sk-live-header-0005\r\n\r\n", "http_protocol",
     "malformed HTTP response (status line, headers or chunk framing)"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nSECRET_API_KEY=sk-live-chunk-0006\r\n", "http_protocol",
     "malformed HTTP response (status line, headers or chunk framing)"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nSECRET_API_KEY=sk-live-short-0007", "payload",
     "broken response body (ContentLengthError)"),
], ids=["status-line", "header", "chunk", "short-body"])
def test_a_malformed_response_is_named_by_its_defect_not_its_bytes(response: bytes, error_class: str,
                                                                    message: str) -> None:
    """aiohttp's own messages quote the offending bytes; the fetcher's do not."""
    error = asyncio.run(fetch_raw(response))
    assert isinstance(error, ScrapeError)
    assert (error.error_class, str(error)) == (error_class, message)


def test_receiver_header_values_are_redacted_for_everyone(migrated_url: str, tmp_path: Path) -> None:
    bearer = "Bearer sk-live-receiver-0008"
    receivers = {"oncall": {"headers": {"Authorization": bearer, "X-Team": "inference"}}}
    with alerting(migrated_url, tmp_path, {"a": {}}, receivers, service={"api_token": TOKEN}) as h:
        c = h.svc.client
        h.down("a")
        h.at(0)
        sent = h.hooks["oncall"].received[0].headers
        created = c.post("/api/v1/receivers", json={"name": "pager", "url": "http://127.0.0.1:9/hook",
                                                    "headers": {"X-Api-Key": "sk-live-receiver-0009"}}, headers=AUTH)
        anonymous = c.get("/api/v1/receivers")
        holder = c.get("/api/v1/receivers", headers=AUTH)
        hook_url = h.hooks["oncall"].url
    assert sent["Authorization"] == bearer and sent["X-Team"] == "inference"  # still sent as configured
    assert created.status_code == 201 and created.json()["headers"] == {"X-Api-Key": REDACTED}
    assert SECRET not in anonymous.text and SECRET not in holder.text and SECRET not in created.text
    assert holder.json() == anonymous.json()
    assert {r["name"]: r for r in anonymous.json()} == {
        "oncall": {"name": "oncall", "url": hook_url, "kind": "webhook",
                   "headers": {"Authorization": REDACTED, "X-Team": REDACTED}, "timeout": 10.0, "secret_env": None,
                   "match": {}, "send_resolved": True, "has_secret": False, "source": "config"},
        "pager": {"name": "pager", "url": "http://127.0.0.1:9/hook", "kind": "webhook",
                  "headers": {"X-Api-Key": REDACTED}, "timeout": 10.0, "secret_env": None, "match": {},
                  "send_resolved": True, "has_secret": False, "source": "api"},
    }


def test_a_receivers_answer_is_shown_only_with_the_token(migrated_url: str, tmp_path: Path) -> None:
    answer = '{"error": "cannot reach postgres://alerts:sk-live-db-0010@db/alerts"}'
    with alerting(migrated_url, tmp_path, {"a": {}}, {"oncall": {}}, service={"api_token": TOKEN}) as h:
        hook = h.hooks["oncall"]
        hook.status, hook.response_body = 500, answer.encode()
        h.down("a")
        assert h.at(0) == {"oncall": []}
        c = h.svc.client
        anonymous = c.get("/api/v1/notifications")
        wrong = c.get("/api/v1/notifications", headers=WRONG)
        holder = c.get("/api/v1/notifications", headers=AUTH)

    def attempts(response) -> list[tuple]:
        [notification] = response.json()
        assert (notification["state"], notification["attempts"], notification["lastError"]) == ("pending", 1,
                                                                                              "HTTP 500")
        return [(a["attempt"], a["statusCode"], a["response"], a["error"]) for a in notification["attemptLog"]]

    assert attempts(anonymous) == [(1, 500, REDACTED, "HTTP 500")]
    assert SECRET not in anonymous.text
    assert wrong.status_code == 200 and wrong.json() == anonymous.json()  # a wrong token reads like none
    assert attempts(holder) == [(1, 500, answer, "HTTP 500")]


def test_a_probed_servers_error_body_is_shown_only_with_the_token(migrated_url: str, tmp_path: Path) -> None:
    message = "upstream key sk-live-probe-0011 rejected"
    with FakeOpenAI() as fake:
        fake.error_message = message
        for svc in make_service(migrated_url, tmp_path, api_token=TOKEN):
            c = svc.client
            assert c.post("/api/v1/probes", json={"url": fake.url("http500"), "requests": 2,
                                                  "max_tokens": 4}).status_code == 401
            started = c.post("/api/v1/probes", json={"url": fake.url("http500"), "requests": 2, "max_tokens": 4},
                             headers=AUTH)
            assert started.status_code == 202, started.text
            run_id = started.json()["id"]
            run = wait_done(c, run_id)
            anonymous = c.get(f"/api/v1/probes/{run_id}", params={"requests": True})
            holder = c.get(f"/api/v1/probes/{run_id}", params={"requests": True}, headers=AUTH)
            listed = c.get("/api/v1/probes")
    assert (run["state"], run["summary"]["requests"], run["summary"]["errors"]) == ("done", 2, {"http_status": 2})

    def requests(response) -> list[tuple]:
        return [(r["error"], r["status_code"], r["tokens"], r["detail"]) for r in response.json()["requests"]]

    assert requests(anonymous) == [("http_status", 500, 0, REDACTED)] * 2
    assert SECRET not in anonymous.text and SECRET not in listed.text
    quoted = "HTTP 500: " + json.dumps({"error": {"message": message, "code": 500}})
    assert requests(holder) == [("http_status", 500, 0, quoted)] * 2
    assert {k: v for k, v in holder.json().items() if k != "requests"} == \
        {k: v for k, v in anonymous.json().items() if k != "requests"}


def test_a_password_in_a_target_url_is_shown_only_with_the_token(migrated_url: str, tmp_path: Path) -> None:
    url = "http://scraper:hunter2-secret@127.0.0.1:9/metrics"
    for svc in make_service(migrated_url, tmp_path, api_token=TOKEN):
        c = svc.client
        assert c.post("/api/v1/targets", json={"name": "basic", "url": url}, headers=AUTH).status_code == 201
        shown = "http://scraper:***@127.0.0.1:9/metrics"
        assert c.get("/api/v1/targets/basic").json()["url"] == shown
        assert [t["url"] for t in c.get("/api/v1/targets").json()] == [shown]
        assert c.get("/api/v1/targets/basic", headers={"Authorization": "Bearer wrong"}).json()["url"] == shown
        assert c.get("/api/v1/targets/basic", headers=AUTH).json()["url"] == url
        assert [t["url"] for t in c.get("/api/v1/targets", headers=AUTH).json()] == [url]
        page = c.get("/targets/basic", headers=AUTH).text  # the status page never shows it
        assert "hunter2" not in page and "scraper:***@127.0.0.1:9" in page
        assert "hunter2" not in c.get("/").text
