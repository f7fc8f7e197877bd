"""The status page in a real headless browser (Debian's chromium, driven by Playwright).

The service runs as a real HTTP server (uvicorn in a thread, free 127.0.0.1 port) and
scrapes emulated engines over HTTP (``EmulatorFleet``: healthy, queueing, prefill_compute
vLLMs at time scale 5) plus a target where nothing listens, one scraped only once and one
added after the diagnosis rounds. The browser must see the fleet table most severe first,
each row coloured by its level, the same numbers as the JSON API, one window, a countdown
to the new target's first evaluation, and the diagnosis one click away, in the light and
the dark colour scheme. Screenshots are written to ``test-artifacts/`` (ignored by git)
for a human to look at.

Locally a missing chromium or playwright skips the test; under ``CI=true`` it fails.
Never run ``playwright install``: the browser is Debian's ``/usr/bin/chromium``.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.api.routes.status import fmt_quantile, fmt_seconds
from app.emulator.server import EmulatorFleet, TargetSpec
from app.main import create_app
from app.runtime import scheduling
from app.settings import Settings
from tests.support.components import missing_component, require_binary

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LIGHT_BG, DARK_BG = "rgb(244, 246, 248)", "rgb(13, 17, 23)"  # --bg of status.css


class LiveServer:
    """The app under uvicorn on a free loopback port, in a thread with its own event loop."""

    def __init__(self, app) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none", http="h11")
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="uvicorn-status-test", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def call(self, fn, *args):
        """Run coroutine function ``fn(*args)`` in the server's loop (where the monitor lives)."""
        return asyncio.run_coroutine_threadsafe(fn(*args), self.loop).result(30)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        self.loop.close()
        self.sock.close()


@pytest.fixture
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing_component("the playwright Python package is not installed (pip install -e '.[test]'); "
                          "it drives Debian's chromium, never run `playwright install`")
    executable = require_binary(CHROMIUM, "the status page's headless-browser test (apt-get install chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DIAGNOSIS_INTERVAL = 600.0  # no scheduled round runs during the test: f-new stays "not evaluated yet"
FIRST_DIAGNOSIS = DIAGNOSIS_INTERVAL * (1 + scheduling.PHASES[scheduling.DIAGNOSIS_JOB])  # 700 s after the start
ORDER = ["b-queueing", "d-down", "c-prefill", "e-idle", "f-new", "a-healthy"]
LEVEL_OF = {"b-queueing": "critical", "d-down": "critical", "c-prefill": "warning", "e-idle": "unknown",
            "f-new": "unknown", "a-healthy": "healthy"}
# a row's stripe: --bad, --warn, --muted, --ok of status.css
STRIPES = {"light": {"critical": "rgb(164, 14, 38)", "warning": "rgb(125, 78, 0)", "unknown": "rgb(87, 96, 106)",
                     "healthy": "rgb(17, 99, 41)"},
           "dark": {"critical": "rgb(255, 139, 132)", "warning": "rgb(227, 179, 65)",
                    "unknown": "rgb(158, 167, 179)", "healthy": "rgb(86, 211, 100)"}}
MAX_INDEX_HEIGHT = 1000  # px at 1280x800 with these 6 targets: 643 measured (2,574 with one card per target)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, httpx.Client]]:
    """The service over real HTTP, fed by emulated engines scraped ten times 0.6 s apart
    (3 simulated seconds each), then diagnosed twice so ``queueing`` is active; one target
    is scraped once (too little data), one is added afterwards (not evaluated yet)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"diagnosis:\n  interval: {DIAGNOSIS_INTERVAL:g}s\n")
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'status.db'}", data_dir=tmp_path, config_file=config,
                        default_scrape_interval="1h", default_scrape_timeout="2s")
    app = create_app(settings)
    specs = [TargetSpec("healthy", "healthy", time_scale=5, warmup_s=120),
             TargetSpec("queueing", "queueing", time_scale=5, warmup_s=120),
             TargetSpec("prefill", "prefill_compute", time_scale=5, warmup_s=120),
             TargetSpec("idle", "healthy", time_scale=5, warmup_s=120)]
    with EmulatorFleet(specs) as fleet, LiveServer(app) as server, httpx.Client(base_url=server.url) as http:
        monitor = app.state.monitor
        targets = [{"name": "a-healthy", "url": fleet.urls["healthy"] + "/metrics",
                    "labels": {"team": "search", "gpu": "A100-80G"}},
                   {"name": "b-queueing", "url": fleet.urls["queueing"] + "/metrics",
                    "labels": {"team": "assistant", "tier": "<b>gold</b>"}},
                   {"name": "c-prefill", "url": fleet.urls["prefill"] + "/metrics"},
                   {"name": "d-down", "url": f"http://127.0.0.1:{closed_port()}/metrics"},
                   {"name": "e-idle", "url": fleet.urls["idle"] + "/metrics"}]
        for body in targets:
            assert http.post("/api/v1/targets", json=body).status_code == 201
        server.call(monitor.scraping.scrape_now, "e-idle")
        for _ in range(10):
            for body in targets[:4]:
                server.call(monitor.scraping.scrape_now, body["name"])
            time.sleep(0.6)
        server.call(monitor.scraping.flush)
        now = time.time()
        monitor.evaluate_diagnoses(now=now)
        monitor.evaluate_diagnoses(now=now + 0.5)
        assert http.post("/api/v1/targets",
                         json={"name": "f-new", "url": "http://127.0.0.1:9/metrics"}).status_code == 201
        yield server, http


def stripes(page) -> dict[str, str]:
    """Each fleet row's stripe colour as the browser computed it, in page order."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('table.fleet tbody tr')]
        .map(tr => [tr.dataset.target, getComputedStyle(tr.querySelector('th')).borderLeftColor]))""")


def test_status_page_in_headless_chromium(live, browser) -> None:
    server, http = live
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    monitor = server.app.state.monitor
    try:
        before = monitor.next_diagnosis_at() - time.time()
        response = page.goto(server.url + "/")
        after = monitor.next_diagnosis_at() - time.time()
        assert response is not None and response.status == 200
        assert page.title() == "Targets · LLM Latency Monitor"

        # triage: most severe first, by name within a level; colour and words per row
        names = page.locator("table.fleet tbody th").all_inner_texts()
        assert names == ORDER
        assert stripes(page) == {name: STRIPES["light"][LEVEL_OF[name]] for name in ORDER}
        assert list(stripes(page)) == ORDER
        severity = page.locator("table.fleet tbody [data-severity]").all_inner_texts()
        assert severity == ["critical", "critical", "warning", "no verdict", "no verdict", "ok"]
        verdicts = page.locator("table.fleet tbody td.verdicts .verdict").all_inner_texts()
        assert verdicts == ["queueing", "insufficient data", "prefill compute", "insufficient data",
                            "not evaluated yet", "healthy"]
        assert page.locator(".overview").inner_text().split() == \
            "6 targets 2 critical 1 warning 2 no verdict 1 ok 1 down".split()
        down = page.locator('tr[data-target="d-down"] [data-health="down"]')
        assert "down: connect" in down.inner_text() and "cannot connect" in down.get_attribute("title")

        # one window on the screen, stated once
        body_text = page.locator("body").inner_text()
        assert re.findall(r"\blast \d+(?:\.\d+)? (?:s|min|h)\b", body_text) == ["last 1 min"]
        assert page.locator(".window-statement").inner_text().startswith(
            "Verdicts and percentiles over the last 1 min, as of ")

        # the countdown: minutes to the diagnosis job's next run (10 min after the service started
        # and its phase, a sixth of that, more)
        countdown = page.locator('tr[data-target="f-new"] .countdown').inner_text()
        minutes = int(re.fullmatch(r"first evaluation in ~(\d+) min", countdown).group(1))
        assert round(after / 60) <= minutes <= round(before / 60) and 1 <= minutes <= round(FIRST_DIAGNOSIS / 60)

        # compact: the whole fleet fits in one screen
        height = page.evaluate("document.body.getBoundingClientRect().height")
        assert height < MAX_INDEX_HEIGHT, height

        # the numbers the browser shows are the API's, for the same window and end
        end = float(page.locator("main").get_attribute("data-end"))
        for name in ("a-healthy", "b-queueing", "c-prefill"):
            api = http.get(f"/api/v1/targets/{name}/latency", params={"window": "1m", "end": end}).json()
            row = page.locator(f'tr[data-target="{name}"]')
            assert row.locator('[data-health="up"]').inner_text().strip().endswith("up")
            for signal in ("ttft", "itl"):
                for q in ("p50", "p99"):
                    shown = row.locator(f'[data-stat="{signal}-{q}"]').inner_text()
                    # the value, or its bucket where it sits on the bucket's edge (app/core/human.py)
                    assert shown == fmt_quantile(api[signal], q, signal), (name, signal, q)
        queueing_api = http.get("/api/v1/targets/b-queueing/latency", params={"window": "1m", "end": end}).json()
        healthy_api = http.get("/api/v1/targets/a-healthy/latency", params={"window": "1m", "end": end}).json()
        assert queueing_api["ttft"]["p50"] > 1.0 > 0.5 > healthy_api["ttft"]["p50"]  # seconds in the queue

        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert light == LIGHT_BG  # the stylesheet loaded (CSP allows it)
        page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)

        page.emulate_media(color_scheme="dark")
        dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert dark == DARK_BG and dark != light
        text_colour = page.evaluate("getComputedStyle(document.body).color")
        assert text_colour == "rgb(230, 237, 243)"
        assert stripes(page) == {name: STRIPES["dark"][LEVEL_OF[name]] for name in ORDER}
        page.screenshot(path=str(ARTIFACTS / "status-page-dark.png"), full_page=True)
        page.emulate_media(color_scheme="light")

        assert problems == [] and failed == []  # no CSP violation, script error or failed request

        # one click to the details: the diagnosis with evidence, thresholds, remedies, runbook, charts
        page.locator('tr[data-target="b-queueing"] th a').click()
        page.wait_for_url(server.url + "/targets/b-queueing")
        diagnosis = page.locator('section[data-verdict="queueing"]')
        assert diagnosis.locator(".verdict").inner_text() == "queueing"
        finding = diagnosis.locator('.finding[data-regime="queueing"]')
        assert "critical · active since" in finding.locator(".finding-head").inner_text()
        evidence = finding.locator(".evidence li").all_inner_texts()
        share = next(line for line in evidence if "queue share of TTFT" in line)
        # the threshold, then (when the two means cover different requests and their raw ratio
        # passed 1) the note saying it was bounded: "...; raw ratio 1.001 bounded to 100%: ..."
        assert share.split("; raw ratio ")[0].endswith("(>= 0.50)"), share
        assert float(share.split("= ")[1].split()[0]) >= 0.9, share
        waiting = next(line for line in evidence if "mean waiting requests" in line)
        assert waiting.startswith("✔") and waiting.endswith("(>= 1)")
        remedies = finding.locator(".remedies li").all_inner_texts()
        assert len(remedies) == 4 and "raise --max-num-seqs" in remedies[0]
        assert page.locator(".labels").inner_text().count("<b>gold</b>") == 1
        assert page.locator(".window-statement").inner_text().startswith(
            "Verdicts and percentiles over the last 1 min, as of ")
        rows = page.locator("table.signals-table tbody tr")
        assert rows.count() >= 8
        ttft_cell = page.locator('tr[data-signal="ttft"] td[data-key="p50"]')
        assert ttft_cell.inner_text() == fmt_quantile(queueing_api["ttft"], "p50")
        assert page.locator('tr[data-regime="queueing"][data-state="active"]').count() == 1
        assert "Mean TTFT split: queue" in page.locator(".split svg").get_attribute("aria-label")
        chart = page.locator('figure[data-signal="ttft"] svg[role="img"]')
        assert chart.get_attribute("aria-label").startswith("TTFT over the last 1 min: p50 min ")
        assert f"latest {fmt_seconds(queueing_api['ttft']['p99'])}." in chart.get_attribute("aria-label")
        assert chart.bounding_box()["width"] > 200  # the chart is drawn at a readable size
        page.screenshot(path=str(ARTIFACTS / "status-target.png"), full_page=True)
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=str(ARTIFACTS / "status-target-dark.png"), full_page=True)
        page.emulate_media(color_scheme="light")

        with page.expect_navigation():
            finding.locator("a.runbook").click()
        assert page.url == server.url + "/runbooks/queueing"
        assert "Verify the fix." in page.locator("body").inner_text()
        # (Chromium's own /favicon.ico request may 404)
        assert failed == [] and [p for p in problems if "status of 404" not in p] == []
        assert http.get("/docs").status_code == 200  # (rendered in tests/api/test_docs_offline.py)

        page.goto(server.url + "/targets/f-new")
        assert re.fullmatch(r"Not evaluated yet: first evaluation in ~\d+ min\.",
                            page.locator('[data-verdict="none"]').inner_text())

        missing = page.goto(server.url + "/targets/nope")
        assert missing is not None and missing.status == 404
        assert page.locator("h1").inner_text() == "Target not found"
        assert page.locator("main a[href='/']").inner_text() == "Back to all targets"
        assert failed[-1] == f"404 {server.url}/targets/nope"
        assert [p for p in problems if "status of 404" not in p] == []
    finally:
        context.close()
    assert (ARTIFACTS / "status-page.png").stat().st_size > 20_000
    assert (ARTIFACTS / "status-page-dark.png").stat().st_size > 20_000
