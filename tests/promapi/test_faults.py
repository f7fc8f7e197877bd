"""PrometheusClient against local servers scripted to fail one way each: every fault is a
PromAPIError of one fixed kind whose message quotes nothing the server sent nor any secret.

The real-server behaviour (answers equal to the API's own) is in test_real_servers.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.promql.client import PromAPIError, PrometheusClient, format_duration, format_time
from tests.promapi.local_api import Answer, LocalAPI, Received
from tests.support.components import require_binary
from tests.support.prometheus import free_port

SECRET = "s3cret-token-0123"
LEAK = "LEAKED-SERVER-TEXT"  # put in every scripted body: must never reach a message
T = 1_700_000_000.25


def envelope(data: object, **extra: object) -> bytes:
    return json.dumps({"status": "success", "data": data, **extra}).encode()


VECTOR = envelope({"resultType": "vector", "result": [
    {"metric": {"__name__": "up", "pod": "a"}, "value": [T, "1"]},
    {"metric": {"pod": "b"}, "value": [T, "NaN"]},
    {"metric": {"pod": "c"}, "value": [T, "+Inf"]},
    {"metric": {"pod": "d"}, "value": [T, "-Inf"]},
]})


def fault(handler, **client_args) -> PromAPIError:
    """The PromAPIError a query to a server answering with ``handler`` raises."""
    with LocalAPI(handler) as api, PrometheusClient(api.url, **client_args) as client:
        with pytest.raises(PromAPIError) as info:
            client.query("up", T)
    err = info.value
    assert LEAK not in err.message and SECRET not in err.message and LEAK not in str(err)
    return err


MATRIX = envelope({"resultType": "matrix", "result": [
    {"metric": {"pod": "a"}, "values": [[T, "1"], [T + 15, "NaN"]]}]})


def test_values_times_and_form_sent_like_grafana() -> None:
    def handler(r: Received) -> Answer:
        return Answer(body=MATRIX if r.path.endswith("query_range") else VECTOR)

    with LocalAPI(handler) as api, PrometheusClient(api.url, timeout=2.5) as client:
        result = client.query('sum(up{namespace="llm"})', T)
        series = client.query_range("up", 1_700_000_000.0004, 1_700_000_060.9996, 15).data
    values = {s.labels["pod"]: s.value for s in result.data}
    assert values["a"] == 1.0 and values["c"] == float("inf") and values["d"] == float("-inf")
    assert values["b"] != values["b"]  # NaN
    assert result.data[0].labels == {"__name__": "up", "pod": "a"} and result.warnings == []
    assert series[0].labels == {"pod": "a"} and series[0].points[0] == (T, 1.0) and series[0].points[1][0] == T + 15
    first, second = api.received
    assert (first.method, first.path) == ("POST", "/api/v1/query")
    assert first.params == {"query": ['sum(up{namespace="llm"})'], "time": ["1700000000.250"], "timeout": ["2500ms"]}
    assert second.path == "/api/v1/query_range"
    assert (second.params["start"], second.params["end"], second.params["step"]) == (
        ["1700000000.000"], ["1700000061.000"], ["15.000"])
    assert format_time(-1.5) == "-1.500" and format_duration(20) == "20s" and format_duration(0.25) == "250ms"


def test_get_after_405() -> None:
    def handler(r: Received) -> Answer:
        return Answer(405, b"POST not allowed " + LEAK.encode()) if r.method == "POST" else Answer(body=VECTOR)

    with LocalAPI(handler) as api, PrometheusClient(api.url) as client:
        assert len(client.query("up", T).data) == 4
        assert len(client.query("up", T).data) == 4
        assert client.queries == 3  # one refused POST, then GET for both
    assert [r.method for r in api.received] == ["POST", "GET", "GET"]
    assert api.received[1].params["time"] == ["1700000000.250"]


def test_unreachable_closed_port() -> None:
    with PrometheusClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(PromAPIError) as info:
            client.query("up", T)
        assert client.queries == 1
    assert (info.value.kind, info.value.message) == ("unreachable", "connection refused")


def test_unreachable_unknown_host() -> None:
    with PrometheusClient("http://prometheus.invalid:9090", timeout=5) as client:
        with pytest.raises(PromAPIError) as info:
            client.query("up", T)
    assert (info.value.kind, info.value.message) == ("unreachable", "host name not resolved")


def test_timeout_slow_server() -> None:
    def slow(r: Received) -> Answer:
        time.sleep(2.0)
        return Answer(body=VECTOR)

    started = time.monotonic()
    err = fault(slow, timeout=0.5)
    assert (err.kind, err.message) == ("timeout", "no answer within 0.5s")
    assert time.monotonic() - started < 10  # abandoned, not waited for


def test_server_side_timeout_is_a_timeout() -> None:
    body = json.dumps({"status": "error", "errorType": "timeout", "error": LEAK}).encode()
    err = fault(lambda r: Answer(503, body))
    assert (err.kind, err.message) == ("timeout", "the server gave up on the query (timeout)")


@pytest.mark.parametrize(("status", "body", "message"), [
    (503, b"<html>" + LEAK.encode(), "HTTP 503 Service Unavailable"),
    (500, json.dumps({"status": "error", "errorType": "internal", "error": LEAK}).encode(),
     "HTTP 500 Internal Server Error (internal)"),
    (502, json.dumps({"status": "error", "errorType": LEAK, "error": LEAK}).encode(), "HTTP 502 Bad Gateway"),
    (302, b"", "HTTP 302 Found"),
])
def test_http_error_standard_phrase_only(status: int, body: bytes, message: str) -> None:
    headers = (("Content-Type", "text/html"), ("Location", f"http://login/{LEAK}"))
    err = fault(lambda r: Answer(status, body, headers))
    assert (err.kind, err.message) == ("http_error", message)


@pytest.mark.parametrize(("status", "error_type", "message"), [
    (400, "bad_data", "query rejected (bad_data): parse error at line 1, column 5"),
    (422, "execution", "query rejected (execution)"),
    (422, "422", "query rejected"),  # VictoriaMetrics puts the status there
])
def test_bad_query(status: int, error_type: str, message: str) -> None:
    error = f'invalid parameter "query": 1:5: parse error: {LEAK}' if error_type == "bad_data" else LEAK
    body = json.dumps({"status": "error", "errorType": error_type, "error": error}).encode()
    err = fault(lambda r: Answer(status, body))
    assert (err.kind, err.message) == ("bad_query", message)


@pytest.mark.parametrize(("body", "message"), [
    (b"<!doctype html><title>" + LEAK.encode() + b"</title>", "not a Prometheus API answer: an HTML page"),
    (json.dumps({"hello": LEAK}).encode(), "not a Prometheus API answer: a body that is not the API's JSON"),
    (json.dumps({"status": "success", "data": {"resultType": LEAK}}).encode(),
     "not a Prometheus API answer: unknown result type"),
    (envelope({"resultType": "vector", "result": [{"metric": {}, "value": [T, LEAK]}]}),
     "not a Prometheus API answer: malformed sample value"),
    (VECTOR[:-7], "not a Prometheus API answer: a body that is not the API's JSON"),  # cut JSON
])
def test_not_prometheus(body: bytes, message: str) -> None:
    err = fault(lambda r: Answer(200, body))
    assert (err.kind, err.message) == ("not_prometheus", message)


def test_connection_dropped_mid_body() -> None:
    err = fault(lambda r: Answer(200, VECTOR, close_after=20))
    assert (err.kind, err.message) == ("http_error", "the connection broke before the answer was complete")


def test_auth_headers_sent_and_refusal_classified() -> None:
    def check(r: Received) -> Answer:
        if r.headers.get("authorization") != f"Bearer {SECRET}":
            return Answer(401, f"bad token {LEAK}".encode(), (("WWW-Authenticate", LEAK),))
        return Answer(body=VECTOR)

    err = fault(check, bearer_token="wrong-" + SECRET)
    assert (err.kind, err.message) == ("auth", "HTTP 401 Unauthorized: the credentials were refused")
    assert fault(lambda r: Answer(403, LEAK.encode())).kind == "auth"
    with LocalAPI(check) as api, PrometheusClient(
        api.url, bearer_token=SECRET, headers={"X-Scope-OrgID": "tenant-a"}
    ) as client:
        assert len(client.query("up", T).data) == 4
        assert SECRET not in repr(client)
    assert api.received[0].headers["authorization"] == f"Bearer {SECRET}"
    assert api.received[0].headers["x-scope-orgid"] == "tenant-a"


def test_basic_auth_sent() -> None:
    with LocalAPI(lambda r: Answer(body=VECTOR)) as api, PrometheusClient(api.url, basic_auth=("u", SECRET)) as c:
        c.query("up", T)
    assert api.received[0].headers["authorization"] == "Basic " + base64.b64encode(f"u:{SECRET}".encode()).decode()


@pytest.mark.parametrize("length_known", [True, False])
def test_too_large(length_known: bool) -> None:
    big = envelope({"resultType": "vector", "result": [
        {"metric": {"pod": f"p{i}"}, "value": [T, "1"]} for i in range(200)]})
    assert len(big) > 5000
    err = fault(lambda r: Answer(body=big, length=length_known), max_response_bytes=5000)
    assert (err.kind, err.message) == ("too_large", "answer larger than 5000 bytes")
    with LocalAPI(lambda r: Answer(body=big, length=length_known)) as api, \
            PrometheusClient(api.url, max_response_bytes=len(big)) as c:
        assert len(c.query("up", T).data) == 200  # exactly at the bound is fine


def test_warnings_passed_through() -> None:
    body = envelope({"resultType": "vector", "result": []}, warnings=["store gateway unavailable: partial"])
    with LocalAPI(lambda r: Answer(body=body)) as api, PrometheusClient(api.url) as client:
        result = client.query("up", T)
    assert result.data == [] and result.warnings == ["store gateway unavailable: partial"]


def test_map_bounds_concurrency_keeps_order_and_counts() -> None:
    def slow(r: Received) -> Answer:
        time.sleep(0.3)
        if r.params["query"] == ["q7"]:
            return Answer(400, json.dumps({"status": "error", "errorType": "bad_data", "error": LEAK}).encode())
        n = r.params["query"][0][1:]
        return Answer(body=envelope({"resultType": "scalar", "result": [T, n]}))

    with LocalAPI(slow) as api, PrometheusClient(api.url, max_concurrency=3) as client:
        values = client.map(lambda i: client.query(f"q{i}", T).data[0].value, [i for i in range(12) if i != 7])
        assert values == [float(i) for i in range(12) if i != 7]
        assert api.max_in_flight == 3
        assert client.queries == 11
        with pytest.raises(PromAPIError) as info:
            client.map(lambda i: client.query(f"q{i}", T), range(12))
        assert info.value.kind == "bad_query"
        assert client.queries == 23  # every call ran to its end before the error was raised
        assert api.max_in_flight == 3


def test_queries_counted_across_threads() -> None:
    with LocalAPI(lambda r: Answer(body=VECTOR)) as api, PrometheusClient(api.url, max_concurrency=4) as client:
        threads = [threading.Thread(target=lambda: [client.query("up", T) for _ in range(10)]) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client.queries == 50 and len(api.received) == 50
        assert api.max_in_flight <= 4


def test_build_info_absent_and_check_selector_messages() -> None:
    rejected = json.dumps({"status": "error", "errorType": "bad_data", "error": LEAK}).encode()

    def handler(r: Received) -> Answer:
        if r.path.endswith("buildinfo"):
            return Answer(404, b"404 page not found", (("Content-Type", "text/plain"),))
        ok = r.params["match[]"] == ['{namespace="llm"}']
        return Answer(body=envelope([{"namespace": "llm"}])) if ok else Answer(400, rejected)

    with LocalAPI(handler) as api, PrometheusClient(api.url) as client:
        assert client.build_info() is None
        assert client.check_selector('{namespace="llm"}') is None
        assert client.check_selector("{namespace=") == "selector rejected (bad_data)"
    start, end = float(api.received[1].params["start"][0]), float(api.received[1].params["end"][0])
    assert end - start == pytest.approx(1.0, abs=0.002)


def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^url: "):
        PrometheusClient("ftp://x")
    with pytest.raises(ValueError, match="^timeout: "):
        PrometheusClient("http://x", timeout=0)
    (tmp_path / "ca.pem").write_text(LEAK)
    with pytest.raises(ValueError, match="^ca_file: ") as info:
        PrometheusClient("http://x", ca_file=str(tmp_path / "ca.pem"))
    assert LEAK not in str(info.value)


def test_tls_ca_file_and_insecure(tmp_path: Path) -> None:
    openssl = require_binary("openssl", "a self-signed certificate for the HTTPS client test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={LEAK}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    with LocalAPI(lambda r: Answer(body=VECTOR), tls=(str(cert), str(key))) as api:
        with PrometheusClient(api.url) as client, pytest.raises(PromAPIError) as info:
            client.query("up", T)
        assert info.value.kind == "unreachable"
        assert info.value.message == "TLS certificate verification failed (set a CA file, or skip verification)"
        with PrometheusClient(api.url, ca_file=str(cert)) as client:
            assert len(client.query("up", T).data) == 4
        with PrometheusClient(api.url, insecure_skip_verify=True) as client:
            assert len(client.query("up", T).data) == 4
