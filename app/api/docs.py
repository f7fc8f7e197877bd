"""``/docs`` (Swagger UI) served from this process, so it works without internet access.

FastAPI's own ``/docs`` loads Swagger UI from a CDN and is a blank page on a network
that cannot reach it. Here the JavaScript and CSS come from the swagger-ui-bundle-v2
package (Swagger UI 5, which renders the OpenAPI 3.1 that FastAPI generates), mounted at
:data:`ASSETS`. ReDoc (``/redoc``) is not served: no package ships it as well kept.

The page runs under a Content-Security-Policy that allows scripts only from this origin
plus FastAPI's inline start-up script, pinned by its hash; the online spec validator
badge (an image from another host) is switched off.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, swagger_ui_default_parameters
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS = "/docs"
ASSETS = "/docs/assets"
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def csp(html: str) -> str:
    """The page's Content-Security-Policy: this origin only, plus its inline scripts by hash."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
                      for script in INLINE_SCRIPT.findall(html))
    return (f"default-src 'none'; script-src 'self' {hashes}; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def install(app: FastAPI) -> None:
    """Add ``/docs`` and its assets to ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get(DOCS, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API docs",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={**swagger_ui_default_parameters, "validatorUrl": None})
        html = bytes(page.body).decode()
        return HTMLResponse(html, headers={"Content-Security-Policy": csp(html), "X-Content-Type-Options": "nosniff",
                                           "Referrer-Policy": "no-referrer"})
