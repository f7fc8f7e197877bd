"""``/docs`` renders with no network but loopback: Swagger UI's assets come from this
service (the swagger-ui-bundle-v2 package), not from a CDN.

Debian's headless Chromium (driven by Playwright, as in tests/status/) loads the page with
every request to anything but 127.0.0.1 aborted, and must show every operation of the
OpenAPI document, with no CSP violation, script error or failed request.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from app.api.docs import ASSETS
from app.main import create_app
from app.settings import Settings
from tests.status.test_status_browser import LiveServer, browser  # noqa: F401  (browser: the fixture)

pytestmark = pytest.mark.slow


def test_docs_render_every_operation_from_local_assets_only(tmp_path: Path, browser) -> None:  # noqa: F811
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'docs.db'}", data_dir=tmp_path))
    with LiveServer(app) as server:
        spec = httpx.get(server.url + "/openapi.json").json()
        operations = {(method.upper(), path) for path, item in spec["paths"].items() for method in item}
        summaries = {op["summary"] for item in spec["paths"].values() for op in item.values()}
        assert len(operations) >= 30 and ("GET", "/api/v1/targets/{name}/latency") in operations

        page = browser.new_page()
        requests, blocked, problems = [], [], []

        def route(route) -> None:
            url = route.request.url
            if urlsplit(url).hostname == "127.0.0.1":
                requests.append(url.removeprefix(server.url))
                route.continue_()
            else:
                blocked.append(url)
                route.abort()

        page.route("**/*", route)
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
        response = page.goto(server.url + "/docs")
        assert response is not None and response.status == 200
        page.locator(".opblock").first.wait_for(timeout=30_000)

        shown = {(op.locator(".opblock-summary-method").inner_text(),
                  op.locator(".opblock-summary-path").get_attribute("data-path"))
                 for op in page.locator(".opblock").all()}
        assert shown == operations
        described = {text.strip() for text in page.locator(".opblock-summary-description").all_inner_texts()}
        assert described == summaries
        assert {"List Targets", "Target Latency", "List Diagnoses"} <= described
        assert page.locator(".info .title").inner_text().startswith("LLM Latency Monitor")
        assert blocked == [] and problems == []  # nothing from elsewhere, no CSP violation, no error
        assert {f"{ASSETS}/swagger-ui-bundle.js", f"{ASSETS}/swagger-ui.css", "/openapi.json"} <= set(requests)
        page.close()
