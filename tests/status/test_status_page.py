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
from dataclasses import replace
from pathlib import Path

import pytest

from app.api.routes.status import DERIVED_TTFT_NOTE, evidence_text, fmt_quantile, fmt_seconds
from app.diagnosis.findings import CONFIDENCE_MEANING, Evidence
from app.diagnosis.rules.base import margin
from app.latency import request_set_notes
from app.sources.tgi import TTFT_DERIVATION
from app.targets import repository as target_repository
from tests.api.conftest import counted_statements, make_quiet_service
from tests.status.conftest import FIRST_DIAGNOSIS
from tests.status.helpers import history_records, levels, rows, stat, stepping_page, text_of
from tests.support.pages import StaticPageServer

SCRIPT_LABEL = "<script>alert('owned')</script>"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fleet(service):
    """busy (queueing: critical, vLLM), docs (prefill_compute: warning), calm (healthy, vLLM),
    tgi (healthy TGI: TTFT derived), idle (scraped once: insufficient data), dead (nothing
    listens), garbled (unparsable page); two diagnosis rounds; then fresh (added after them:
    not evaluated yet)."""
    c = service.client
    with StaticPageServer(stepping_page("queueing")) as queued, StaticPageServer(stepping_page("healthy")) as fine, \
            StaticPageServer(stepping_page("healthy", engine="tgi")) as tgi, StaticPageServer("garbage{\n") as bad, \
            StaticPageServer(stepping_page("prefill_compute")) as docs, \
            StaticPageServer(stepping_page("healthy")) as idle:
        assert c.post("/api/v1/targets", json={"name": "busy", "url": queued.url,
                                               "labels": {"team": SCRIPT_LABEL}}).status_code == 201
        for name, url in (("calm", fine.url), ("tgi", tgi.url), ("garbled", bad.url), ("docs", docs.url),
                          ("idle", idle.url), ("dead", f"http://127.0.0.1:{closed_port()}/metrics")):
            assert c.post("/api/v1/targets", json={"name": name, "url": url}).status_code == 201
        last = None
        for _ in range(24):
            service.scrape("busy")
            service.scrape("tgi")
            service.scrape("docs")
            last = service.scrape("calm")
        service.scrape("dead")
        service.scrape("garbled")
        service.scrape("idle")
    service.monitor.evaluate_diagnoses(now=last.ts)
    service.monitor.evaluate_diagnoses(now=last.ts + 1)
    assert c.post("/api/v1/targets", json={"name": "fresh", "url": "http://127.0.0.1:9/metrics"}).status_code == 201
    return last.ts + 2  # the `end` every page and API call of the test uses


# the fleet table's order: down or critical, warning, no verdict yet, not judged, healthy; by name within a level
TRIAGE_ORDER = {"busy": "critical", "dead": "critical", "garbled": "critical", "docs": "warning",
                "fresh": "unknown", "idle": "unknown", "tgi": "not_judged", "calm": "healthy"}
WINDOW_PHRASE = re.compile(r"\blast \d+(?:\.\d+)? (?:s|min|h)\b")


def test_index_is_a_fleet_table_most_severe_first(service, fleet) -> None:
    c, end = service.client, fleet
    response = c.get("/", params={"end": end})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none': no script
    page = response.text
    assert f'data-end="{end!r}"' in page and 'data-window-seconds="60.0"' in page  # the diagnosis window
    found = rows(page)
    assert levels(page) == TRIAGE_ORDER  # exact order, and each row's colour class

    overview = text_of(re.search(r'<p class="overview".*?</p>', page, re.S).group(0))
    assert overview == "8 targets 3 critical 1 warning 2 no verdict 1 not judged 1 ok 2 down"
    severities = {name: text_of(re.search(r'data-severity="\w+">[^<]*', row).group(0).split(">")[1])
                  for name, row in found.items()}
    assert severities == {"busy": "critical", "dead": "critical", "garbled": "critical", "docs": "warning",
                          "fresh": "no verdict", "idle": "no verdict", "calm": "ok", "tgi": "not judged"}

    # verdict words next to the colour; down targets say why
    verdicts = {name: re.findall(r'data-verdict="(\w+)"', row) for name, row in found.items()}
    assert verdicts == {"busy": ["queueing"], "dead": ["insufficient_data"], "garbled": ["insufficient_data"],
                        "docs": ["prefill_compute"], "fresh": ["none"], "idle": ["insufficient_data"],
                        "calm": ["healthy"], "tgi": ["not_judged"]}
    # never healthy by omission: TGI without a hardware profile exports nothing weights_offloaded reads
    assert "1 not judged" in text_of(found["tgi"]) and "not judged" not in text_of(found["calm"])
    tgi_page = c.get("/targets/tgi", params={"end": end}).text
    assert 'data-regime="weights_offloaded"' in tgi_page and "Not judged" in tgi_page
    assert ("No latency regime found among those judged, but 1 could not be judged on this engine's metrics: not "
            "healthy.") in text_of(tgi_page)
    assert "down: connect" in text_of(found["dead"]) and "down: parse_error" in text_of(found["garbled"])
    assert "queueing" in text_of(found["busy"]) and "prefill compute" in text_of(found["docs"])
    assert "garbage" not in found["garbled"]  # the page's text is never quoted

    # one window on the screen, stated once; the footer names no other
    text = text_of(page)
    assert WINDOW_PHRASE.findall(text) == ["last 1 min"]
    assert "Verdicts and percentiles over the last 1 min, as of " in text
    assert " 5m" not in text and "over 60 s" not in text and "60 min" not in text

    # the countdown to the new target's first evaluation: the scheduler's next diagnosis round
    countdown = re.search(r"first evaluation in ~(\d+) s", text_of(found["fresh"]))
    assert countdown, text_of(found["fresh"])
    left = service.monitor.next_diagnosis_at() - time.time()
    assert 0 < left < int(countdown.group(1)) <= FIRST_DIAGNOSIS < 100

    # the numbers are exactly the API's over the same window and end
    for name in ("busy", "calm", "tgi", "docs"):
        api = c.get(f"/api/v1/targets/{name}/latency", params={"window": "1m", "end": end}).json()
        for signal in ("ttft", "itl"):
            for q in ("p50", "p99"):
                raw, shown = stat(found[name], f"{signal}-{q}")
                assert (float(raw) if raw else None) == api[signal][q], (name, signal, q)
                assert shown == fmt_quantile(api[signal], q, signal)
    # TGI's derived TTFT: no quantile, a bound (lower <= upper) from the same buckets as its /latency answer
    tgi_api = c.get("/api/v1/targets/tgi/latency", params={"window": "1m", "end": end}).json()
    lower, upper = tgi_api["ttft"]["bounds"]["p99"]
    assert tgi_api["ttft"]["p99"] is None and 0 <= lower < upper
    assert stat(found["tgi"], "ttft-p99")[1] == f"{fmt_seconds(lower)} – {fmt_seconds(upper)}"
    busy_api = c.get("/api/v1/targets/busy/latency", params={"window": "1m", "end": end}).json()
    assert busy_api["ttft"]["p50"] > 10 and stat(found["busy"], "ttft-p50")[1].endswith(" s")  # ~15 s queueing
    calm_itl = float(stat(found["calm"], "itl-p50")[0])
    assert 0.005 < calm_itl < 0.05 and stat(found["calm"], "itl-p50")[1].endswith(" ms")
    derived = re.search(r'<abbr class="derived" title="([^"]*)">q\+p</abbr>', found["tgi"])
    assert derived and html.unescape(derived.group(1)) == TTFT_DERIVATION and "q+p" not in found["calm"]
    assert stat(found["dead"], "ttft-p99") == ("", "–") and stat(found["fresh"], "itl-p50") == ("", "–")

    # details are one click away, not on the index
    assert "Evidence" not in text and "Remedies" not in text and "<svg" not in page
    assert [f"/targets/{name}" for name in TRIAGE_ORDER] == \
        re.findall(r'<th scope="row"><a href="(/targets/[^"]+)">', page)

    # a window of the reader's choosing changes the percentiles, and the page says the verdicts keep theirs
    wide = c.get("/", params={"end": end, "window": "5m"}).text
    assert WINDOW_PHRASE.findall(text_of(wide)) == ["last 5 min"]
    assert "Percentiles over the last 5 min (verdicts use the diagnosis window)" in text_of(wide)
    api5 = c.get("/api/v1/targets/busy/latency", params={"window": "5m", "end": end}).json()
    assert float(stat(rows(wide)["busy"], "ttft-p99")[0]) == api5["ttft"]["p99"]

    # every link the page offers resolves
    links = set(re.findall(r'href="([^"#]+)"', page))
    assert {"/docs", "/targets/busy", "/api/v1/targets", "/ui/status.css"} <= links
    # the footer lists every runbook, alerts' included (regimes, SLO signals, target down)
    assert {"/runbooks/queueing", "/runbooks/slo_ttft", "/runbooks/slo_itl", "/runbooks/target_down",
            "/runbooks/outside_engine"} <= links
    for link in sorted(links):
        if link.startswith("data:"):
            continue
        answer = c.get(html.unescape(link))
        assert answer.status_code == 200, link


def test_target_page_shows_the_diagnosis_in_full(service, fleet) -> None:
    c, end = service.client, fleet
    page = c.get("/targets/busy", params={"end": end}).text
    text = text_of(page)
    diagnosis = next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "busy")
    finding = diagnosis["findings"][0]
    assert diagnosis["active"] == ["queueing"] and finding["state"] == "active"
    assert 'data-verdict="queueing"' in page and 'data-regime="queueing"' in page
    assert "Diagnosis: queueing" in text and "critical · active since" in text
    assert finding["summary"] in text and finding["summary"].startswith("Requests wait ")
    assert "threshold met: queue share of TTFT = 1.00 (>= 0.50)" in text
    for item in finding["evidence"]:
        assert html.escape(evidence_text(item), quote=False) in page, item["name"]
    assert len(finding["remedies"]) == 4
    for remedy in finding["remedies"]:
        assert remedy in text
    assert "raise --max-num-seqs" in text and 'href="/runbooks/queueing"' in page
    assert "<strong>Verify the fix.</strong>" in c.get("/runbooks/queueing").text
    # one window, stated once: the diagnosis was judged over it, so it says no other
    assert WINDOW_PHRASE.findall(text.split("History")[0]) == ["last 1 min"]
    assert "over its own window" not in text and "Last hour" not in text
    wide = text_of(c.get("/targets/busy", params={"end": end, "window": "5m"}).text)
    assert "Percentiles over the last 5 min (verdicts use the diagnosis window)" in wide
    assert "evaluated " in wide and " ago over its own window of 60 s" in wide

    calm = text_of(c.get("/targets/calm", params={"end": end}).text)
    assert "Diagnosis: healthy" in calm
    assert "No latency regime detected: every regime judged, latency in its expected range." in calm
    dead = text_of(c.get("/targets/dead", params={"end": end}).text)
    assert "Diagnosis: insufficient data" in dead and "0 successful scrape(s) in the window, need 2" in dead
    assert "connect: cannot connect" in dead
    garbled = text_of(c.get("/targets/garbled", params={"end": end}).text)
    assert "line 1: unterminated label set" in garbled and "garbage" not in garbled
    fresh = text_of(c.get("/targets/fresh", params={"end": end}).text)
    assert re.search(r"Not evaluated yet: first evaluation in ~\d+ s\.", fresh), fresh


def test_labels_and_errors_are_escaped(service, fleet) -> None:
    c, end = service.client, fleet
    assert "<script" not in c.get("/", params={"end": end}).text.lower()  # no script at all
    page = c.get("/targets/busy", params={"end": end}).text
    assert "<script" not in page.lower()  # the label cannot inject one
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page
    assert SCRIPT_LABEL in text_of(page)  # shown to the reader as typed
    garbled = c.get("/targets/garbled", params={"end": end}).text
    assert "line 1: unterminated label set" in garbled and "garbage" not in garbled  # named, never quoted
    missing = c.get("/targets/%3Cimg%20src%3Dx%3E")  # /targets/<img src=x>
    assert missing.status_code == 404 and "<img" not in missing.text
    assert "no target named <code>&lt;img src=x&gt;</code>" in missing.text


def test_target_page_details(service, fleet) -> None:
    c, end = service.client, fleet
    response = c.get("/targets/busy", params={"end": end})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    api = c.get("/api/v1/targets/busy/latency", params={"window": "1m", "end": end}).json()

    # every histogram signal: p50/p90/p99/mean/count exactly as the API
    rows = dict(re.findall(r'<tr data-signal="(\w+)">(.*?)</tr>', page, re.S))
    expected = [s for s in ("ttft", "itl", "tpot", "e2e", "queue_time", "prefill_time", "decode_time",
                            "inference_time", "prompt_tokens", "generation_tokens", "iteration_tokens",
                            "render_time") if s in api]  # the emulated page is vLLM 0.34: render time too
    assert list(rows) == expected and len(expected) == 12
    for signal, row in rows.items():
        values = dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', row))
        assert set(values) == {"p50", "p90", "p99", "mean", "count"}
        for key, raw in values.items():
            assert float(raw) == api[signal][key], (signal, key)
    assert f">{html.escape(fmt_quantile(api['ttft'], 'p90', 'ttft'))}<" in rows["ttft"]
    assert f">{api['prompt_tokens']['p50']:.3g}<" in rows["prompt_tokens"]  # tokens, not seconds

    # TTFT split: queue dominates under queueing
    queue, prefill = api["queue_time"]["mean"], api["prefill_time"]["mean"]
    share = queue / (queue + prefill)
    assert share > 0.99
    assert f"Mean TTFT split: queue {fmt_seconds(queue)} ({share * 100:.1f} %), prefill {fmt_seconds(prefill)}" in page
    assert re.search(rf'<tr data-part="queue"><th scope="row">queue</th><td class="num" '
                     rf'data-value="{re.escape(repr(api["queue_time"]["p50"]))}" title=', page)

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
    assert "Targets 0 targets Verdicts and percentiles over the last 1 min, as of" in text
    assert '<meta http-equiv="refresh" content="30">' in response.text  # live page reloads itself
    css = service.client.get("/ui/status.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "prefers-color-scheme: dark" in css.text


@pytest.fixture
def quiet_service(migrated_url: str, tmp_path: Path):
    yield from make_quiet_service(migrated_url, tmp_path)


def test_index_runs_a_fixed_number_of_queries_whatever_the_fleet_size(quiet_service) -> None:
    """An hour of history (61 scrapes a minute apart) on 3 and then 40 targets: the index
    runs the same handful of statements (its cost is counted in statements, which a busy
    machine does not change, not in seconds); a target's page charts the whole hour."""
    c, monitor = quiet_service.client, quiet_service.monitor
    end = float(int(time.time()))  # whole seconds: chart points fall exactly on the minute-spaced samples
    def render() -> tuple[str, int]:
        with counted_statements(monitor.engine) as statements:
            page = c.get("/", params={"end": end}).text
        return page, len(statements)

    def add(names: list[str]) -> None:
        for name in names:
            assert c.post("/api/v1/targets",
                          json={"name": name, "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        with monitor.sessions() as session:
            target_ids = [t.id for t in target_repository.list_targets(session) if t.name in names]
        assert len(target_ids) == len(names)
        monitor.scraping.writer.write(history_records(target_ids, end, snapshots=61))

    add([f"small-{i:02d}" for i in range(3)])
    small_page, small_queries = render()
    add([f"large-{i:02d}" for i in range(37)])
    large_page, large_queries = render()
    assert len(rows(small_page)) == 3 and len(rows(large_page)) == 40
    assert small_queries == large_queries <= 8, (small_queries, large_queries)
    api = c.get("/api/v1/targets/large-36/latency", params={"window": "1m", "end": end}).json()
    assert float(stat(rows(large_page)["large-36"], "itl-p99")[0]) == api["itl"]["p99"]
    detail = c.get("/targets/large-36", params={"end": end}).text
    assert "TTFT over the last 60 min: p50 min" in detail and "−60 min" in detail
    polyline = re.search(r'<polyline class="line p99" points="([^"]+)"', detail).group(1)
    assert len(polyline.split()) == 30  # 31 points; the first one has a single sample in its lookback


def test_the_page_says_what_its_numbers_mean(service, fleet) -> None:
    """The confidence's definition and this finding's weakest condition in its tooltip; q+p explained under the
    fleet table; a note exactly where a part's percentile is above its whole's (queue time above TTFT)."""
    c, end = service.client, fleet
    page = c.get("/targets/busy", params={"end": end}).text
    finding = next(d for d in c.get("/api/v1/diagnoses").json() if d["target"] == "busy")["findings"][0]
    abbr = re.search(r'<abbr class="confidence" data-confidence="([^"]*)" title="([^"]*)">confidence (\d+) %</abbr>',
                     page)
    assert abbr and float(abbr.group(1)) == finding["confidence"] and int(abbr.group(3)) == round(
        finding["confidence"] * 100)
    title = html.unescape(abbr.group(2))
    assert title.startswith(CONFIDENCE_MEANING + " Weakest condition here: ")
    weakest = title.removeprefix(CONFIDENCE_MEANING + " Weakest condition here: ").rstrip(".")
    conditions = [Evidence.from_dict(e) for e in finding["evidence"] if e["op"] != "info"]
    assert weakest == replace(min(conditions, key=margin), note="").text()

    index = c.get("/", params={"end": end}).text
    legend = re.search(r'<p class="meta legend" data-legend="q\+p">(.*?)</p>', index, re.S)
    assert legend and text_of(legend.group(1)) == f"q+p: {DERIVED_TTFT_NOTE}"

    for name in ("busy", "calm", "docs"):
        api = c.get(f"/api/v1/targets/{name}/latency", params={"window": "1m", "end": end}).json()
        target_page = c.get(f"/targets/{name}", params={"end": end}).text
        shown = [html.unescape(n) for n in re.findall(r'data-note="request-sets">([^<]*)</p>', target_page)]
        assert shown == request_set_notes(api), name
        inverted = api["queue_time"]["p50"] > api["ttft"]["p50"]
        assert any(n.startswith("queue time p50 ") for n in shown) == inverted, name
    # the queueing engine: requests leave the queue ~16 s after arriving, the ones counted in TTFT earlier
    busy = c.get("/api/v1/targets/busy/latency", params={"window": "1m", "end": end}).json()
    assert busy["queue_time"]["p50"] > busy["ttft"]["p50"]
