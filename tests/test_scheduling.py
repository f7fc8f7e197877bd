"""The service's one scheduler: rounds run in a worker thread, a failing round is logged
and stays scheduled, and the next run of a job is known (the status page's countdown)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from app.runtime import scheduling
from app.runtime.changes import changes


def test_a_round_runs_off_the_event_loop_and_a_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    threads: list[str] = []

    def ok() -> None:
        threads.append(threading.current_thread().name)

    def broken() -> None:
        raise RuntimeError("boom")

    async def main() -> str:
        await scheduling.in_thread(ok)()
        with caplog.at_level(logging.ERROR, logger="app.runtime.scheduling"):
            await scheduling.in_thread(broken, "diagnosis")()  # no exception escapes
        return threading.current_thread().name

    loop_thread = asyncio.run(main())
    assert len(threads) == 1 and threads[0] != loop_thread
    assert [r.getMessage() for r in caplog.records] == ["periodic job diagnosis failed"]
    assert scheduling.in_thread(ok).__name__ == "ok"


def test_next_run_at_is_the_jobs_next_run_and_none_without_the_job() -> None:
    async def main() -> tuple[float | None, float | None, int]:
        scheduler = scheduling.make_scheduler()
        scheduler.start()
        try:
            scheduling.add_round(scheduler, scheduling.DIAGNOSIS_JOB, lambda: None, 30.0)
            scheduling.add_round(scheduler, scheduling.DIAGNOSIS_JOB, lambda: None, 60.0)  # replaces, not duplicates
            job = scheduler.get_job(scheduling.DIAGNOSIS_JOB)
            assert job.max_instances == 1 and job.coalesce is True and job.trigger.interval.total_seconds() == 60.0
            return (scheduling.next_run_at(scheduler, scheduling.DIAGNOSIS_JOB),
                    scheduling.next_run_at(scheduler, "missing"), len(scheduler.get_jobs()))
        finally:
            scheduler.shutdown(wait=False)

    before = time.time()
    next_run, missing, jobs = asyncio.run(main())
    assert missing is None and jobs == 1
    assert next_run is not None and before + 55 <= next_run <= time.time() + 60


def test_a_round_reports_its_duration_and_an_overrun_and_a_skipped_run_is_counted() -> None:
    """A round still running when its next run is due is reported twice: the run that overran
    (duration > interval) and the run the scheduler did not start (``overlap``)."""
    from app.telemetry import Telemetry

    telemetry = Telemetry()
    release = threading.Event()
    observed: list[tuple[str, float, float]] = []

    def observe(name: str, seconds: float, interval: float) -> None:
        observed.append((name, seconds, interval))
        telemetry.observe_round(name, seconds, interval)

    async def main() -> None:
        scheduler = scheduling.make_scheduler()
        scheduling.watch_skips(scheduler, telemetry.round_skipped)
        scheduler.start()
        try:
            scheduling.add_round(scheduler, "slow", lambda: release.wait(30), 0.2, observe)
            deadline = time.monotonic() + 30
            while telemetry.registry.get_sample_value("llm_latency_round_skips_total",
                                                      {"round": "slow", "reason": "overlap"}) is None:
                assert time.monotonic() < deadline, "no skipped run reported"
                await asyncio.sleep(0.05)
            release.set()
            while not observed:
                assert time.monotonic() < deadline, "the round's duration was not reported"
                await asyncio.sleep(0.05)
        finally:
            release.set()
            scheduler.shutdown(wait=False)

    asyncio.run(main())
    name, seconds, interval = observed[0]
    assert name == "slow" and interval == 0.2 and seconds > interval
    sample = telemetry.registry.get_sample_value
    assert sample("llm_latency_round_overruns_total", {"round": "slow"}) >= 1.0
    assert sample("llm_latency_round_duration_seconds_count", {"round": "slow"}) >= 1.0
    assert sample("llm_latency_round_skips_total", {"round": "slow", "reason": "overlap"}) >= 1.0


def test_a_round_within_its_interval_is_no_overrun() -> None:
    from app.telemetry import Telemetry

    telemetry = Telemetry()
    telemetry.observe_round("diagnosis", 2.0, 30.0)
    telemetry.observe_round("diagnosis", 31.0, 30.0)
    sample = telemetry.registry.get_sample_value
    assert sample("llm_latency_round_overruns_total", {"round": "diagnosis"}) == 1.0
    assert sample("llm_latency_round_duration_seconds_count", {"round": "diagnosis"}) == 2.0
    assert sample("llm_latency_round_duration_seconds_bucket", {"round": "diagnosis", "le": "5.0"}) == 1.0


def test_a_rounds_phase_puts_its_first_run_later_by_that_share_of_its_interval() -> None:
    async def main() -> dict[str, float | None]:
        scheduler = scheduling.make_scheduler()
        scheduler.start()
        try:
            scheduling.add_round(scheduler, "in_step", lambda: None, 15.0)
            scheduling.add_round(scheduler, "half_late", lambda: None, 15.0, phase=0.5)
            return {job: scheduling.next_run_at(scheduler, job) for job in ("in_step", "half_late")}
        finally:
            scheduler.shutdown(wait=False)

    before = time.time()
    runs = asyncio.run(main())
    after = time.time()
    assert before + 15.0 <= runs["in_step"] <= after + 15.0
    assert before + 22.5 <= runs["half_late"] <= after + 22.5


def test_the_end_of_every_job_counts_as_a_change() -> None:
    """A job may keep its results in memory: a read answered before it is not reused after it
    (app.runtime.changes, app.api.coalesce), whether the job succeeded or failed."""
    def broken() -> None:
        raise RuntimeError("boom")

    before = changes.current
    asyncio.run(scheduling.in_thread(lambda: None)())
    middle = changes.current
    asyncio.run(scheduling.in_thread(broken)())
    assert before < middle < changes.current
