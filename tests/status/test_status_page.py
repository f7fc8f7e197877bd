"""The status page (``GET /``, ``GET /targets/{name}``) over the in-process service.

Targets are real HTTP endpoints serving emulated engines (one step of simulated time per
scrape), scraped by the service itself; the page's numbers are compared with the JSON API
for the same window and ``end``.
"""

from __future__ import annotations

import html
import re
import socket
import time
from pathlib import Path

import pytest
from sqlalchemy import event

from app.api.routes.status import evidence_text, fmt_seconds
from app.store import repository
from tests.api.conftest import make_service
from tests.status.helpers import cards, history_records, stat, stepping_page, text_of
from tests.support.pages import StaticPageServer

SCRIPT_LABEL = "<script>alert('owned')</script>"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fleet(service):
    """busy (queueing, vLLM), calm (healthy, vLLM), tgi (healthy TGI: TTFT derived),
    dead (nothing listens), garbled (unparsable page); two diagnosis rounds."""
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued, StaticPageServer(stepping_page("healthy")) as fine, \
            StaticPageServer(stepping_page("healthy", engine="tgi")) as tgi, StaticPageServer("garbage{\n") as bad:
        assert c.post("/api/v1/targets", json={"name": "busy", "url": queued.url,
                                               "labels": {"team": SCRIPT_LABEL}}).status_code == 201
        assert c.post("/api/v1/targets", json={"name": "calm", "url": fine.url}).status_code == 201
        assert c.post("/api/v1/targets", json={"name": "tgi", "url": tgi.url}).status_code == 201
        assert c.post("/api/v1/targets", json={"name": "garbled", "url": bad.url}).status_code == 201
        assert c.post("/api/v1/targets", json={
            "name": "dead", "url": f"http://127.0.0.1:{closed_port()}/metrics"}).status_code == 201
        last = None
        for _ in range(24):
            service.scrape("busy")
            service.scrape("tgi")
            last = service.scrape("calm")
        service.scrape("dead")
        service.scrape("garbled")
    service.monitor.evaluate_diagnoses(now=last.ts)
    service.monitor.evaluate_diagnoses(now=last.ts + 1)
    return last.ts + 2  # the `end` every page and API call of the test uses


def test_index_shows_health_numbers_and_diagnosis(service, fleet) -> None:
    c, end = service.client, fleet
    response = c.get("/", params={"end": end})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none': no script
    page = response.text
    assert f'data-end="{end!r}"' in page and 'data-window-seconds="300.0"' in page
    found = cards(page)
    assert list(found) == ["busy", "calm", "dead", "garbled", "tgi"]  # every target, by name

    overview = text_of(re.search(r'<p class="overview".*?</p>', page, re.S).group(0))
    assert overview == "5 targets 3 up 2 down 1 with a latency regime window 5m"

    # up / down, with the error class of the latest scrape
    assert 'data-health="up"' in found["busy"] and 'data-health="up"' in found["calm"]
    dead = text_of(found["dead"])
    assert "down: connect" in dead and "connect: cannot connect" in dead
    garbled = text_of(found["garbled"])
    assert "down: parse_error" in garbled and "line 1: unterminated label set: garbage{" in garbled
    assert "vllm" in text_of(found["busy"]) and "tgi" in text_of(found["tgi"])

    # the headline numbers are exactly the API's (same window, same end)
    for name in ("busy", "calm", "tgi"):
        api = c.get(f"/api/v1/targets/{name}/latency", params={"window": "5m", "end": end}).json()
        for signal in ("ttft", "itl"):
            for q in ("p50", "p99"):
                raw, text = stat(found[name], f"{signal}-{q}")
                assert float(raw) == api[signal][q], (name, signal, q)
                assert text == fmt_seconds(api[signal][q])
        # the newest sparkline point is the same window: the chart's text alternative says so
        assert f"TTFT over the last 1 min: p50 min" in found[name]
        assert f"latest {fmt_seconds(api['ttft']['p50'])}; p99 min" in found[name]
    busy_api = c.get("/api/v1/targets/busy/latency", params={"end": end}).json()
    assert busy_api["ttft"]["p50"] > 10 and stat(found["busy"], "ttft-p50")[1].endswith(" s")  # ~15 s queueing
    calm_itl = float(stat(found["calm"], "itl-p50")[0])
    assert 0.005 < calm_itl < 0.05 and stat(found["calm"], "itl-p50")[1].endswith(" ms")
    assert "(queue + prefill)" in found["tgi"] and "(queue + prefill)" not in found["calm"]
    assert "TTFT over the last 60 min: no data yet." in text_of(found["dead"])
    assert stat(found["dead"], "ttft-p99") == ("", "–")

    # the active diagnosis: verdict, primary finding, evidence with numbers and thresholds, remedies, runbook
    diagnosis = next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "busy")
    finding = diagnosis["findings"][0]
    assert diagnosis["active"] == ["queueing"] and finding["state"] == "active"
    busy = found["busy"]
    assert 'data-verdict="queueing"' in busy and 'data-regime="queueing"' in busy
    busy_text = text_of(busy)
    assert "Diagnosis: queueing" in busy_text and "critical · active since" in busy_text
    assert finding["summary"] in busy_text and finding["summary"].startswith("Requests wait ")
    assert "threshold met: queue share of TTFT = 1.00 (>= 0.50)" in busy_text
    for item in finding["evidence"]:
        assert html.escape(evidence_text(item), quote=False) in busy, item["name"]
    assert len(finding["remedies"]) == 4
    for remedy in finding["remedies"]:
        assert remedy in busy_text
    assert "raise --max-num-seqs" in busy_text
    assert 'href="/runbooks/queueing"' in busy
    assert 'data-verdict="healthy"' in found["calm"] and "No latency regime detected." in text_of(found["calm"])
    assert 'data-verdict="insufficient_data"' in found["dead"]
    assert "0 successful scrape(s) in the window, need 2" in text_of(found["dead"])

    # every link the page offers resolves
    links = set(re.findall(r'href="([^"#]+)"', page))
    assert {"/docs", "/runbooks/queueing", "/targets/busy", "/api/v1/targets", "/ui/status.css"} <= links
    # the footer lists every runbook, alerts' included (regimes, SLO signals, target down)
    assert {"/runbooks/slo_ttft", "/runbooks/slo_itl", "/runbooks/target_down", "/runbooks/outside_engine"} <= links
    for link in sorted(links):
        if link.startswith("data:"):
            continue
        answer = c.get(html.unescape(link))
        assert answer.status_code == 200, link
    assert "<strong>Verify the fix.</strong>" in c.get("/runbooks/queueing").text


def test_labels_and_errors_are_escaped(service, fleet) -> None:
    c, end = service.client, fleet
    for path in ("/", "/targets/busy"):
        page = c.get(path, params={"end": end}).text
        assert "<script" not in page.lower()  # no script at all, and the label cannot inject one
        assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page
        assert SCRIPT_LABEL in text_of(page)  # shown to the reader as typed
    garbled = c.get("/targets/garbled", params={"end": end}).text
    assert "garbage{" in garbled and "<garbage" not in garbled
    missing = c.get("/targets/%3Cimg%20src%3Dx%3E")  # /targets/<img src=x>
    assert missing.status_code == 404 and "<img" not in missing.text
    assert "no target named <code>&lt;img src=x&gt;</code>" in missing.text


def test_target_page_details(service, fleet) -> None:
    c, end = service.client, fleet
    response = c.get("/targets/busy", params={"end": end})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    api = c.get("/api/v1/targets/busy/latency", params={"window": "5m", "end": end}).json()

    # every histogram signal: p50/p90/p99/mean/count exactly as the API
    rows = dict(re.findall(r'<tr data-signal="(\w+)">(.*?)</tr>', page, re.S))
    expected = [s for s in ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time",
                            "inference_time", "prompt_tokens", "generation_tokens", "iteration_tokens") if s in api]
    assert list(rows) == expected and len(expected) == 11
    for signal, row in rows.items():
        values = dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', row))
        assert set(values) == {"p50", "p90", "p99", "mean", "count"}
        for key, raw in values.items():
            assert float(raw) == api[signal][key], (signal, key)
    assert f">{fmt_seconds(api['ttft']['p90'])}<" in rows["ttft"]
    assert f">{api['prompt_tokens']['p50']:.3g}<" in rows["prompt_tokens"]  # tokens, not seconds

    # TTFT split: queue dominates under queueing
    queue, prefill = api["queue_time"]["mean"], api["prefill_time"]["mean"]
    share = queue / (queue + prefill)
    assert share > 0.99
    assert f"Mean TTFT split: queue {fmt_seconds(queue)} ({share * 100:.1f} %), prefill {fmt_seconds(prefill)}" in page
    assert re.search(rf'<tr data-part="queue"><th scope="row">queue</th><td class="num" '
                     rf'data-value="{re.escape(repr(api["queue_time"]["p50"]))}">', page)

    # gauges and rates
    waiting = re.search(r'<tr data-gauge="waiting">(.*?)</tr>', page, re.S).group(1)
    assert re.findall(r'data-value="([^"]*)"', waiting) == [
        repr(api["gauges"]["waiting"][k]) for k in ("last", "mean", "max")]
    assert api["gauges"]["waiting"]["max"] >= 30
    assert f'data-rate="requests_per_second" data-value="{api["rates"]["requests_per_second"]!r}"' in page

    # the diagnosis with all its findings, the finding history, the scrape log
    text = text_of(page)
    assert "Active diagnosis Diagnosis: queueing" in text
    assert "threshold met: mean waiting requests" in text
    history = re.findall(r'<tr data-regime="(\w+)" data-state="(\w+)">', page)
    assert history == [("queueing", "active")]
    assert 'data-scrapes="24" data-failed="0"' in page and "24 scrapes, 0 failed (100.0 % ok)" in text
    assert len(re.findall(r'<tr class="up">', page)) == 20  # the 20 newest scrapes
    assert "cache_config" in text and "num_gpu_blocks" in text  # engine configuration from info metrics
    assert page.count('role="img"') == 5  # TTFT, ITL, queue time, e2e charts + the split bar
    assert 'aria-label="Time to first token over the last 1 min' not in page  # short title on charts
    assert "TTFT over the last 1 min: p50 min" in page

    dead = c.get("/targets/dead", params={"end": end}).text
    assert "1 scrapes, 1 failed (0.0 % ok)" in text_of(dead) and "No histogram data" in dead

    missing = c.get("/targets/nope")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "Target not found" in missing.text and 'href="/targets/busy"' in missing.text


def test_empty_service_explains_how_to_add_targets(service) -> None:
    response = service.client.get("/")
    assert response.status_code == 200
    text = text_of(response.text)
    assert "No targets yet" in text and "/api/v1/targets" in text
    assert "0 targets 0 up 0 down 0 with a latency regime" in text
    assert '<meta http-equiv="refresh" content="30">' in response.text  # live page reloads itself
    css = service.client.get("/ui/status.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "prefers-color-scheme: dark" in css.text


@pytest.fixture
def quiet_service(migrated_url: str, tmp_path: Path):
    """A service whose periodic jobs (summaries, diagnosis, alerts, outbox) do not run during the test,
    so every statement on the engine belongs to the request under test."""
    config = tmp_path / "config.yaml"
    config.write_text("diagnosis:\n  interval: 1h\n")
    yield from make_service(migrated_url, tmp_path, config_file=config, summary_interval="1h",
                            alert_interval="1h", delivery_interval="1h")


def test_index_runs_a_fixed_number_of_queries_whatever_the_fleet_size(quiet_service) -> None:
    """An hour of history (61 scrapes a minute apart) on 3 and then 40 targets: the index
    runs the same handful of statements, charts the whole hour, and stays fast."""
    c, monitor = quiet_service.client, quiet_service.monitor
    end = float(int(time.time()))  # whole seconds: chart points fall exactly on the minute-spaced samples
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        statements.append(statement)

    def render() -> tuple[str, int, float]:
        statements.clear()
        event.listen(monitor.engine, "before_cursor_execute", count)
        started = time.perf_counter()
        try:
            page = c.get("/", params={"end": end}).text
        finally:
            event.remove(monitor.engine, "before_cursor_execute", count)
        return page, len(statements), time.perf_counter() - started

    def add(names: list[str]) -> None:
        for name in names:
            assert c.post("/api/v1/targets", json={"name": name, "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        with monitor.sessions() as session:
            target_ids = [t.id for t in repository.list_targets(session) if t.name in names]
        assert len(target_ids) == len(names)
        monitor.scraping.writer.write(history_records(target_ids, end, snapshots=61))

    add([f"small-{i:02d}" for i in range(3)])
    small_page, small_queries, _ = render()
    add([f"large-{i:02d}" for i in range(37)])
    large_page, large_queries, seconds = render()
    assert len(cards(small_page)) == 3 and len(cards(large_page)) == 40
    assert small_queries == large_queries <= 8, (small_queries, large_queries)
    assert seconds < 5.0, f"index with 40 targets x 1 h took {seconds:.2f}s"
    card = cards(large_page)["large-36"]
    assert "TTFT over the last 60 min: p50 min" in card and "−60 min" in card
    polyline = re.search(r'<polyline class="line p99" points="([^"]+)"', card).group(1)
    assert len(polyline.split()) == 30  # 31 points; the first one has a single sample in its lookback
    api = c.get("/api/v1/targets/large-36/latency", params={"end": end}).json()
    assert float(stat(card, "itl-p99")[0]) == api["itl"]["p99"]
