"""Scheduled canaries: a small periodic single-request probe per target, stored.

A canary is the cheapest continuous answer to "is it slow even alone?": one request with a
fixed prompt and output length every few minutes. Its stored results are the
*single-request baseline* the diagnosis compares the load-dependent histograms with
(:func:`latest_single_request_baseline`).

Off by default (:class:`CanaryConfig` ``enabled=False``): a canary sends real requests to a
production engine. :func:`sync_canaries` keeps one ``canary:<target>`` job on the service's
scheduler per target that enables it; the job calls :func:`run_canary` (synchronous, in a
worker thread) every ``interval``. :func:`run_canary_async` is the same for an event loop.

The API key, when the endpoint needs one, is read from the environment variable named by
``api_key_env`` at run time, so keys never sit in the config file or the database.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from sqlalchemy.orm import Session, sessionmaker

from app.core.durations import Seconds as _Seconds
from app.core.limits import MAX_INTERVAL_SECONDS, MAX_TEXT_LENGTH, MAX_URL_LENGTH
from app.core.urls import check_url_in_file
from app.probe import repository as probe_repository
from app.probe.runner import ProbeResult, ProbeSpec, run_probe
from app.runtime.scheduling import in_thread
from app.scrape.jobs import ScrapeSpec
from app.store.models import ProbeRunRow
from app.targets import repository as target_repository

log = logging.getLogger(__name__)


class CanaryConfig(BaseModel):
    """Per-target canary settings (``targets[].canary`` in the config file)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    interval: _Seconds = Field(300.0, ge=10, le=MAX_INTERVAL_SECONDS,
                               description="Time between canary probes (e.g. 5m).")
    prompt_tokens: int = Field(512, ge=1, le=131072)
    max_tokens: int = Field(64, ge=1, le=8192)
    requests: int = Field(1, ge=1, le=16, description="Requests per canary, one at a time.")
    model: str | None = Field(None, max_length=256, description="Default: the first model of /v1/models.")
    chat: bool = False
    endpoint: str | None = Field(None, pattern=r"^/[A-Za-z0-9_./-]*$", max_length=MAX_TEXT_LENGTH,
                                 description="Path of the completions endpoint; default /v1/completions "
                                 "(or /v1/chat/completions with chat).")
    url: str | None = Field(None, max_length=MAX_URL_LENGTH,
                            description="Base URL of the OpenAI-compatible API when it is not at the "
                            "scheme/host/port of the metrics URL.")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=MAX_TEXT_LENGTH,
                                    description="Environment variable holding the API key (Bearer).")
    timeout: _Seconds = Field(60.0, gt=0, le=600, description="Per request.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return check_url_in_file(url, info)


class _TargetLike(Protocol):
    name: str
    url: str


def _api_key(config: CanaryConfig) -> str | None:
    if config.api_key_env is None:
        return None
    key = os.environ.get(config.api_key_env)
    if not key:
        raise ValueError(f"environment variable {config.api_key_env} (api_key_env) is not set")
    return key


def canary_spec(target: _TargetLike, config: CanaryConfig) -> ProbeSpec:
    """The probe a canary runs: ``requests`` single requests, one at a time, bounded in time."""
    return ProbeSpec(url=config.url or target.url, model=config.model, prompt_tokens=config.prompt_tokens,
                     max_tokens=config.max_tokens, concurrency=1, requests=config.requests, chat=config.chat,
                     endpoint=config.endpoint, api_key=_api_key(config), timeout=config.timeout,
                     stall_timeout=min(30.0, config.timeout), connect_timeout=min(10.0, config.timeout),
                     time_limit=config.timeout * (config.requests + 1))


def canary_params(config: CanaryConfig) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude={"enabled"})


def _start(sessions: sessionmaker[Session], target: _TargetLike, config: CanaryConfig) -> int:
    with sessions.begin() as session:
        target_id = getattr(target, "id", None)
        if not isinstance(target_id, int):
            row = probe_repository.target_by_name(session, target.name)
            target_id = row.id if row is not None else None
        return probe_repository.create_run(session, target=target.name, url=config.url or target.url, kind="canary",
                                           params=canary_params(config), target_id=target_id).id


def _finish(sessions: sessionmaker[Session], run_id: int, result: ProbeResult | None,
            error: str | None) -> ProbeRunRow | None:
    with sessions.begin() as session:
        return probe_repository.finish_run(session, run_id, "done" if result is not None else "error",
                                           result=result, error=error)


async def run_canary_async(sessions: sessionmaker[Session], target: _TargetLike, config: CanaryConfig, *,
                           on_result: Callable[[ProbeRunRow], None] | None = None) -> ProbeRunRow | None:
    """Run one canary for ``target`` (a ``Target`` row, a scrape ``ScrapeSpec``, anything with
    ``name`` and ``url``; ``id`` when it has one) and store it. Failed requests are results,
    not exceptions: the run is ``done`` with its errors in the summary; only a canary that
    could not run at all (e.g. a missing API key) is stored as ``error``."""
    run_id = await asyncio.to_thread(_start, sessions, target, config)
    result: ProbeResult | None = None
    error: str | None = None
    try:
        result = await run_probe(canary_spec(target, config))
    except ValueError as exc:
        error = str(exc)
    except Exception as exc:
        log.exception("canary for %s failed", target.name)
        error = f"{type(exc).__name__}: {exc}"
    except asyncio.CancelledError:
        await asyncio.to_thread(_mark, sessions, run_id, "cancelled", "the service stopped during the canary")
        raise
    row = await asyncio.to_thread(_finish, sessions, run_id, result, error)
    if row is not None and on_result is not None:
        on_result(row)
    return row


def _mark(sessions: sessionmaker[Session], run_id: int, state: str, error: str) -> None:
    with sessions.begin() as session:
        probe_repository.finish_run(session, run_id, state, error=error)


def run_canary(sessions: sessionmaker[Session], target: _TargetLike, config: CanaryConfig, *,
               on_result: Callable[[ProbeRunRow], None] | None = None) -> ProbeRunRow | None:
    """Synchronous :func:`run_canary_async` for a worker thread (no event loop running in it)."""
    return asyncio.run(run_canary_async(sessions, target, config, on_result=on_result))


@dataclass(frozen=True)
class ProbeBaseline:
    """The newest single-request measurement of a target (client seconds): what the
    diagnosis shows next to the load-dependent server numbers. ``ttft``/``itl``/``e2e``/
    ``tpot`` are the stored level statistics (``count, p50, p90, p99, mean, min, max``);
    ``itl`` and ``tpot`` are None when no request produced a second token. The field order
    is the order of the diagnosis JSON (``signals.probe_baseline``)."""

    run_id: int
    target: str
    kind: str
    measured_at: float | None
    age_seconds: float
    prompt_tokens: int
    max_tokens: int
    requests: int
    succeeded: int
    errors: dict[str, int]
    ttft: dict[str, Any]
    itl: dict[str, Any] | None
    e2e: dict[str, Any]
    tpot: dict[str, Any] | None
    prompt_tokens_seen: dict[str, Any] | None

    def p50(self, stat: str) -> float | None:
        """The median of ``ttft``, ``itl``, ``e2e`` or ``tpot``; None when not measured."""
        stats: dict[str, Any] | None = getattr(self, stat)
        return (stats or {}).get("p50")


def latest_single_request_baseline(session: Session, target: int | str, since: float) -> ProbeBaseline | None:
    """The newest single-request measurement of ``target`` (id, or name) since ``since``:
    the concurrency-1 level of the latest finished canary, ad hoc probe or sweep with at least
    one successful request. None when there is none."""
    for run in probe_repository.finished_runs(session, target, since):
        for level in (run.summary or {}).get("levels", []):
            if level.get("concurrency") == 1 and level.get("succeeded", 0) > 0:
                return ProbeBaseline(
                    run_id=run.id, target=run.target, kind=run.kind, measured_at=run.finished_at,
                    age_seconds=max(0.0, time.time() - (run.finished_at or run.started_at)),
                    prompt_tokens=level["prompt_tokens"], max_tokens=level["max_tokens"],
                    requests=level["requests"], succeeded=level["succeeded"], errors=level["errors"],
                    ttft=level["ttft"], itl=level["itl"], e2e=level["e2e"], tpot=level.get("tpot"),
                    prompt_tokens_seen=level.get("prompt_tokens_seen"),
                )
    return None


# --------------------------------------------------------------------------- scheduling

CANARY_JOB_PREFIX = "canary:"


def canary_configs(sessions: sessionmaker[Session]) -> dict[str, tuple[ScrapeSpec, CanaryConfig]]:
    """Target name -> (target, canary settings) of every target whose canary is enabled."""
    with sessions() as session:
        return {t.name: (ScrapeSpec(t.id, t.name, t.url), CanaryConfig.model_validate(t.canary))
                for t in target_repository.list_targets(session) if t.canary and t.canary.get("enabled")}


def sync_canaries(scheduler: AsyncIOScheduler, sessions: sessionmaker[Session],
                  wanted: dict[str, tuple[ScrapeSpec, CanaryConfig]], *,
                  on_result: Callable[[ProbeRunRow], None] | None = None) -> None:
    """Make the ``canary:<target>`` jobs match ``wanted`` (:func:`canary_configs`): one
    periodic single-request probe job per target that enables it, none for the others."""
    for job in scheduler.get_jobs():
        if job.id.startswith(CANARY_JOB_PREFIX) and job.id.removeprefix(CANARY_JOB_PREFIX) not in wanted:
            job.remove()
    for name, (spec, config) in wanted.items():
        def run(spec: ScrapeSpec = spec, config: CanaryConfig = config) -> None:
            run_canary(sessions, spec, config, on_result=on_result)
        scheduler.add_job(in_thread(run, f"canary_{name}"), "interval", seconds=config.interval,
                          id=f"{CANARY_JOB_PREFIX}{name}", max_instances=1, coalesce=True, replace_existing=True)
