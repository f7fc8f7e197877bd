"""What one scrape attempt produced: the scraper's output and the store's input.

Its own module so the store (:class:`app.store.writer.SampleWriter`) can name the type
without importing the scraper: the scrape package imports the store, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.sources.base import Canonical


@dataclass(slots=True)
class ScrapeRecord:
    """Everything one scrape attempt produced, ready to be written."""

    target_id: int
    ts: float
    up: bool
    duration: float
    bytes: int = 0
    samples_seen: int = 0
    samples_kept: int = 0
    malformed: int = 0
    engine: str | None = None
    error_class: str | None = None
    error: str | None = None
    canonical: Canonical | None = None
    #: series (and info rows) the target may have stored; past it the writer refuses the
    #: scrape as ``too_many_series`` (:class:`app.store.writer.SampleWriter`); None: no limit
    stored_series_limit: int | None = None
