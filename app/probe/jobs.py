"""Probes running in the background of the service (started by ``POST /api/v1/probes``).

The service has one :class:`ProbeJobs`, built and shut down by the Monitor
(:mod:`app.lifespan`); routes reach it through ``app.api.deps.ProbeJobsDep``.

Each probe is an asyncio task on the service's event loop; the database work around it runs
in worker threads. The outcome is stored on the run row: ``done`` with the summary (failed
requests are part of a result, not a failure of the run), ``error`` when the probe could not
run, ``cancelled`` when the service stopped first (:meth:`ProbeJobs.shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from app.probe import repository as probe_repository
from app.probe.runner import LevelPlan, ProbeResult, ProbeSpec, run_probe
from app.probe.sweep import analyze
from app.store.models import ProbeRunRow

log = logging.getLogger(__name__)


def result_summary(result: ProbeResult) -> dict:
    """``ProbeResult.summary()`` plus what the levels show together (fit, curve, load split)."""
    return {**result.summary(), "analysis": analyze(result)}


class ProbeJobs:
    def __init__(self, sessions: sessionmaker[Session],
                 on_finished: Callable[[ProbeRunRow], None] | None = None) -> None:
        self.sessions = sessions
        self.on_finished = on_finished  # e.g. ProbeCollector.observe
        self.tasks: dict[int, asyncio.Task] = {}

    @property
    def running(self) -> int:
        return len(self.tasks)

    def start(self, run_id: int, spec: ProbeSpec, plans: Sequence[LevelPlan]) -> asyncio.Task:
        task = asyncio.create_task(self._run(run_id, spec, list(plans)), name=f"probe-{run_id}")
        self.tasks[run_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(run_id, None))
        return task

    async def _run(self, run_id: int, spec: ProbeSpec, plans: list[LevelPlan]) -> None:
        try:
            result = await run_probe(spec, plans)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._store, run_id, "cancelled", None, "the service stopped during the probe")
            raise
        except Exception as exc:
            log.exception("probe %s failed", run_id)
            await asyncio.to_thread(self._store, run_id, "error", None, f"{type(exc).__name__}: {exc}"[:500])
            return
        await asyncio.to_thread(self._store, run_id, "done", result, None)

    def _store(self, run_id: int, state: str, result: ProbeResult | None, error: str | None) -> None:
        with self.sessions.begin() as session:
            row = probe_repository.finish_run(session, run_id, state, result=result, error=error,
                                              summary=result_summary(result) if result is not None else None)
        if row is not None and self.on_finished is not None:
            try:
                self.on_finished(row)
            except Exception:
                log.exception("probe %s: on_finished callback failed", run_id)

    async def wait(self, run_id: int, timeout: float | None = None) -> None:
        task = self.tasks.get(run_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), timeout)

    async def shutdown(self) -> None:
        """Cancel every running probe and wait until each has recorded its cancellation."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
