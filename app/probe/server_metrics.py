"""The engine's own view of a probe level: how its histograms grew between a ``/metrics`` page
fetched just before the level and one fetched just after.

Why: a lone request on a busy engine waits in the same queue as everyone else's, so a slow
single-request TTFT is not by itself "slow alone" (prefill). :func:`app.probe.sweep.compare_load`
needs the engine's queue time over the same period to tell the two apart. The pages are
fetched from the engine directly with the scraper's fetcher, parser and adapters (size cap,
no redirects, every engine the monitor knows), so this works from the CLI without a monitor
database. The increases count every request the engine handled in the period, not only the
probe's: the means are what requests got from the engine while the level ran.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from app.scrape.client import PageFetcher, ScrapeError
from app.scrape.jobs import PageProcessor

#: Histograms read (TGI has no TTFT histogram; its queue time is what matters here).
SIGNALS = ("ttft", "queue_time")


@dataclass(frozen=True)
class Snapshot:
    """One page: ``signal -> (sum, count)`` summed over models and data-parallel ranks."""

    ts: float
    totals: dict[str, tuple[float, float]] = field(default_factory=dict)
    engine: str | None = None
    error: str | None = None


async def snapshot(fetcher: PageFetcher, url: str, timeout: float) -> Snapshot:
    """Fetch and read one page; a failure is a :class:`Snapshot` with ``error``, never an exception."""
    try:
        fetched = await fetcher.fetch(url, timeout)
    except ScrapeError as exc:
        return Snapshot(time.time(), error=f"{exc.error_class}: {exc}")
    processor = PageProcessor("auto")
    _, canonical, error = processor.process(fetched.body)
    if canonical is None:
        return Snapshot(time.time(), error=error)
    totals: dict[str, tuple[float, float]] = {}
    for h in canonical.histograms:
        if h.signal in SIGNALS:
            total, count = totals.get(h.signal, (0.0, 0.0))
            totals[h.signal] = (total + h.sum, count + h.count)
    return Snapshot(time.time(), totals, processor.engine)


def level_view(url: str, before: Snapshot, after: Snapshot) -> dict:
    """The engine over one level: ``requests`` (TTFT or queue observations), ``queue_time_mean``
    and ``ttft_mean`` in the engine's seconds; ``error`` says why a number is missing."""
    out: dict = {"source": url, "engine": after.engine or before.engine, "seconds": after.ts - before.ts,
                 "requests": None, "queue_time_mean": None, "ttft_mean": None, "error": before.error or after.error}
    if out["error"]:
        return out
    for signal, key in (("queue_time", "queue_time_mean"), ("ttft", "ttft_mean")):
        if signal not in before.totals or signal not in after.totals:
            continue
        d_sum = after.totals[signal][0] - before.totals[signal][0]
        d_count = after.totals[signal][1] - before.totals[signal][1]
        if d_count < 0 or d_sum < 0 or math.isnan(d_sum):
            out["error"] = f"{signal} histogram reset between the pages (engine restart)"
            return out
        if d_count > 0:
            out[key] = d_sum / d_count
            out["requests"] = max(out["requests"] or 0.0, d_count)
    if out["queue_time_mean"] is None:
        out["error"] = "the engine recorded no queue time in the period" if "queue_time" in after.totals \
            else "the page has no queue-time histogram"
    return out
