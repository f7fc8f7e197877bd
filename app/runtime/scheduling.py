"""The one APScheduler of the service, and how a periodic round is added to it.

The :class:`~app.lifespan.Monitor` creates the scheduler (:func:`make_scheduler`), starts
and stops it, and hands it to whoever schedules: the scrape service (one job per target),
the periodic rounds (prune, summaries, diagnosis, alerts) and the canaries. One scheduler
means one place that knows every job, so the status page can ask when the next diagnosis
round starts (:func:`next_run_at` of :data:`DIAGNOSIS_JOB`).

The rounds are plain synchronous functions (they talk to the database): :func:`in_thread`
runs one in a worker thread so the event loop keeps scraping, and logs a failure instead
of letting it end the job.

A round is never skipped silently: :func:`add_round` reports every run's duration against
its interval (``observe``: the self-metrics' round histogram and overrun counter), and
:func:`watch_skips` reports each run APScheduler did not start (``missed``: due while the
loop was blocked past the grace time; ``overlap``: due while the previous run of the same
round was still going).

Within a round each target is judged in its own error boundary (:func:`target_boundary`):
one target whose evaluation fails is logged and counted, and the round goes on with the others.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from app.runtime.changes import changes

log = logging.getLogger(__name__)

#: A round's report after each run: (job id, seconds it took, its interval in seconds).
RoundObserver = Callable[[str, float, float], None]

PRUNE_JOB = "prune"
DOWNSAMPLE_JOB = "downsample"
SUMMARIES_JOB = "summaries"
DIAGNOSIS_JOB = "diagnosis"  # the scheduler job of the diagnosis rounds (status page countdown)
ALERTS_JOB = "alerts"
CHANGES_JOB = "changes"  # the change events round (app.attribution.rounds)
#: How far into its interval each round that reads every target's window first runs
#: (:func:`add_round`'s ``phase``), so they do not start together: at the defaults (15 s,
#: 30 s, 15 s, 30 s) the summaries at 0 s, the diagnosis at 5 s and the alerts at 7.5 s of each
#: 15 s, the change events at 25 s of each 30 s.
PHASES = {SUMMARIES_JOB: 0.0, DIAGNOSIS_JOB: 1 / 6, ALERTS_JOB: 1 / 2, CHANGES_JOB: 5 / 6}


#: Targets whose part of a round failed, by round (``llm_latency_round_target_errors_total``).
target_errors: Counter[str] = Counter()
_errors_lock = threading.Lock()


@dataclass(slots=True)
class TargetOutcome:
    failed: bool = False


@contextmanager
def target_boundary(round_name: str, target: str) -> Iterator[TargetOutcome]:
    """Run one target's part of a round: an exception is logged with the target's name and
    counted (:data:`target_errors`), the outcome says ``failed``, and the round goes on with the
    next target. The caller keeps what the failing one had (its last verdict, its alerts' states)."""
    outcome = TargetOutcome()
    try:
        yield outcome
    except Exception:
        outcome.failed = True
        with _errors_lock:
            target_errors[round_name] += 1
        log.exception("%s round: target %s could not be evaluated; the other targets were", round_name, target)


def make_scheduler() -> AsyncIOScheduler:
    """The service's scheduler (UTC, so job times do not depend on the host's zone)."""
    return AsyncIOScheduler(timezone=dt.UTC)


def in_thread(func: Callable[[], object], name: str | None = None) -> Callable[[], Awaitable[None]]:
    """``func`` as a coroutine job that runs it in a worker thread and logs (not raises) a
    failure, naming the job ``name`` (default: the function's name). A job may keep its results
    in memory, so its end counts as a change (:mod:`app.runtime.changes`: no answer read before it is
    reused after it)."""
    job_name = name or str(getattr(func, "__name__", "job"))

    async def run() -> None:
        try:
            await asyncio.to_thread(func)
        except Exception:
            log.exception("periodic job %s failed", job_name)
        finally:
            changes.bump()
    run.__name__ = job_name
    return run


def add_round(scheduler: AsyncIOScheduler, job_id: str, func: Callable[[], object], seconds: float,
              observe: RoundObserver | None = None, phase: float = 0.0) -> None:
    """Run ``func`` every ``seconds`` in a worker thread; rounds never overlap and a missed
    round is coalesced rather than replayed (and counted: :func:`watch_skips`). ``observe``
    is told each run's duration (a failed run's too). The first run comes one interval after
    now plus ``phase`` of an interval, so that rounds of the same interval do not all start at
    once and compete for the one interpreter while the requests wait."""
    job = func
    if observe is not None:
        def job() -> None:
            started = time.monotonic()
            try:
                func()
            finally:
                observe(job_id, time.monotonic() - started, seconds)
    first = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds * (1.0 + phase))
    scheduler.add_job(in_thread(job, job_id), "interval", seconds=seconds, id=job_id, max_instances=1, coalesce=True,
                      replace_existing=True, next_run_time=first)


def watch_skips(scheduler: AsyncIOScheduler, on_skip: Callable[[str, str], None]) -> None:
    """Call ``on_skip(job id, reason)`` for every run the scheduler did not start: ``missed``
    (past its misfire grace time) or ``overlap`` (the previous run still going)."""
    def listener(event: JobEvent) -> None:
        on_skip(event.job_id, "missed" if event.code == EVENT_JOB_MISSED else "overlap")
    scheduler.add_listener(listener, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)


def next_run_at(scheduler: AsyncIOScheduler, job_id: str) -> float | None:
    """When the job runs next (unix seconds); None when it is not scheduled (yet)."""
    job = scheduler.get_job(job_id)
    if job is None or getattr(job, "next_run_time", None) is None:
        return None
    return job.next_run_time.timestamp()
