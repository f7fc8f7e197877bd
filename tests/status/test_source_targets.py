"""What the status page says of targets a Prometheus source reads: their health is the source's
last round (a replica by Prometheus' ``up``, a service by its replicas), never a scrape; a failing
source makes them unknown and stale; the empty index waits for a pending source and shows a curl
example with the service's own address; ``/readyz`` counts what the sources found."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from app.api.target_health import discovered_by, engine_origin, replica_counts, source_health, target_health
from app.promsource.status import SourceStatus
from tests.api.conftest import make_service
from tests.status.helpers import text_of
from tests.support.prometheus import free_port

ROUND = 1_700_000_000.0


def _target(tid: int, name: str, source: str, labels: dict[str, str], origin: str = "prod",
            gone_at: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(id=tid, name=name, source=source, origin=origin, labels=labels, gone_at=gone_at,
                           engine="vllm", detected_engine="vllm")


def _view(up: bool, ts: float = ROUND - 300.0) -> SimpleNamespace:
    return SimpleNamespace(up=up, ts=ts, error_class=None if up else "down", duration=0.0,
                           error=None if up else "the source's Prometheus reports up == 0 for this target")


def _status(ok: bool | None) -> SourceStatus:
    status = SourceStatus("prod", "prometheus", "http://127.0.0.1:9090", ["namespace", "pod"])
    status.last_round_ok = ok
    if ok:
        status.last_success = ROUND
    elif ok is False:
        status.last_success, status.last_error, status.last_error_at = ROUND - 60.0, "unreachable: refused", ROUND
    return status


A = _target(1, "prod.llm.a", "prometheus", {"namespace": "llm", "pod": "a", "service": "chat"})
B = _target(2, "prod.llm.b", "prometheus", {"namespace": "llm", "pod": "b", "service": "chat"})
C = _target(3, "prod.llm.c", "prometheus", {"namespace": "llm", "pod": "c", "service": "search"})
GONE = _target(4, "prod.llm.d", "prometheus", {"namespace": "llm", "pod": "d", "service": "chat"}, gone_at=ROUND)
CHAT = _target(5, "prod.svc.llm.chat", "service", {"namespace": "llm", "service": "chat"})
SEARCH = _target(6, "prod.svc.llm.search", "service", {"namespace": "llm", "service": "search"})
OTHER = _target(7, "edge.svc.llm.chat", "service", {"namespace": "llm", "service": "chat"}, origin="edge")


def test_a_services_health_counts_its_live_replicas_that_are_up() -> None:
    latest = {1: _view(True), 2: _view(False), 3: _view(True), 4: _view(True)}
    counts = replica_counts([A, B, C, GONE, CHAT, SEARCH, OTHER], latest)
    # the gone replica d and the other source's service share chat's labels: neither counts
    assert counts == {5: (1, 2), 6: (1, 1), 7: (0, 0)}
    ok = _status(True)
    chat = source_health(CHAT, None, ok, counts[5])
    assert (chat.state, chat.label, chat.error, chat.round_at, chat.stale) == \
        ("up", "up: 1/2 replicas", "1 of 2 replicas report up == 0", ROUND, False)
    assert source_health(SEARCH, None, ok, counts[6]).label == "up: 1/1 replicas"
    assert (source_health(CHAT, None, ok, (0, 3)).state, source_health(CHAT, None, ok, (0, 3)).label) == \
        ("down", "down: 0/3 replicas up")
    assert source_health(OTHER, None, ok, counts[7]).label == "no live replicas"


def test_a_replica_is_up_or_down_as_its_source_last_saw_it_and_stale_while_it_fails() -> None:
    ok, failing, pending = _status(True), _status(False), _status(None)
    up = source_health(A, _view(True), ok)
    assert (up.state, up.label, up.ts, up.round_at, up.stale) == ("up", "up", ROUND - 300.0, ROUND, False)
    down = source_health(B, _view(False), ok)
    assert (down.state, down.label, down.error_class, down.round_at) == ("down", "down", "down", ROUND)
    # a failing source: neither up nor down, stale, at the failed round's time - never "up" beside "stale"
    for target, view in ((A, _view(True)), (CHAT, None)):
        stale = source_health(target, view, failing, (2, 2))
        assert (stale.state, stale.label, stale.stale, stale.round_at) == ("unknown", "source failing", True, ROUND)
    assert source_health(A, None, pending).label == "not read yet"
    gone = source_health(GONE, _view(True), ok)  # its series stopped: not up, whatever its last view said
    assert (gone.state, gone.label, gone.round_at) == ("unknown", "gone", None)
    gone_source = source_health(A, _view(True), None)
    assert (gone_source.state, gone_source.stale) == ("unknown", True)
    # a scraped target keeps its scrape health, whatever the sources say
    scraped = _target(8, "vllm-1", "api", {}, origin=None)
    health = target_health(scraped, None, {"prod": failing}, {}, 15.0, ROUND)
    assert (health.state, health.label, health.stale) == ("unknown", "no scrape yet", False)
    assert target_health(A, _view(True), {"prod": failing}, {}, 15.0, ROUND).stale


def test_where_a_target_and_its_engine_come_from() -> None:
    assert discovered_by(A) == "Prometheus source prod"
    assert discovered_by(CHAT) == "service of Prometheus source prod"
    assert engine_origin(A) == "detected from the names of its series in Prometheus"
    assert engine_origin(CHAT) == "detected from the names of its replicas' series in Prometheus"
    configured = SimpleNamespace(source="api", engine="tgi", detected_engine=None)
    assert engine_origin(configured) == "configured"
    assert engine_origin(SimpleNamespace(source="config", engine="auto", detected_engine="vllm")) == \
        "detected from its metric names"
    assert engine_origin(SimpleNamespace(source="config", engine="auto", detected_engine=None)) == "not detected yet"


def _empty_state(page: str) -> tuple[str, str]:
    match = re.search(r'<section class="card empty-state" data-empty="(\w+)">(.*?)</section>', page, re.S)
    assert match, page
    return match.group(1), text_of(match.group(2))


def test_before_the_first_round_the_index_waits_for_the_source(migrated_url: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens: the first round, an hour away, would fail
    config = tmp_path / "t.yaml"
    config.write_text(f"""
targets: []
diagnosis: {{interval: 1h}}
sources:
  - name: prod
    url: http://127.0.0.1:{port}/prom
    target_labels: [namespace, pod]
""")
    for svc in make_service(migrated_url, tmp_path, config_file=config):
        c = svc.client
        kind, text = _empty_state(c.get("/").text)
        assert kind == "sources"
        assert re.fullmatch(rf"No targets yet: they come from a Prometheus source Waiting for the first round of "
                            rf"source prod \(http://127\.0\.0\.1:{port}/prom\): in ~\d+ min\.", text), text
        assert "curl" not in c.get("/").text and "No targets yet</h2>" not in c.get("/").text
        assert c.get("/readyz").json() == {"status": "ok", "database": "ok", "targets": 0,
                                           "sources": {"prod": "pending"}}
        # the source's round fails: the card says so under the banner, and still no curl example
        svc.monitor.evaluate_diagnoses()
        page = c.get("/").text
        kind, text = _empty_state(page)
        assert kind == "sources" and text.endswith("Source prod is failing (above): its targets appear once it "
                                                   "answers.")
        assert 'class="banner source-failing"' in page


def test_without_sources_the_curl_example_uses_the_services_own_address(migrated_url: str, tmp_path: Path) -> None:
    for svc in make_service(migrated_url, tmp_path):
        c = svc.client
        for host, base in (("monitor.example:9123", "http://monitor.example:9123"), (None, "http://testserver")):
            page = c.get("/", headers={"host": host} if host else {}).text
            kind, text = _empty_state(page)
            assert kind == "targets"
            assert f"curl -X POST {base}/api/v1/targets -H 'content-type: application/json'" in text, text
            assert "localhost:8000" not in page
        assert c.get("/readyz").json() == {"status": "ok", "database": "ok", "targets": 0}
