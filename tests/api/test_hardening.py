"""What a hostile or careless client cannot do: oversized bodies and fields, writes without
the token, numbers the service cannot represent; and a database outage answered as 503."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.alerts import silences
from app.core.limits import MAX_LABEL_VALUE_LENGTH, MAX_LABELS, MAX_MATCHERS, MAX_REQUEST_BYTES, MAX_URL_LENGTH
from app.main import create_app
from app.settings import Settings
from app.store.db import upgrade
from tests.api.conftest import make_service
from tests.conftest import scratch_postgres_database
from tests.support.live_app import serving

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TARGET = {"name": "a", "url": "http://127.0.0.1:9/metrics"}


# pydantic's wording for a dict over max_length: "not 33" up to 2.13, "not more" since 2.14.
_TOO_MANY_DICT_ITEMS = {f"Dictionary should have at most 32 items after validation, not {n}" for n in ("33", "more")}
TOO_MANY_ITEMS = "Dictionary with more than 32 items"


def detail(response) -> list:
    """(loc, msg) of each 422 error; pydantic's dict-length message in one wording."""
    return [(e["loc"], TOO_MANY_ITEMS if e["msg"] in _TOO_MANY_DICT_ITEMS else e["msg"])
            for e in response.json()["detail"]]


# ------------------------------------------------------------------ field bounds (422 naming the field)

def test_label_bounds(service) -> None:
    c = service.client
    long_value = c.post("/api/v1/targets", json={**TARGET, "labels": {"team": "x" * (MAX_LABEL_VALUE_LENGTH + 1)}})
    assert long_value.status_code == 422
    assert detail(long_value) == [(["body", "labels", "team"], "String should have at most 1024 characters")]
    long_name = c.post("/api/v1/targets", json={**TARGET, "labels": {"t" * 129: "x"}})
    assert long_name.status_code == 422
    assert detail(long_name) == [(["body", "labels", "t" * 129, "[key]"], "String should have at most 128 characters")]
    many = c.post("/api/v1/targets", json={**TARGET, "labels": {f"l{i}": "x" for i in range(MAX_LABELS + 1)}})
    assert many.status_code == 422
    assert detail(many) == [(["body", "labels"], TOO_MANY_ITEMS)]
    at_limit = c.post("/api/v1/targets", json={**TARGET, "labels": {"team": "x" * MAX_LABEL_VALUE_LENGTH}})
    assert at_limit.status_code == 201, at_limit.text
    patched = c.patch("/api/v1/targets/a", json={"labels": {"team": "x" * 2000}})
    assert patched.status_code == 422
    assert detail(patched) == [(["body", "labels", "team"], "String should have at most 1024 characters")]
    assert c.get("/api/v1/targets/a").json()["labels"] == {"team": "x" * MAX_LABEL_VALUE_LENGTH}


def test_url_name_and_interval_bounds(service) -> None:
    c = service.client
    url = "http://127.0.0.1:9/" + "m" * MAX_URL_LENGTH
    response = c.post("/api/v1/targets", json={**TARGET, "url": url})
    assert response.status_code == 422
    assert detail(response) == [(["body", "url"], "String should have at most 2048 characters")]
    response = c.post("/api/v1/targets", json={**TARGET, "name": "n" * 64})
    assert response.status_code == 422 and detail(response)[0][0] == ["body", "name"]
    response = c.post("/api/v1/targets", json={**TARGET, "scrape_interval": 1e300})
    assert response.status_code == 422
    assert detail(response) == [(["body", "scrape_interval"], "Input should be less than or equal to 86400")]
    response = c.post("/api/v1/targets", json={**TARGET, "canary": {"enabled": True, "interval": "2d"}})
    assert response.status_code == 422
    assert detail(response) == [(["body", "canary", "interval"], "Input should be less than or equal to 86400")]
    response = c.post("/api/v1/receivers", json={"name": "r", "url": "http://127.0.0.1:9/hook",
                                                 "headers": {f"X-H{i}": "v" for i in range(33)}})
    assert response.status_code == 422
    assert detail(response) == [(["body", "headers"], TOO_MANY_ITEMS)]


def silence(**fields: object) -> dict:
    return {"matchers": ['target="a"'], "duration": "1h", "createdBy": "me", "comment": "maintenance", **fields}


def test_silence_bounds(service) -> None:
    c = service.client
    response = c.post("/api/v1/silences", json=silence(matchers=[f'target="t{i}"' for i in range(MAX_MATCHERS + 1)]))
    assert response.status_code == 422
    assert detail(response) == [(["body", "matchers"], "List should have at most 32 items after validation, not 33")]
    response = c.post("/api/v1/silences", json=silence(matchers=['target="' + "a" * 1100 + '"']))
    assert response.status_code == 422
    assert detail(response) == [(["body", "matchers", "0"], "matcher 'target' too long: names have at most 128 "
                                                            "characters, values at most 1024")]
    response = c.post("/api/v1/silences", json=silence(matchers=[{"name": "target", "value": "a" * 1025}]))
    assert response.status_code == 422
    assert detail(response) == [(["body", "matchers", "0"], "matcher 'target' too long: names have at most 128 "
                                                            "characters, values at most 1024")]


def test_regex_re2_refuses_is_a_422_naming_the_matcher(service) -> None:
    response = service.client.post("/api/v1/silences", json=silence(matchers=['alertname="x"',
                                                                              'target=~"(a)\\\\1"']))
    assert response.status_code == 422
    assert detail(response) == [(["body", "matchers", "1"], "bad regex in matcher target: invalid escape sequence: "
                                                            "\\1 (regexes use RE2 syntax: no backreferences or "
                                                            "lookarounds, and compile within 1024 KiB)")]


def test_catastrophic_silence_regex_leaves_the_service_responsive(service) -> None:
    """The incident: a (a+)+ silence and an alert on a target named a...a-. Listing the
    alerts matches every alert against every silence; with RE2 it answers at once."""
    c = service.client
    name = "a" * 40 + "-"
    assert c.post("/api/v1/targets", json={"name": name, "url": "http://127.0.0.1:9/metrics"}).status_code == 201
    assert c.post("/api/v1/silences", json=silence(matchers=['target=~"(a+)+"'])).status_code == 201
    assert c.post("/api/v1/silences", json=silence(matchers=['target=~"(a+)+-"'])).status_code == 201
    service.scrape(name)  # refused connection: the target is down
    service.monitor.evaluate_alerts()  # LLMLatencyTargetDown, pending
    alerts = c.get("/api/v1/alerts")
    assert alerts.status_code == 200
    silences = {s["matchers"][0]["value"]: s["id"] for s in c.get("/api/v1/silences").json()}
    assert [(a["alertname"], a["labels"]["target"], a["silencedBy"]) for a in alerts.json()] == [
        ("LLMLatencyTargetDown", name, [silences["(a+)+-"]])]
    assert c.get("/healthz").json() == {"status": "ok"}


# ------------------------------------------------------------------ numbers the service cannot represent

@pytest.mark.parametrize(("url", "loc", "msg"), [
    ("/api/v1/targets/a/latency?end=1e308", ["query", "end"], "Input should be less than or equal to 253402300799"),
    ("/api/v1/targets/a/latency?end=nan", ["query", "end"], "Input should be a finite number"),
    ("/api/v1/targets/a/latency?end=inf", ["query", "end"], "Input should be a finite number"),
    ("/api/v1/targets/a/latency?start=-1e308&end=1", ["query", "start"], "Input should be greater than or equal to 0"),
    ("/api/v1/targets/a/latency?window=9999999999999y", ["query", "window"],
     "must be between 1s and 2.6784e+06s, got '9999999999999y'"),
    ("/api/v1/latency?start=nan", ["query", "start"], "Input should be a finite number"),
    ("/api/v1/targets/a/series?end=1e308", ["query", "end"], "Input should be less than or equal to 253402300799"),
    ("/api/v1/targets/a/series?end=-inf", ["query", "end"], "Input should be a finite number"),
    ("/api/v1/targets/a/diagnosis?window=5m&end=1e308", ["query", "end"],
     "Input should be less than or equal to 253402300799"),
    ("/api/v1/targets/a/diagnosis?start=nan&end=5", ["query", "start"], "Input should be a finite number"),
    ("/api/v1/targets/a/consistency?end=1e308", ["query", "end"], "Input should be less than or equal to 253402300799"),
    ("/api/v1/probes/99999999999999999999999", ["path", "run_id"],
     "Input should be less than or equal to 9223372036854775807"),
    ("/api/v1/probes/0", ["path", "run_id"], "Input should be greater than or equal to 1"),
    ("/api/v1/notifications?limit=99999999999999999999999", ["query", "limit"],
     "Input should be less than or equal to 1000"),
    ("/api/v1/targets/a/scrapes?limit=99999999999999999999999", ["query", "limit"],
     "Input should be less than or equal to 1000"),
])
def test_out_of_range_parameters_are_422(service, url: str, loc: list, msg: str) -> None:
    assert service.client.post("/api/v1/targets", json=TARGET).status_code == 201
    response = service.client.get(url)
    assert response.status_code == 422, response.text
    assert detail(response) == [(loc, msg)]


def test_silence_id_beyond_64_bits_is_not_found(service) -> None:
    """Silence ids are UUIDs (text): a huge number is just an unknown id."""
    response = service.client.get("/api/v1/silences/99999999999999999999999")
    assert response.status_code == 404
    assert response.json() == {"detail": "silence '99999999999999999999999' not found"}


@pytest.mark.parametrize(("path", "body", "loc", "msg"), [
    ("/api/v1/silences", '{"matchers": ["a=\\"b\\""], "endsAt": 1e999999, "createdBy": "x", "comment": "y"}',
     ["body", "endsAt"], "Input should be a finite number"),
    ("/api/v1/silences", '{"matchers": ["a=\\"b\\""], "startsAt": 1e300, "duration": "1h", "createdBy": "x", '
     '"comment": "y"}', ["body", "startsAt"], "Input should be less than or equal to 253402300799"),
    ("/api/v1/silences", '{"matchers": ["a=\\"b\\""], "startsAt": 253402300000, "duration": "1d", "createdBy": "x", '
     '"comment": "y"}', ["body", "duration"], "the silence would end after 9999-12-31T23:59:59Z"),
    ("/api/v1/targets", '{"name": "t", "url": "http://127.0.0.1:9/m", "scrape_interval": 1e999999}',
     ["body", "scrape_interval"], "Value error, duration must be a finite, non-negative number of seconds: inf"),
    ("/api/v1/targets", '{"name": "t", "url": "http://127.0.0.1:9/m", "hardware": {"hbm_bandwidth": 1e999999, '
     '"model": "llama-3.1-8b"}}', ["body", "hardware", "hbm_bandwidth"], "Input should be a finite number"),
    ("/api/v1/targets", '{"name": "t", "url": "http://127.0.0.1:9/m", "hardware": {"hbm_bandwidth": NaN, '
     '"model": "llama-3.1-8b"}}', ["body", "hardware", "hbm_bandwidth"], "Input should be a finite number"),
    ("/api/v1/probes", '{"url": "http://127.0.0.1:9", "timeout": 1e999999}',
     ["body", "timeout"], "Value error, duration must be a finite, non-negative number of seconds: inf"),
])
def test_unrepresentable_numbers_in_bodies_are_422(service, path: str, body: str, loc: list, msg: str) -> None:
    response = service.client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert detail(response) == [(loc, msg)]


# ------------------------------------------------------------------ body size and auth before the body

def test_body_over_the_limit_is_413(migrated_url: str, tmp_path: Path) -> None:
    for svc in make_service(migrated_url, tmp_path, max_request_bytes=2000):
        c = svc.client
        filler = "x" * (2000 - len('{"name":"a","url":"http://127.0.0.1:9/m","labels":{"f":""}}'))
        at_limit = f'{{"name":"a","url":"http://127.0.0.1:9/m","labels":{{"f":"{filler[:1000]}"}}}}'
        response = c.post("/api/v1/targets", content=at_limit, headers={"Content-Type": "application/json"})
        assert response.status_code == 201, response.text
        over = '{"name":"b","url":"http://127.0.0.1:9/m","labels":{"f":"' + "x" * 2000 + '"}}'
        response = c.post("/api/v1/targets", content=over, headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        assert response.json() == {"detail": "request body larger than 2000 bytes (LLM_LATENCY_MAX_REQUEST_BYTES)"}
        assert c.get("/api/v1/targets/b").status_code == 404


def test_default_limit_is_one_mebibyte(service) -> None:
    assert MAX_REQUEST_BYTES == 1024 * 1024
    huge = '{"name":"a","url":"http://127.0.0.1:9/m","labels":{"f":"' + "x" * (3 * 1024 * 1024) + '"}}'
    response = service.client.post("/api/v1/targets", content=huge, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert response.json() == {"detail": "request body larger than 1048576 bytes (LLM_LATENCY_MAX_REQUEST_BYTES)"}


def test_writes_without_the_token_are_refused_and_reads_are_not(migrated_url: str, tmp_path: Path) -> None:
    for svc in make_service(migrated_url, tmp_path, api_token=TOKEN):
        c = svc.client
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                        {"Authorization": TOKEN}):
            response = c.post("/api/v1/targets", json=TARGET, headers=headers)
            assert response.status_code == 401
            assert response.json() == {"detail": "missing or wrong API token"}
            assert response.headers["www-authenticate"] == "Bearer"
        assert c.post("/api/v1/silences", json=silence()).status_code == 401
        assert c.delete("/api/v1/silences/x").status_code == 401
        assert c.post("/api/v1/targets", json=TARGET, headers={"Authorization": f"bearer {TOKEN}"}).status_code == 201
        assert c.get("/api/v1/targets").status_code == 200
        assert [t["name"] for t in c.get("/api/v1/targets").json()] == ["a"]


def live_server(settings: Settings) -> contextlib.AbstractContextManager[int]:
    """The app under uvicorn on a free loopback port, in a thread; yields the port."""
    return serving(create_app(settings))


def raw_request(port: int, head: str, body: bytes) -> bytes:
    """Send a request head and the first part of a body that is never finished, then read
    what the server answers: a server that waited for the whole body would answer nothing."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_limits_apply_before_the_body_is_read(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'live.db'}"
    settings = Settings(database_url=db, data_dir=tmp_path, default_scrape_interval="1h", api_token=TOKEN)
    with live_server(settings) as port:
        # 200 MB announced, 64 KiB sent, no token: 401 at once
        head = (f"POST /api/v1/targets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {200 * 1024 * 1024}\r\n\r\n")
        answer = raw_request(port, head, b"x" * 65536)
        assert answer.startswith(b"HTTP/1.1 401 ")
        assert answer.endswith(b'{"detail": "missing or wrong API token"}')
        # the same with the token: 413 from Content-Length alone
        head = head.replace("Host: x\r\n", f"Host: x\r\nAuthorization: Bearer {TOKEN}\r\n")
        answer = raw_request(port, head, b"")
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert answer.endswith(b'{"detail": "request body larger than 1048576 bytes (LLM_LATENCY_MAX_REQUEST_BYTES)"}')
        # chunked, no length: 413 once 1 MiB + 64 KiB has arrived, the last chunk never sent
        head = (f"POST /api/v1/targets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
        answer = raw_request(port, head, chunk * 17)
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert answer.endswith(b'{"detail": "request body larger than 1048576 bytes (LLM_LATENCY_MAX_REQUEST_BYTES)"}')


# ------------------------------------------------------------------ the database goes away

def test_database_outage_is_503(tmp_path: Path) -> None:
    """A real PostgreSQL database dropped under the running service (its connections
    terminated): reads and writes answer 503 with a JSON detail, /healthz still 200."""
    with scratch_postgres_database("llm_latency_outage") as database:
        upgrade(database.url)
        app = create_app(Settings(database_url=database.url, data_dir=tmp_path, default_scrape_interval="1h"))
        with TestClient(app) as c:
            assert c.post("/api/v1/targets", json=TARGET).status_code == 201
            assert [t["name"] for t in c.get("/api/v1/targets").json()] == ["a"]
            database.drop()
            for response in (c.get("/api/v1/targets"), c.get("/api/v1/targets/a/latency"),
                             c.post("/api/v1/targets", json={**TARGET, "name": "b"}), c.get("/api/v1/alerts")):
                assert response.status_code == 503, response.text
                assert response.json() == {"detail": "database unavailable (OperationalError); retry later"}
                assert response.headers["retry-after"] == "5"
            assert c.get("/healthz").json() == {"status": "ok"}
            assert c.get("/readyz").status_code == 503


# ------------------------------------------------------------------ the targets YAML obeys the same bounds

def test_config_file_field_bounds(tmp_path: Path) -> None:
    from app.config import ConfigError, load_config

    path = tmp_path / "targets.yaml"
    path.write_text("targets:\n  - name: a\n    url: http://127.0.0.1:9/metrics\n"
                    f"    labels: {{team: {'x' * 1025}}}\n"
                    "alerts:\n  receivers:\n    - {name: r, url: http://127.0.0.1:9/hook, match: {"
                    + ", ".join(f"l{i}: v" for i in range(33)) + "}}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "targets[0].labels.team: String should have at most 1024 characters" in message
    assert "alerts.receivers[0].match: Dictionary should have at most 32 items after validation, not " in message


def test_silences_compiled_regexes_stay_within_their_memory_budget(service) -> None:
    """Each regex compiles within REGEX_MAX_MEM (a larger program is refused, naming the matcher),
    and the silences in force together within COMPILED_BUDGET: the silence past it is a 422 naming
    the budget, and the process grows by less than the budget while they are made and matched."""
    c = service.client
    alternatives = "|".join(("abcdefghijklmnopqrstuvwxyz" * 2)[i:i + 16] for i in range(6))
    huge = c.post("/api/v1/silences", json=silence(matchers=[f'target=~"(({alternatives}){{25}}){{40}}"']))
    assert huge.status_code == 422 and "pattern too large" in huge.text and "compile within 1024 KiB" in huge.text
    big = "((abcdefghijklmnop|qrstuvwxyzabcdef){25}){40}"  # 34,084 instructions
    each = silences.program_bytes(silences.compile_regex("target", big))
    assert each == 2 * 34_084 * 8
    fits = silences.COMPILED_BUDGET // each
    rss_before = _rss()
    made = []
    for i in range(fits + 5):
        r = c.post("/api/v1/silences", json=silence(matchers=[f'target=~"{big}|q{i}"']))
        made.append(r.status_code)
        if r.status_code != 201:
            assert r.status_code == 422, r.text
            assert "the budget for all silences in force is 64 MiB" in r.text, r.text
            break
    assert made.count(201) in (fits - 1, fits) and made[-1] == 422, (made.count(201), fits)
    assert c.get("/api/v1/alerts").status_code == 200  # every silence matched against the alerts
    assert _rss() - rss_before < silences.COMPILED_BUDGET, (_rss() - rss_before) / 2**20


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096
