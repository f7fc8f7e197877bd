"""Targets: CRUD, latency percentiles, quantile time series, scrape health."""

from __future__ import annotations

import math
import time
from typing import Annotated, Any

import anyio.from_thread
from fastapi import APIRouter, HTTPException, Query, Response, status
from pydantic import TypeAdapter, ValidationError

from app import latency, summaries
from app.api.common import (
    duration_param,
    get_or_404,
    response_json,
    serialized,
    time_range,
    unprocessable,
    unprocessable_from,
)
from app.api.deps import BudgetDep, MonitorDep, SessionDep, TokenHolderDep, WriteAuth
from app.api.disaggregation import add_disaggregation
from app.api.redaction import url_as_shown
from app.api.schemas import (
    DiscoveryOut,
    FleetLatencyOut,
    ScrapeHealthOut,
    ScrapeOut,
    SeriesOut,
    TargetConfigOut,
    TargetIn,
    TargetLatencyOut,
    TargetOut,
    TargetPatch,
)
from app.config import TargetConfig
from app.core.limits import UnixTime
from app.core.urls import validate_target_url
from app.lifespan import Monitor
from app.runtime.budget import bounded
from app.runtime.kept import KeptParts, RoundMemo
from app.sources.base import HISTOGRAM_SIGNALS
from app.store import repository
from app.store.db import statement_budget
from app.store.models import DISCOVERED_SOURCES, ScrapeView, Target, TargetView
from app.targets import repository as target_repository

router = APIRouter(prefix="/api/v1", tags=["targets"])


def scrape_out(scrape: ScrapeView | None) -> ScrapeOut | None:
    if scrape is None:
        return None
    return ScrapeOut(ts=scrape.ts, up=scrape.up, duration_seconds=scrape.duration, bytes=scrape.bytes,
                     samples_seen=scrape.samples_seen, samples_kept=scrape.samples_kept,
                     malformed_lines=scrape.malformed, engine=scrape.engine, error_class=scrape.error_class,
                     error=scrape.error)


def target_out(monitor: Monitor, target: TargetView, last: ScrapeView | None = None,
               token_holder: bool = True) -> TargetOut:
    """A target as the API shows it; a password in its URL only to token holders (writers are)."""
    s = monitor.settings
    interval = target.scrape_interval or s.default_scrape_interval
    return TargetOut(
        name=target.name, url=url_as_shown(target.url, token_holder), engine=target.engine,
        detected_engine=target.detected_engine,
        labels=target.labels, scrape_interval_seconds=interval,
        scrape_timeout_seconds=min(target.scrape_timeout or s.default_scrape_timeout, interval),
        sample_limit=target.sample_limit or s.default_sample_limit,
        series_limit=target.series_limit or s.default_series_limit,
        stored_series_limit=target.stored_series_limit or s.default_stored_series_limit,
        source=target.source, origin=target.origin, gone_at=target.gone_at, hardware=target.hardware,
        canary=target.canary, created_at=target.created_at,
        updated_at=target.updated_at, last_scrape=scrape_out(last),
    )


def refuse_discovered(target: Target, what: str) -> None:
    """A discovered target belongs to its discovery: the next round would undo an edit."""
    if target.source in DISCOVERED_SOURCES:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"target {target.name!r} is discovered ({target.source} {target.origin!r}) and cannot be "
                            f"{what}; change the discovery instead")


def check_url(monitor: Monitor, url: str) -> None:
    try:
        validate_target_url(url, monitor.settings.allowed_target_hosts)
    except ValueError as exc:
        raise unprocessable("body.url", str(exc)) from None


def refuse_load_balanced(session: SessionDep, target: Target) -> None:
    """409 for a target whose URL is answered by several engine processes (its latest
    scrape says ``load_balanced``): numbers from mixed replicas' counters would look exact and
    be wrong, so none are given. The detail carries the scrape's explanation and remedy."""
    scrape = repository.latest_scrape(session, target.id)
    if scrape is not None and scrape.error_class == "load_balanced":
        raise HTTPException(status.HTTP_409_CONFLICT, {"error_class": "load_balanced", "target": target.name,
                                                       "message": scrape.error or ""})


LOAD_BALANCED_RESPONSE: dict[int | str, dict[str, Any]] = {409: {"description": (
    "The target is load_balanced: its URL is answered by several engine processes, so no numbers "
    "are given (scrape the pods)")}}


def reschedule(monitor: Monitor) -> None:
    """Called from the request's worker thread after commit: update the scrape jobs."""
    anyio.from_thread.run(monitor.reload_targets)


TARGET_OUT = TypeAdapter(TargetOut)
TARGET_LATENCY_OUT = TypeAdapter(TargetLatencyOut)
FLEET_LATENCY_OUT = TypeAdapter(FleetLatencyOut)


def target_key(monitor: Monitor, target: TargetView, last: ScrapeView | None, token_holder: bool) -> tuple:
    """Everything a target's JSON in the list is made of. Its JSON columns (labels, hardware,
    canary) are stood for by ``updated_at``: they change only through
    :func:`app.targets.repository.update_target`, which sets it; a scrape row never changes."""
    s = monitor.settings
    return (target.id, target.name, target.url, target.engine, target.detected_engine, target.scrape_interval,
            target.scrape_timeout, target.sample_limit, target.series_limit, target.stored_series_limit,
            target.source, target.origin, target.gone_at, target.created_at, target.updated_at,
            s.default_scrape_interval, s.default_scrape_timeout, s.default_sample_limit, s.default_series_limit,
            s.default_stored_series_limit, token_holder, None if last is None else (last.id, last.ts))


TargetMade = tuple[Monitor, TargetView, ScrapeView | None, bool]
#: each target's JSON in the list by what it is made of (:func:`target_key`)
TARGET_JSON = KeptParts[tuple, TargetMade, bytes](lambda made: TARGET_OUT.dump_json(target_out(*made)))


@router.get("/targets", response_model=list[TargetOut])
def list_targets(session: SessionDep, monitor: MonitorDep, token_holder: TokenHolderDep) -> Response:
    """Every target with its latest scrape. The models built here are valid already: each is
    serialized once, instead of dumped, validated again and serialized as FastAPI does with a
    returned value; and a target's JSON is kept while what it shows is unchanged, since between
    two reads most targets are (a scrape every 15 s)."""
    latest = repository.latest_scrapes(session)
    shown = [(t, latest.get(t.id)) for t in target_repository.target_rows(session)]
    parts = TARGET_JSON.parts((target_key(monitor, t, last, token_holder), (monitor, t, last, token_holder))
                              for t, last in shown)
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")


@router.post("/targets", response_model=TargetOut, status_code=status.HTTP_201_CREATED, dependencies=[WriteAuth])
def create_target(body: TargetIn, session: SessionDep, monitor: MonitorDep) -> TargetOut:
    check_url(monitor, body.url)
    if target_repository.get_target(session, body.name) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"target {body.name!r} already exists")
    target = target_repository.create_target(session, **body.model_dump(mode="json"))
    session.commit()
    reschedule(monitor)
    return target_out(monitor, target)


@router.get("/targets/{name}", response_model=TargetOut)
def get_target(name: str, session: SessionDep, monitor: MonitorDep, token_holder: TokenHolderDep) -> TargetOut:
    target = get_or_404(session, name)
    return target_out(monitor, target, repository.latest_scrape(session, target.id), token_holder)


@router.put("/targets/{name}", response_model=TargetOut, dependencies=[WriteAuth])
def replace_target(name: str, body: TargetIn, session: SessionDep, monitor: MonitorDep) -> TargetOut:
    if body.name != name:
        raise unprocessable("body.name", f"must equal the name in the path ({name!r}); targets cannot be renamed")
    check_url(monitor, body.url)
    target = get_or_404(session, name)
    refuse_discovered(target, "replaced")
    target_repository.update_target(session, target, **body.model_dump(mode="json", exclude={"name"}))
    session.commit()
    reschedule(monitor)
    return target_out(monitor, target)


@router.patch("/targets/{name}", response_model=TargetOut, dependencies=[WriteAuth])
def patch_target(name: str, body: TargetPatch, session: SessionDep, monitor: MonitorDep) -> TargetOut:
    target = get_or_404(session, name)
    changes = body.model_dump(mode="json", exclude_unset=True)
    if set(changes) - {"hardware"}:
        refuse_discovered(target, "changed except for its hardware profile")
    if "url" in changes:
        if changes["url"] is None:
            raise unprocessable("body.url", "cannot be null")
        check_url(monitor, changes["url"])
    merged = {"name": target.name, "url": target.url, "engine": target.engine, "labels": target.labels,
              "scrape_interval": target.scrape_interval, "scrape_timeout": target.scrape_timeout,
              "sample_limit": target.sample_limit, "series_limit": target.series_limit,
              "stored_series_limit": target.stored_series_limit, "hardware": target.hardware,
              "canary": target.canary, **changes}
    try:
        TargetConfig.model_validate(merged)  # the combination must still be valid
    except ValidationError as exc:
        raise unprocessable_from(exc) from None
    target_repository.update_target(session, target, **changes)
    session.commit()
    reschedule(monitor)
    return target_out(monitor, target)


@router.delete("/targets/{name}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[WriteAuth])
def delete_target(name: str, session: SessionDep, monitor: MonitorDep) -> None:
    target = get_or_404(session, name)
    if target.gone_at is None:  # a gone discovered target may be deleted with its history
        refuse_discovered(target, "deleted while its discovery still lists it")
    monitor.forget_target(target.id)
    target_repository.delete_target(session, target)
    session.commit()
    reschedule(monitor)


@router.get("/targets/{name}/latency", response_model=TargetLatencyOut, response_model_exclude_unset=True,
            responses=LOAD_BALANCED_RESPONSE)
def target_latency(name: str, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
                   window: Annotated[str, Query(description="e.g. 5m, 1h")] = "5m",
                   start: Annotated[UnixTime | None, Query(description="unix seconds; overrides window")] = None,
                   end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None
                   ) -> Response:
    """p50/p90/p95/p99, mean and count of every histogram signal over the window, as
    ``histogram_quantile(q, sum by (le) (increase(x_bucket[window])))`` would give,
    overall and per model; counter rates; gauge last/mean/max. 409 while the target is
    ``load_balanced``. 503 past ``api_request_budget``."""
    target = get_or_404(session, name)
    refuse_load_balanced(session, target)
    seconds, end = time_range(window, start, end)
    with bounded(budget), statement_budget(session, budget):
        read = monitor.windows.window(session, target, end - seconds, end, HISTOGRAM_SIGNALS)
        report = latency.report_from_window(read)
        add_disaggregation(session, monitor.windows, target, report, read.infos, end - seconds, end)
    return serialized(TARGET_LATENCY_OUT, {"target": name, "engine": target.detected_engine or target.engine,
                                           "window": window, **report}, exclude_unset=True)


@router.get("/targets/{name}/series", response_model=SeriesOut, responses=LOAD_BALANCED_RESPONSE)
def target_series(name: str, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
                  signal: Annotated[str, Query(description="histogram signal, e.g. ttft, itl")] = "ttft",
                  q: Annotated[str, Query(description="quantile 0..1, or 'mean'")] = "0.99",
                  step: str = "30s", window: str = "1h",
                  lookback: Annotated[str, Query(description="increase() range of each point")] = "5m",
                  model: str | None = None,
                  end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None
                  ) -> dict[str, Any]:
    target = get_or_404(session, name)
    refuse_load_balanced(session, target)
    if signal not in HISTOGRAM_SIGNALS:
        raise unprocessable("query.signal", f"unknown signal {signal!r}; one of {', '.join(HISTOGRAM_SIGNALS)}")
    quantile: float | None = None
    if q != "mean":
        try:
            quantile = float(q)
        except ValueError:
            quantile = math.nan
        if not 0.0 <= quantile <= 1.0:
            raise unprocessable("query.q", f"must be a number between 0 and 1 or 'mean', got {q!r}")
    span = duration_param(window, "window")
    step_s = duration_param(step, "step")
    if span / step_s > 11_000:
        raise unprocessable("query.step", "too many points (more than 11000); use a larger step")
    lookback_s = duration_param(lookback, "lookback")
    end = end if end is not None else time.time()
    with bounded(budget), statement_budget(session, budget):
        points = monitor.windows.quantile_series(session, target, signal, quantile, span, step_s, lookback_s, end,
                                                 model)
    return {"target": name, "signal": signal, "q": q, "step_seconds": step_s, "lookback_seconds": lookback_s,
            "model": model, "points": points}


@router.get("/targets/{name}/scrapes", response_model=list[ScrapeOut])
def target_scrapes(name: str, session: SessionDep,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[ScrapeOut | None]:
    target = get_or_404(session, name)
    return [scrape_out(s) for s in repository.scrape_log(session, target.id, limit)]


@router.get("/targets/{name}/config", response_model=TargetConfigOut)
def target_config(name: str, session: SessionDep) -> dict[str, Any]:
    """Engine configuration revealed by info metrics (e.g. vLLM cache_config_info)."""
    target = get_or_404(session, name)
    return {"target": name, "info": [{"name": i.name, "model": i.model, "rank": i.rank, "labels": i.labels,
                                      "ts": i.ts} for i in repository.target_infos(session, target.id)]}


#: the last summary round's fleet answer, serialized once per ``window`` spelling (up to 8)
FLEET_ANSWERS = RoundMemo[str, bytes](8)


def round_fleet_answer(kept: summaries.FleetSummary, window: str) -> bytes:
    """The fleet view the last summary round computed, as JSON: serialized once per round (and
    per spelling of the window), not for every read of it."""
    return FLEET_ANSWERS.get(kept, window, lambda: response_json(FLEET_LATENCY_OUT, {"window": window, **kept.body},
                                                                  exclude_unset=True))


@router.get("/latency", response_model=FleetLatencyOut, response_model_exclude_unset=True)
def fleet_latency(session: SessionDep, monitor: MonitorDep, budget: BudgetDep, window: str = "5m",
                  start: Annotated[UnixTime | None, Query(description="unix seconds; overrides window")] = None,
                  end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None
                  ) -> Response:
    """Fleet-wide percentiles: every target's histograms summed by le. Targets that are
    ``load_balanced`` now are left out and named in ``excluded_load_balanced``. The last
    ``latency_window`` (no ``start``/``end``) is the last summary round's answer (its
    ``start``/``end`` say when); any other window is computed for the request (503 past
    ``api_request_budget``)."""
    seconds, until = time_range(window, start, end)
    kept = monitor.fleet_summary
    if start is None and end is None and kept is not None and \
            summaries.answers(kept.start, kept.end, seconds, until, monitor.settings.summary_interval,
                              kept.took):
        return Response(round_fleet_answer(kept, window), media_type="application/json")
    with bounded(budget), statement_budget(session, budget):
        report = summaries.fleet_report(session, monitor.windows, seconds, until)
    return serialized(FLEET_LATENCY_OUT, {"window": window, **report}, exclude_unset=True)


@router.get("/discovery", response_model=list[DiscoveryOut])
def discovery_status(monitor: MonitorDep, token_holder: TokenHolderDep) -> list[dict[str, Any]]:
    """Every file_sd_configs / http_sd_configs entry: last refresh, targets found, and the
    problems of its files and entries (named by file and position), or why a refresh failed."""
    out = []
    for entry in monitor.discovery.status.values():
        data = entry.to_dict()
        if entry.kind == "http_sd":
            data["where"] = [url_as_shown(url, token_holder) for url in entry.where]
        out.append(data)
    return out


@router.get("/scrape-health", response_model=list[ScrapeHealthOut])
def scrape_health(session: SessionDep, monitor: MonitorDep, window: str = "1h") -> list[dict[str, Any]]:
    seconds = duration_param(window, "window")
    since = time.time() - seconds
    latest = repository.latest_scrapes(session)
    counts = repository.scrape_counts_by_target(session, since)  # one query for the fleet, not one per target
    out = []
    for target in target_repository.target_rows(session):
        total, failed = counts.get(target.id, (0, 0))
        out.append({"target": target.name, "engine": target.detected_engine or target.engine,
                    "scrapes": total, "failed": failed,
                    "success_ratio": None if total == 0 else (total - failed) / total,
                    "last": scrape_out(latest.get(target.id))})
    return out
