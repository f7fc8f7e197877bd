"""What ``llm-latency check-config`` learns about a target only by asking it: one scrape.

Each target (the file's and the ones its file-SD files list now) is fetched once and processed
exactly as the service's scrape would (:class:`app.scrape.jobs.TargetScraper`), so the answer is
the scrape's own classified error, never the target's text. Two outcomes are reported:

* an **error** where the URL can never be scraped whatever the engine does next: it answers
  trtllm-serve's JSON iteration statistics (its ``/metrics``) rather than a Prometheus page, and
  the message says which path serves the page (``wrong_endpoint``);
* a **warning** where the target cannot be scraped now (refused, timed out, an error status, not an
  engine's page): the file is valid, and the check may run where the engines are not reachable or
  before they start, as an unreachable source's server is a warning.

Bounded: at most :data:`CONCURRENCY` fetches at a time, each within the target's scrape timeout or
:data:`CHECK_TIMEOUT`, whichever is shorter, each page within the fetcher's size cap.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.scrape.client import PageFetcher
from app.scrape.jobs import ScrapeSpec, TargetScraper
from app.store.record import ScrapeRecord

CHECK_TIMEOUT = 5.0  # seconds per target: check-config is interactive
CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class TargetToCheck:
    """One target as check-config names it: ``field`` (``targets[0].url``, ``file_sd_configs[0]
    target 10.0.0.5:8000``) and, for a target of the file, ``loc`` (its field path, for the line)."""

    field: str
    url: str
    loc: tuple[str | int, ...] | None = None
    engine: str = "auto"
    timeout: float = CHECK_TIMEOUT


@dataclass(frozen=True, slots=True)
class TargetProblem:
    target: TargetToCheck
    message: str
    error: bool  # False: a warning


def problem_of(target: TargetToCheck, record: ScrapeRecord) -> TargetProblem | None:
    """What one scrape of ``target`` tells check-config (None: it serves an engine's page)."""
    if record.error_class == "wrong_endpoint":
        return TargetProblem(target, record.error or "wrong endpoint", True)
    if not record.up or record.error_class == "no_engine_metrics":
        return TargetProblem(target, f"not scrapable now: {record.error_class}: {record.error}", False)
    return None


async def _scrape_once(targets: list[TargetToCheck], max_page_bytes: int) -> list[ScrapeRecord]:
    async with PageFetcher(max_concurrency=CONCURRENCY, max_bytes=max_page_bytes) as fetcher:
        scrapers = [TargetScraper(ScrapeSpec(index, t.field, t.url, t.engine, timeout=min(t.timeout, CHECK_TIMEOUT)),
                                  fetcher, lambda record: None)
                    for index, t in enumerate(targets)]
        return list(await asyncio.gather(*(scraper.run() for scraper in scrapers)))


def check_targets(targets: list[TargetToCheck], max_page_bytes: int) -> list[TargetProblem]:
    """Every problem one scrape of each target shows, in the order of ``targets``."""
    if not targets:
        return []
    records = asyncio.run(_scrape_once(targets, max_page_bytes))
    return [problem for target, record in zip(targets, records) if (problem := problem_of(target, record))]
