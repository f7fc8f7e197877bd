"""The status page in a real headless browser (Debian's chromium, driven by Playwright).

The service runs as a real HTTP server (uvicorn in a thread, free 127.0.0.1 port) and
scrapes emulated engines over HTTP (``EmulatorFleet``: a healthy and a queueing vLLM at
time scale 5) plus one target where nothing listens. The browser must see the targets,
the same numbers as the JSON API, and the active ``queueing`` diagnosis with its
evidence, in the light and the dark colour scheme. Screenshots are written to
``test-artifacts/`` (ignored by git) for a human to look at.

Locally a missing chromium or playwright skips the test; under ``CI=true`` it fails.
Never run ``playwright install``: the browser is Debian's ``/usr/bin/chromium``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.api.routes.status import fmt_seconds
from app.emulator.server import EmulatorFleet, TargetSpec
from app.main import create_app
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

    def __init__(self, app) -> None:  # noqa: ANN001
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

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def call(self, fn, *args):  # noqa: ANN001, ANN201
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


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, httpx.Client]]:
    """The service over real HTTP, fed by emulated engines scraped ten times 0.6 s apart
    (3 simulated seconds each), then diagnosed twice so ``queueing`` is active."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'status.db'}", data_dir=tmp_path,
                        default_scrape_interval="1h", default_scrape_timeout="2s")
    app = create_app(settings)
    specs = [TargetSpec("api-healthy", "healthy", time_scale=5, warmup_s=120),
             TargetSpec("api-queueing", "queueing", time_scale=5, warmup_s=120)]
    with EmulatorFleet(specs) as fleet, LiveServer(app) as server, httpx.Client(base_url=server.url) as http:
        monitor = app.state.monitor
        targets = [{"name": "chat-healthy", "url": fleet.urls["api-healthy"] + "/metrics",
                    "labels": {"team": "search", "gpu": "A100-80G"}},
                   {"name": "chat-queueing", "url": fleet.urls["api-queueing"] + "/metrics",
                    "labels": {"team": "assistant", "tier": "<b>gold</b>"}},
                   {"name": "offline-node", "url": f"http://127.0.0.1:{closed_port()}/metrics"}]
        for body in targets:
            assert http.post("/api/v1/targets", json=body).status_code == 201
        for _ in range(10):
            for body in targets:
                server.call(monitor.scraping.scrape_now, body["name"])
            time.sleep(0.6)
        server.call(monitor.scraping.flush)
        now = time.time()
        monitor.evaluate_diagnoses(now=now)
        monitor.evaluate_diagnoses(now=now + 0.5)
        yield server, http


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
    try:
        response = page.goto(server.url + "/")
        assert response is not None and response.status == 200
        assert page.title() == "Targets · LLM Latency Monitor"
        names = page.locator("article.target h2").all_inner_texts()
        assert names == ["chat-healthy", "chat-queueing", "offline-node"]
        assert page.locator(".overview").inner_text().split() == \
            "3 targets 2 up 1 down 1 with a latency regime window 5m".split()

        # the numbers the browser shows are the API's, for the same window end
        end = float(page.locator("main").get_attribute("data-end"))
        for name in ("chat-healthy", "chat-queueing"):
            api = http.get(f"/api/v1/targets/{name}/latency", params={"window": "5m", "end": end}).json()
            card = page.locator(f'article[data-target="{name}"]')
            assert card.locator('[data-health="up"]').inner_text().strip().endswith("up")
            for signal in ("ttft", "itl"):
                for q in ("p50", "p99"):
                    shown = card.locator(f'[data-stat="{signal}-{q}"] dd').inner_text()
                    assert shown == fmt_seconds(api[signal][q]), (name, signal, q)
            chart = card.locator('figure[data-signal="ttft"] svg[role="img"]')
            label = chart.get_attribute("aria-label")
            assert label.startswith("TTFT over the last 1 min: p50 min ")
            assert f"latest {fmt_seconds(api['ttft']['p99'])}." in label
            assert chart.bounding_box()["width"] > 200  # the sparkline is drawn at a readable size
        queueing_api = http.get("/api/v1/targets/chat-queueing/latency", params={"end": end}).json()
        healthy_api = http.get("/api/v1/targets/chat-healthy/latency", params={"end": end}).json()
        assert queueing_api["ttft"]["p50"] > 1.0 > 0.5 > healthy_api["ttft"]["p50"]  # seconds in the queue

        offline = page.locator('article[data-target="offline-node"]')
        assert "down: connect" in offline.locator('[data-health="down"]').inner_text()
        assert "cannot connect" in offline.locator(".error").inner_text()

        # the active diagnosis, with evidence lines, thresholds, remedies and the runbook link
        diagnosis = page.locator('article[data-target="chat-queueing"] section[data-verdict="queueing"]')
        assert diagnosis.locator(".verdict").inner_text() == "queueing"
        finding = diagnosis.locator('.finding[data-regime="queueing"]')
        assert "critical · active since" in finding.locator(".finding-head").inner_text()
        evidence = finding.locator(".evidence li").all_inner_texts()
        share = next(line for line in evidence if "queue share of TTFT" in line)
        assert share.endswith("(>= 0.50)") and float(share.split("= ")[1].split()[0]) >= 0.9
        waiting = next(line for line in evidence if "mean waiting requests" in line)
        assert waiting.startswith("✔") and waiting.endswith("(>= 1)")
        remedies = finding.locator(".remedies li").all_inner_texts()
        assert len(remedies) == 4 and "raise --max-num-seqs" in remedies[0]
        assert page.locator('article[data-target="chat-healthy"] .verdict').inner_text() == "healthy"
        assert page.locator('article[data-target="chat-queueing"] .labels').inner_text().count("<b>gold</b>") == 1

        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert light == LIGHT_BG  # the stylesheet loaded (CSP allows it)
        page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)

        page.emulate_media(color_scheme="dark")
        dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert dark == DARK_BG and dark != light
        text_colour = page.evaluate("getComputedStyle(document.body).color")
        assert text_colour == "rgb(230, 237, 243)"
        page.screenshot(path=str(ARTIFACTS / "status-page-dark.png"), full_page=True)
        page.emulate_media(color_scheme="light")

        assert problems == [] and failed == []  # no CSP violation, script error or failed request

        # links: runbook, target page, API docs
        with page.expect_navigation():
            finding.locator("a.runbook").click()
        assert page.url == server.url + "/runbooks/queueing"
        assert "Verify the fix." in page.locator("body").inner_text()
        page.go_back()
        page.locator('article[data-target="chat-queueing"] h2 a').click()
        page.wait_for_url(server.url + "/targets/chat-queueing")
        rows = page.locator("table.signals-table tbody tr")
        assert rows.count() >= 8
        ttft_row = page.locator('tr[data-signal="ttft"] td[data-key="p50"]')
        assert ttft_row.inner_text() == fmt_seconds(queueing_api["ttft"]["p50"])
        assert page.locator('tr[data-regime="queueing"][data-state="active"]').count() == 1
        assert "Mean TTFT split: queue" in page.locator(".split svg").get_attribute("aria-label")
        page.screenshot(path=str(ARTIFACTS / "status-target.png"), full_page=True)
        # (Chromium's own /favicon.ico request may 404)
        assert failed == [] and [p for p in problems if "status of 404" not in p] == []
        assert http.get("/docs").status_code == 200  # (rendered in tests/api/test_docs_offline.py)

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
