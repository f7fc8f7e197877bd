"""The error-budget bars of the status page in a real headless browser (Debian's chromium,
driven by Playwright, as in ``test_status_browser.py``).

An emulated healthy vLLM is scraped over HTTP under two TTFT SLOs: ``tight`` (99.9 % within
0.1 s, which its tail misses, so the budget is overspent) and ``loose`` (99 % within 2.5 s,
nothing spent). After an alerting round the browser must show one bar per SLO in the
file's order, each as long as its budget left and coloured by its level, with the numbers
``GET /api/v1/slos`` gives, in the light and the dark colour scheme, without any CSP
violation (the bars are SVG: the page allows no inline style).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.api.routes.status import fmt_percent, fmt_slo_percent
from app.emulator.server import EmulatorFleet, TargetSpec
from app.main import create_app
from app.settings import Settings
from tests.status.test_status_browser import ARTIFACTS, STRIPES, LiveServer, browser  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

CONFIG = """\
diagnosis:
  interval: 600s
slos:
  - {name: tight, signal: ttft, threshold: 0.1s, objective: 99.9%, period: 28d}
  - {name: loose, signal: ttft, threshold: 2.5s, objective: 99%, period: 28d}
"""


def slow_ttfts(page: str) -> float:
    """Requests of the page with TTFT over 0.1 s: the +Inf bucket minus the one at 0.1."""
    buckets = {line.split('le="')[1].split('"')[0]: float(line.split()[-1]) for line in page.splitlines()
               if line.startswith("vllm:time_to_first_token_seconds_bucket")}
    return buckets["+Inf"] - buckets["0.1"]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveServer, httpx.Client]]:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'budgets.db'}", data_dir=tmp_path, config_file=config,
                        default_scrape_interval="1h", default_scrape_timeout="2s",
                        alert_interval="1h")  # no scheduled alerting round: the test runs it
    app = create_app(settings)
    with EmulatorFleet([TargetSpec("chat", "healthy", time_scale=5, warmup_s=120)]) as fleet, \
            LiveServer(app) as server, httpx.Client(base_url=server.url) as http:
        monitor = app.state.monitor
        assert http.post("/api/v1/targets", json={"name": "chat", "url": fleet.urls["chat"] + "/metrics"}
                         ).status_code == 201
        # scrape until the engine's own page shows a request over 0.1 s since the first scrape (the
        # healthy tail misses it in bursts, a few percent of requests): then one more scrape holds it
        page = fleet.urls["chat"] + "/metrics"
        server.call(monitor.scraping.scrape_now, "chat")
        first = slow_ttfts(http.get(page).text)
        for _ in range(60):
            time.sleep(0.6)
            server.call(monitor.scraping.scrape_now, "chat")
            if slow_ttfts(http.get(page).text) > first:
                break
        else:
            pytest.fail("the emulated engine served no request with TTFT over 0.1 s in 60 scrapes")
        time.sleep(0.6)
        server.call(monitor.scraping.scrape_now, "chat")
        server.call(monitor.scraping.flush)
        yield server, http


def test_budget_bars_in_headless_chromium(live, browser) -> None:  # noqa: F811 (the imported fixture)
    server, http = live
    monitor = server.app.state.monitor
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="light")
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    try:
        page.goto(server.url + "/")  # before the first alerting round: bars without numbers
        assert page.locator(".budget [data-budget-text]").all_inner_texts() == ["not evaluated yet"] * 2
        assert page.locator(".budget rect.fill").evaluate_all("rs => rs.map(r => r.getAttribute('width'))") == \
            ["0.00", "0.00"]

        monitor.evaluate_alerts()
        api = {s["name"]: s for s in http.get("/api/v1/slos").json()}
        tight, loose = api["tight"], api["loose"]
        assert tight["budgetRemaining"] < 0 < tight["currentBurnRate"] - 1  # the tail misses 0.1 s
        assert loose["budgetRemaining"] == 1.0 and loose["periodWindow"]["total"] > 0

        page.goto(server.url + "/")
        items = page.locator("ul.budget-list > li")
        assert items.evaluate_all("ls => ls.map(l => [l.dataset.slo, l.dataset.level])") == [
            ["tight", "critical"], ["loose", "healthy"]]
        for name, level in (("tight", "critical"), ("loose", "healthy")):
            item = page.locator(f'li[data-slo="{name}"]')
            budget = api[name]["budgetRemaining"]
            assert float(item.get_attribute("data-budget")) == pytest.approx(budget, abs=1e-9)
            assert item.locator("[data-budget-text]").inner_text() == \
                f"{fmt_percent(budget)} of budget left" + (" (overspent)" if budget < 0 else "")
            assert item.locator("[data-sli]").inner_text() == fmt_slo_percent(api[name]["sli"])
            # the bar is as long as the budget left (none when overspent) and coloured by the level
            fill, track = item.locator("rect.fill").bounding_box(), item.locator("rect.track").bounding_box()
            assert track["width"] > 300
            assert fill["width"] == pytest.approx(track["width"] * min(1.0, max(0.0, budget)), abs=1.0)
            colour = item.locator("rect.fill").evaluate("r => getComputedStyle(r).fill")
            assert colour == STRIPES["light"][level]
            firing = [f"{a['kind']}: over {a['longWindow']} and {a['shortWindow']} above {a['factor']:g}x"
                      for t in api[name]["targets"] for a in t["alerts"] if a["firing"]]
            assert sorted(item.locator("[data-firing]").all_inner_texts()) == sorted(firing)
        assert page.locator('li[data-slo="tight"] [data-exhaustion]').inner_text() == "exhausted"
        assert page.locator('li[data-slo="loose"] [data-burn]').inner_text() == "0.00x"
        assert page.locator('li[data-slo="loose"] [data-exhaustion]').inner_text() == "not burning"
        label = page.locator('li[data-slo="loose"] svg.budget-bar').get_attribute("aria-label")
        assert label == "loose: 100.0 % of the error budget left"
        page.screenshot(path=str(ARTIFACTS / "status-budgets.png"), full_page=True)

        page.emulate_media(color_scheme="dark")
        assert page.locator('li[data-slo="loose"] rect.fill').evaluate("r => getComputedStyle(r).fill") == \
            STRIPES["dark"]["healthy"]
        page.screenshot(path=str(ARTIFACTS / "status-budgets-dark.png"), full_page=True)
        assert problems == []  # no CSP violation
    finally:
        context.close()
