"""Probes: client-side TTFT/ITL measurements started through the API, run in the background.

``POST /api/v1/probes`` validates and bounds the probe (see :mod:`app.probe.schemas`),
stores a ``running`` row and answers 202 with its id; ``GET /api/v1/probes/{id}`` shows the
state and, once done, the summary (``?requests=true`` adds every request);
``GET /api/v1/probes`` lists runs (newest first), optionally of one target or kind;
``GET /api/v1/targets/{name}/consistency`` compares recent probes' client TTFT with the
engine's own TTFT over the same periods (:mod:`app.probe.consistency`).

Running probes belong to the service's :class:`~app.probe.jobs.ProbeJobs` (built and shut
down by the Monitor), reached through :data:`app.api.deps.ProbeJobsDep`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from app.api.common import get_or_404, time_range, unprocessable
from app.api.deps import MonitorDep, ProbeJobsDep, SessionDep, TokenHolderDep, WriteAuth
from app.api.redaction import probe_request_detail
from app.api.schemas import ProbeRunOut, ProbeStarted, TargetConsistencyOut
from app.core.durations import format_utc
from app.core.limits import MAX_ID, UnixTime
from app.core.urls import validate_target_url
from app.probe import repository as probe_repository
from app.probe.consistency import check_consistency, period_consistency
from app.probe.runner import ProbeSpec, api_base
from app.probe.schemas import MAX_REQUESTS_TOTAL, MAX_RUNNING_PROBES, ProbeIn
from app.probe.sweep import sweep_plans
from app.store.models import ProbeRequestRow, ProbeRunRow

router = APIRouter(prefix="/api/v1", tags=["probes"])


def run_out(row: ProbeRunRow, requests: list[ProbeRequestRow] | None = None, token_holder: bool = False) -> dict:
    """A run as the API shows it; a request's ``detail`` quoting the server only to a token holder."""
    out = {"id": row.id, "target": row.target, "target_id": row.target_id, "url": row.url, "kind": row.kind,
           "state": row.state, "params": row.params, "started_at": row.started_at, "finished_at": row.finished_at,
           "summary": row.summary, "error": row.error}
    if requests is not None:
        out["requests"] = [{
            "level": r.level, "concurrency": r.concurrency, "prompt_tokens": r.prompt_tokens,
            "max_tokens": r.max_tokens, "seq": r.seq, "started_at": r.started_at, "ttft": r.ttft, "e2e": r.e2e,
            "itl_mean": r.itl_mean, "itl_p50": r.itl_p50, "itl_p99": r.itl_p99, "itl_max": r.itl_max,
            "tokens": r.tokens, "prompt_tokens_seen": r.prompt_tokens_seen, "completion_tokens": r.completion_tokens,
            "finish_reason": r.finish_reason, "status_code": r.status_code, "error": r.error,
            "detail": probe_request_detail(r.error, r.detail, token_holder),
        } for r in requests]
    return out


def _create_row(monitor, body: ProbeIn) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """In a worker thread: resolve the target, store the ``running`` row; (run id, base URL, the
    engine's metrics URL: a target's own, else the base URL's ``/metrics``)."""
    with monitor.sessions.begin() as session:
        target_id, name, url = None, body.url, body.url
        metrics_url = api_base(body.url) + "/metrics" if body.url else ""
        if body.target is not None:
            target = probe_repository.target_by_name(session, body.target)
            if target is None:
                raise unprocessable("body.target", f"unknown target {body.target!r}")
            target_id, name, url, metrics_url = target.id, target.name, body.url or target.url, target.url
        kind = "sweep" if len(body.concurrency) > 1 or len(body.prompt_tokens) > 1 else "adhoc"
        row = probe_repository.create_run(session, target=name, url=url, kind=kind, params=body.params(),
                                          target_id=target_id)
        return row.id, url, metrics_url


@router.post("/probes", response_model=ProbeStarted, status_code=status.HTTP_202_ACCEPTED, dependencies=[WriteAuth])
async def create_probe(body: ProbeIn, monitor: MonitorDep, jobs: ProbeJobsDep) -> dict:
    """Start a probe in the background; 202 with its id. Bounded by :mod:`app.probe.schemas`."""
    if body.target is None and body.url is None:
        raise unprocessable("body.target", "give a target name or a url")
    if body.url is not None:
        try:
            validate_target_url(body.url, monitor.settings.allowed_target_hosts)
        except ValueError as exc:
            raise unprocessable("body.url", str(exc)) from None
    try:
        plans = sweep_plans(body.prompt_tokens, body.concurrency, body.max_tokens, body.requests)
    except ValueError as exc:
        raise unprocessable("body.prompt_tokens", str(exc)) from None
    total = sum(p.requests for p in plans)
    if total > MAX_REQUESTS_TOTAL:
        raise unprocessable("body.requests", f"at most {MAX_REQUESTS_TOTAL} requests per probe, "
                                             f"this one would send {total}")
    if jobs.running >= MAX_RUNNING_PROBES:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                            f"{jobs.running} probes are running (at most {MAX_RUNNING_PROBES}); retry later")
    run_id, url, metrics_url = await asyncio.to_thread(_create_row, monitor, body)
    spec = ProbeSpec(url=url, model=body.model, prompt_tokens=max(body.prompt_tokens), max_tokens=body.max_tokens,
                     concurrency=max(body.concurrency), chat=body.chat, endpoint=body.endpoint,
                     api_key=body.api_key.get_secret_value() if body.api_key else None, timeout=body.timeout,
                     stall_timeout=body.stall_timeout, connect_timeout=min(10.0, body.timeout),
                     time_limit=body.time_limit, ignore_eos=body.ignore_eos, metrics_url=metrics_url)
    jobs.start(run_id, spec, plans)
    return {"id": run_id, "state": "running", "href": f"/api/v1/probes/{run_id}"}


@router.get("/probes/{run_id}", response_model=ProbeRunOut, response_model_exclude_unset=True)
def get_probe(run_id: Annotated[int, Path(ge=1, le=MAX_ID)], session: SessionDep, monitor: MonitorDep,
              token_holder: TokenHolderDep,
              requests: Annotated[bool, Query(description="include every request")] = False) -> dict:
    """The run; for a finished run of a monitored target also ``consistency``: its client TTFT
    against the engine's TTFT histogram over the scrapes around it (``insufficient_data``
    until the target was scraped after the run)."""
    row = probe_repository.get_run(session, run_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"probe {run_id} not found")
    out = run_out(row, probe_repository.requests_of(session, run_id) if requests else None, token_holder)
    if row.state == "done" and row.target_id is not None and row.summary:
        result = check_consistency(session, row.target_id, row.summary,
                                   thresholds=monitor.diagnosis_config.thresholds)
        out["consistency"] = replace(result, runs=(row.id,)).to_dict()
    return out


@router.get("/targets/{name}/consistency", response_model=TargetConsistencyOut,
            response_model_exclude_unset=True)
def target_consistency(name: str, session: SessionDep, monitor: MonitorDep,
                       window: Annotated[str, Query(description="probe runs that finished in this window, "
                                                                "e.g. 15m")] = "15m",
                       end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None) -> dict:
    """Client-side probe TTFT vs. the engine's TTFT over the same periods, for the probe runs of
    the target that finished in the window (the newest :data:`~app.probe.consistency.MAX_RUNS`),
    combined: what the ``outside_engine`` diagnosis reads. ``status`` is ``ok``, ``finding``,
    ``insufficient_data``, ``unreliable``, or ``no_probes`` when no run finished in the window."""
    target = get_or_404(session, name)
    seconds, until = time_range(window, None, end)
    result = period_consistency(session, target.id, until - seconds, until, monitor.diagnosis_config.thresholds)
    if result is None:
        period = (f"the last {window}" if end is None
                  else f"{format_utc(until - seconds)} .. {format_utc(until)} ({window})")
        return {"target": name, "window": window, "status": "no_probes",
                "message": f"no probe run of {name!r} finished in {period}"}
    return {"target": name, "window": window, **result.to_dict()}


@router.get("/probes", response_model=list[ProbeRunOut], response_model_exclude_unset=True)
def list_probes(session: SessionDep, target: str | None = None,
                kind: Annotated[str | None, Query(pattern="^(adhoc|canary|sweep)$")] = None,
                limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[dict]:
    return [run_out(row) for row in probe_repository.list_runs(session, target, kind, limit)]
