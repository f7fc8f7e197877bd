"""The one APScheduler of the service, and how a periodic round is added to it.

The :class:`~app.lifespan.Monitor` creates the scheduler (:func:`make_scheduler`), starts
and stops it, and hands it to whoever schedules: the scrape service (one job per target),
the periodic rounds (prune, summaries, diagnosis, alerts) and the canaries. One scheduler
means one place that knows every job, so the status page can ask when the next diagnosis
round starts (:func:`next_run_at` of :data:`DIAGNOSIS_JOB`).

The rounds are plain synchronous functions (they talk to the database): :func:`in_thread`
runs one in a worker thread so the event loop keeps scraping, and logs a failure instead
of letting it end the job.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

log = logging.getLogger(__name__)

PRUNE_JOB = "prune"
DOWNSAMPLE_JOB = "downsample"
SUMMARIES_JOB = "summaries"
DIAGNOSIS_JOB = "diagnosis"  # the scheduler job of the diagnosis rounds (status page countdown)
ALERTS_JOB = "alerts"


def make_scheduler() -> AsyncIOScheduler:
    """The service's scheduler (UTC, so job times do not depend on the host's zone)."""
    return AsyncIOScheduler(timezone=dt.UTC)


def in_thread(func: Callable[[], object], name: str | None = None) -> Callable[[], Awaitable[None]]:
    """``func`` as a coroutine job that runs it in a worker thread and logs (not raises) a
    failure, naming the job ``name`` (default: the function's name)."""
    job_name = name or str(getattr(func, "__name__", "job"))

    async def run() -> None:
        try:
            await asyncio.to_thread(func)
        except Exception:
            log.exception("periodic job %s failed", job_name)
    run.__name__ = job_name
    return run


def add_round(scheduler: AsyncIOScheduler, job_id: str, func: Callable[[], object], seconds: float) -> None:
    """Run ``func`` every ``seconds`` in a worker thread; rounds never overlap and a missed
    round is coalesced rather than replayed."""
    scheduler.add_job(in_thread(func, job_id), "interval", seconds=seconds, id=job_id, max_instances=1, coalesce=True,
                      replace_existing=True)


def next_run_at(scheduler: AsyncIOScheduler, job_id: str) -> float | None:
    """When the job runs next (unix seconds); None when it is not scheduled (yet)."""
    job = scheduler.get_job(job_id)
    if job is None or getattr(job, "next_run_time", None) is None:
        return None
    return job.next_run_time.timestamp()
