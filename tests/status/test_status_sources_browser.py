"""The status page of a Prometheus source's targets in headless Chromium: a real Prometheus 2.42
scrapes two emulated vLLM replicas of one service through file-based discovery; the service
reads them as a source (replicas and their service) and is served over real HTTP.

Before the first round the index waits for the source (no "No targets yet"). After it, the
index, the replica's page and the service's page speak of the source's rounds, never of
scrapes: the health column and badges show the last round's time, the engine is detected from
Prometheus' series, and the charts are filled from the source's Prometheus. ``/readyz`` counts
what the source found. With Prometheus stopped, no row or page shows a green "up" (services
included): every target of the source is unknown and stale. Screenshots go to
``test-artifacts/``. Locally a missing chromium or playwright skips; under ``CI=true`` it fails.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from app.api.routes.status import fmt_clock
from app.core.durations import format_utc
from app.emulator.server import EmulatorFleet, TargetSpec
from app.main import create_app
from app.settings import Settings
from tests.status.test_status_browser import ARTIFACTS, LiveServer, browser  # noqa: F401 (a fixture)
from tests.support.prometheus import FileSD, running_prometheus

pytestmark = pytest.mark.slow

WINDOW = 20
REPLICAS = ("prod.llm.a", "prod.llm.b")
SERVICE = "prod.svc.llm.chat"
SCRAPE = re.compile(r"scrap", re.I)  # scrape, scrapes, scraped, scraping


def _config(path: Path, prometheus_url: str) -> Path:
    path.write_text(f"""
targets: []
diagnosis: {{interval: 1h, window: {WINDOW}s}}
sources:
  - name: prod
    url: {prometheus_url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    service_labels: [namespace, service]
    query_timeout: 10s
""")
    return path


def _own_text(page) -> str:
    """The page's text without what the diagnosis says of the engine's data (its evidence may
    count the scrapes Prometheus made of the engine): the service's own words."""
    return page.evaluate("""() => { const main = document.querySelector('main').cloneNode(true);
        main.querySelectorAll('section.diagnoses, table.history').forEach(e => e.remove());
        return main.innerText; }""")


def _points(page) -> int:
    """Points drawn in the page's charts: every polyline vertex and isolated dot."""
    return page.evaluate("""() => [...document.querySelectorAll('figure.chart svg polyline')]
        .reduce((n, p) => n + p.getAttribute('points').trim().split(/\\s+/).length, 0)
        + document.querySelectorAll('figure.chart svg line.dot').length""")


def test_source_targets_in_headless_chromium(browser, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    ARTIFACTS.mkdir(exist_ok=True)
    specs = [TargetSpec("a", "healthy", time_scale=10.0, warmup_s=60, seed=1),
             TargetSpec("b", "queueing", time_scale=10.0, warmup_s=60, seed=2)]
    with EmulatorFleet(specs) as fleet:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"], "b": fleet.urls["b"]}, namespace="llm", service="chat")
        with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s")) as prom:
            for pod in ("a", "b"):
                prom.wait_for_samples(f'vllm:num_requests_running{{namespace="llm",pod="{pod}"}}', WINDOW + 2,
                                      timeout=60)
            settings = Settings(database_url=f"sqlite:///{tmp_path / 'status.db'}", data_dir=tmp_path,
                                config_file=_config(tmp_path / "t.yaml", prom.url), default_scrape_interval="1h")
            app = create_app(settings)
            with LiveServer(app) as server, httpx.Client(base_url=server.url) as http:
                monitor = app.state.monitor
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                page = context.new_page()
                problems: list[str] = []
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)

                # before the first round: the index waits for the source, no "No targets yet"
                page.goto(server.url + "/")
                empty = page.locator("section.empty-state").inner_text()
                assert "Waiting for the first round of source prod" in empty and prom.url in empty
                assert "No targets yet\n" not in empty and "curl" not in empty
                assert http.get("/readyz").json()["targets"] == 0

                monitor.evaluate_diagnoses(now=time.time())
                (source,) = http.get("/api/v1/sources").json()
                assert source["state"] == "ok" and (source["targets"], source["services"]) == (2, 1)
                discovered = [t["name"] for t in http.get("/api/v1/targets").json()
                              if t["source"] in ("prometheus", "service")]
                assert sorted(discovered) == sorted([*REPLICAS, SERVICE])
                assert http.get("/readyz").json()["targets"] == len(discovered) == 3

                # the index: rounds, not scrapes; every row shows the round it comes from
                page.goto(server.url + "/")
                table = page.locator("table.fleet")
                assert SCRAPE.search(table.inner_text()) is None, table.inner_text()
                assert page.locator("table.fleet thead th").nth(1).inner_text() == "Source round"
                rounds = page.locator("table.fleet tbody [data-round] time")
                assert rounds.count() == 3
                assert set(rounds.all_inner_texts()) == {fmt_clock(source["last_success"])}
                assert set(page.locator("table.fleet tbody [data-round]").all_inner_texts()) == \
                    {f"round {fmt_clock(source['last_success'])}"}
                assert {rounds.nth(i).get_attribute("datetime") for i in range(3)} == \
                    {format_utc(source["last_success"])}
                health = {name: " ".join(page.locator(f'tr[data-target="{name}"] [data-health]').inner_text().split())
                          for name in [*REPLICAS, SERVICE]}
                assert health == {"prod.llm.a": "● up", "prod.llm.b": "● up", SERVICE: "● up: 2/2 replicas"}
                assert page.locator("table.fleet .badge.warning", has_text="stale").count() == 0
                page.screenshot(path=str(ARTIFACTS / "status-page-source.png"), full_page=True)

                # the replica's and the service's pages: the round, where the engine comes from, charts
                for name in ("prod.llm.b", SERVICE):
                    page.goto(f"{server.url}/targets/{name}")
                    own = _own_text(page)
                    assert SCRAPE.search(own) is None, (name, SCRAPE.findall(own), own)
                    last_round = page.locator("dd[data-last-round]")
                    assert float(last_round.get_attribute("data-last-round")) == source["last_success"]
                    assert f"{source['queries_last_round']} queries in " in last_round.inner_text()
                    assert last_round.locator("time").get_attribute("datetime") == format_utc(source["last_success"])
                    engine = page.locator("dd[data-engine-origin]").inner_text()
                    assert engine.startswith("vllm (detected from the names of its") and "configured" not in engine
                    assert page.locator("[data-chart-note]").count() == 0
                    charts = page.locator("figure.chart")
                    assert charts.count() == 4, name  # TTFT, ITL, queue time, end to end
                    assert _points(page) > 0, name
                    page.screenshot(path=str(ARTIFACTS / f"status-page-source-{name}.png"), full_page=True)
                members = page.locator("[data-member]")
                assert [members.nth(i).get_attribute("data-member") for i in range(members.count())] == list(REPLICAS)

                # Prometheus stopped: every target of the source is unknown and stale, none "up"
                prom.stop()
                monitor.evaluate_diagnoses(now=time.time())
                (failing,) = http.get("/api/v1/sources").json()
                assert failing["state"] == "failing"
                page.goto(server.url + "/")
                assert page.locator("section.banner.source-failing").count() == 1
                for name in [*REPLICAS, SERVICE]:
                    row = page.locator(f'tr[data-target="{name}"]')
                    badge = row.locator("[data-health]")
                    assert badge.get_attribute("data-health") == "unknown", name
                    assert " ".join(badge.inner_text().split()) == "○ source failing"
                    assert row.locator(".badge.warning", has_text="stale").count() == 1, name
                    assert row.locator("[data-stale]").count() >= 1, name
                    assert row.locator("[data-round] time").get_attribute("datetime") == \
                        format_utc(failing["last_error_at"])
                    assert row.locator("[data-round]").inner_text() == \
                        f"failed round {fmt_clock(failing['last_error_at'])}"
                assert page.locator('table.fleet [data-health="up"]').count() == 0
                page.screenshot(path=str(ARTIFACTS / "status-page-source-failing.png"), full_page=True)
                for name in ("prod.llm.a", SERVICE):
                    page.goto(f"{server.url}/targets/{name}")
                    head = page.locator(".target-head")
                    assert head.locator('[data-health="up"]').count() == 0
                    assert head.locator(".badge.warning", has_text="stale").count() == 1
                    assert page.locator("dd[data-last-round]").get_attribute("data-round-ok") == "false"
                    assert "failed: unreachable: connection refused" in page.locator("dd[data-last-round]").inner_text()
                    assert page.locator("[data-chart-note]").inner_text() == \
                        "No charts while source prod is failing: they come back when it answers."
                    assert SCRAPE.search(_own_text(page)) is None, name
                assert http.get("/readyz").json()["targets"] == 3  # what its last successful round found
                assert problems == []
                context.close()
