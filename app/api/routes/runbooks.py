"""Runbooks as web pages: ``GET /runbooks`` (every runbook) and ``GET /runbooks/{name}``.

A runbook is a Markdown file (``docs/runbooks/<name>.md``; in a wheel ``app/runbooks``, see
:mod:`app.runtime.resources`) with the symptom, the evidence, the remedies and how to verify the
fix; every alert and finding links one. It is rendered to HTML with markdown-it-py (raw
HTML in the Markdown is escaped, not passed through) inside the status page's layout, CSS
and Content-Security-Policy. Only the names of :data:`app.alerts.config.ALERT_RUNBOOKS`
are served, never an arbitrary path. ``HEAD`` answers like ``GET`` without a body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from fastapi import APIRouter, HTTPException, status
from fastapi.responses import HTMLResponse
from markdown_it import MarkdownIt

from app.alerts.config import ALERT_RUNBOOKS
from app.api.routes.status import SECURITY_HEADERS, templates
from app.runtime.resources import runbooks_dir

router = APIRouter(include_in_schema=False)

NAMES = sorted(set(ALERT_RUNBOOKS.values()))
TITLE_PREFIX = "# Runbook: "
SYMPTOM = re.compile(r"^\*\*Symptom\.\*\*\s+(.+?\.)(\s|$)", re.MULTILINE | re.DOTALL)
# CommonMark with tables; html=False escapes any raw HTML in a runbook.
MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


@dataclass(frozen=True, slots=True)
class Runbook:
    name: str
    title: str    # the first heading without "Runbook: ", e.g. "slo_ttft (LLMLatencyTTFTHigh)"
    summary: str  # the symptom's first sentence, for the index
    html: str     # the rendered body


@cache
def load(name: str) -> Runbook:
    """Runbook ``name`` read and rendered once per process (the files ship with the code)."""
    text = (runbooks_dir() / f"{name}.md").read_text(encoding="utf-8")
    first = text.split("\n", 1)[0]
    title = first.removeprefix(TITLE_PREFIX) if first.startswith(TITLE_PREFIX) else name
    symptom = SYMPTOM.search(text)
    summary = " ".join(symptom.group(1).split()) if symptom else ""
    return Runbook(name, title, summary, MARKDOWN.render(text))


def page(**context) -> HTMLResponse:
    return HTMLResponse(templates.get_template("runbook.html").render(**context), headers=SECURITY_HEADERS)


@router.api_route("/runbooks", methods=["GET", "HEAD"], response_class=HTMLResponse)
def runbook_index() -> HTMLResponse:
    """Every runbook: name, title, link."""
    return page(runbook=None, runbooks=[load(name) for name in NAMES])


@router.api_route("/runbooks/{name}", methods=["GET", "HEAD"], response_class=HTMLResponse)
def runbook(name: str) -> HTMLResponse:
    """One runbook as an HTML page; 404 naming the runbooks there are for any other name."""
    if name not in NAMES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no runbook {name!r}; runbooks: {', '.join(NAMES)}")
    return page(runbook=load(name), runbooks=None)
