"""What changed: a target's latency change explained by its cause (:mod:`app.attribution`), and
the change events of a target and of the fleet."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from app.api.common import duration_param, get_or_404, unprocessable
from app.api.deps import BudgetDep, MonitorDep, SessionDep
from app.api.routes.targets import LOAD_BALANCED_RESPONSE, refuse_load_balanced
from app.attribution import reads
from app.attribution import repository as events_repository
from app.attribution.events import KINDS
from app.core.limits import UnixTime
from app.diagnosis.profile import prefill_seconds_per_token
from app.runtime.budget import bounded
from app.store.db import statement_budget

router = APIRouter(prefix="/api/v1", tags=["changes"])

#: the longest window an attribution compares (it reads the window, the baseline and its parts)
MAX_CHANGE_WINDOW = 7 * 86400.0


class ChangeEventOut(BaseModel):
    id: int | None = Field(description="The event's id (baseline=event:<id>)")
    target: str
    kind: str = Field(description="restart | config | replicas | regime | step")
    ts: float = Field(description="When it happened (unix seconds; a step: where the shift began)")
    subject: str = Field(description="What changed: an info label, a series, a replica, a regime")
    before: str | None
    after: str | None
    summary: str
    detected_at: float | None = Field(description="When the events round found it")


class ComponentOut(BaseModel):
    name: str
    label: str
    before: float | None = Field(description="Its mean in the baseline (seconds); null for a part defined by its "
                                             "change only (ITL's batch and step-time parts)")
    after: float | None
    change: float = Field(description="Its change; the components' changes add up to the signal's")
    share: float | None = Field(description="change / the signal's change")


class SignalChangeOut(BaseModel):
    before: dict[str, Any] = Field(description="The baseline's summary: quantiles with their buckets, mean, count")
    after: dict[str, Any]
    change: dict[str, float | None] = Field(description="mean (exact), relative, p50 and p99 (interpolated)")
    noise: float | None = Field(description="One standard deviation of the mean's change, from the baseline's "
                                            "sub-windows")
    changed: bool = Field(description="The mean moved by more than 3 x its noise and 5 %")
    components: list[ComponentOut]
    notes: list[str]
    explained: dict[str, float] = Field(description="Driver -> seconds of the mean's change it explains")
    not_explained: float = Field(description="The change no driver's model accounts for (seconds)")


class DriverOut(BaseModel):
    name: str = Field(description="load | prompt_length | output_length | prefix_cache | batch_size | capacity | "
                                  "replicas | step_time | restart | config")
    label: str
    unit: str
    before: float | None
    after: float | None
    change: float | None
    relative: float | None
    noise: float | None = Field(description="One standard deviation of its change, from the baseline's sub-windows")
    significant: bool = Field(description="Its change is above 3 x its noise (named in the summary)")
    at_least: str | None = Field(description="'before' or 'after': that value is a lower bound (the limit was not "
                                             "reached in that window)")
    explains: dict[str, float] = Field(description="Signal -> seconds of its mean's change this driver explains")
    share: dict[str, float] = Field(description="Signal -> the share of its change")
    note: str


class ChangeWindowOut(BaseModel):
    start: float
    end: float


class ChangeBaselineOut(ChangeWindowOut):
    kind: str = Field(description="previous | offset:<duration> | event:<id>")


class ChangesOut(BaseModel):
    target: str
    model: str | None
    summary: str = Field(description="One sentence: the signal that changed most, its main component, the drivers "
                                     "that explain it, restarts and configuration changes, gaps")
    changed: bool
    lead: str | None = Field(description="The signal the summary is about (null: nothing changed)")
    window: ChangeWindowOut
    baseline: ChangeBaselineOut
    signals: dict[str, SignalChangeOut] = Field(description="ttft, itl (or tpot), e2e")
    drivers: list[DriverOut] = Field(description="Ranked by the seconds of the lead signal's change they explain")
    events: list[ChangeEventOut] = Field(description="Change events from the baseline's start to the window's end")
    gaps: list[str] = Field(description="Where the windows lack data")


@router.get("/targets/{name}/changes", response_model=ChangesOut, responses=LOAD_BALANCED_RESPONSE)
def target_changes(name: str, session: SessionDep, monitor: MonitorDep, budget: BudgetDep,
                   window: Annotated[str, Query(description="the current window, e.g. 10m, 1h")] = "10m",
                   baseline: Annotated[str, Query(description="previous | a duration (1d, 7d: the same window "
                                                              "that long earlier) | event:<id>")] = "previous",
                   model: Annotated[str | None, Query(max_length=256, description="one model (default: all)")] = None,
                   end: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None
                   ) -> dict[str, Any]:
    """What changed between the baseline and the current window: for TTFT, ITL (or TPOT) and
    end-to-end, before, after and the change; the change of each exact component (queue, prefill,
    transfer, front end; ITL by batch size and step time; e2e by TTFT and decode) and its share;
    the drivers (load, prompt and output length, prefix-cache hit rate, batch size, capacity,
    replicas, step time, restarts, configuration) with their own before and after, ranked by the
    seconds each explains under the service's models; the events in between. ``summary`` says it
    in one sentence. 409 while the target is ``load_balanced``."""
    target = get_or_404(session, name)
    refuse_load_balanced(session, target)
    seconds = duration_param(window, "window", minimum=60.0, maximum=MAX_CHANGE_WINDOW)
    until = end if end is not None else time.time()
    with bounded(budget), statement_budget(session, budget):
        try:
            result = reads.attribution(monitor.windows, session, target, seconds, until, baseline, model,
                                       prefill_seconds_per_token(target.hardware))
        except ValueError as exc:
            raise unprocessable("query.baseline", str(exc)) from None
    return {"target": name, "model": model, **result.to_dict()}


def _events(session: SessionDep, target_ids: list[int] | None, since: float | None, until: float | None,
            kind: str | None, limit: int) -> list[dict[str, Any]]:
    if kind is not None and kind not in KINDS:
        raise unprocessable("query.kind", f"unknown kind {kind[:40]!r}; one of {', '.join(KINDS)}")
    now = time.time()
    return [e.to_dict() for e in events_repository.events(
        session, target_ids, since=since if since is not None else now - 86400.0, until=until,
        kinds=[kind] if kind else None, limit=limit)]


@router.get("/targets/{name}/events", response_model=list[ChangeEventOut])
def target_events(name: str, session: SessionDep,
                  since: Annotated[UnixTime | None, Query(description="unix seconds; default a day ago")] = None,
                  until: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None,
                  kind: Annotated[str | None, Query(description=" | ".join(KINDS))] = None,
                  limit: Annotated[int, Query(ge=1, le=events_repository.MAX_EVENTS)] = 200
                  ) -> list[dict[str, Any]]:
    """The target's change events, oldest first: restarts, configuration changes, replica-set
    changes (a service), regime changes (a finding became active or resolved), load and workload
    steps found by the change-point test (docs/changes.md)."""
    return _events(session, [get_or_404(session, name).id], since, until, kind, limit)


@router.get("/events", response_model=list[ChangeEventOut])
def fleet_events(session: SessionDep,
                 since: Annotated[UnixTime | None, Query(description="unix seconds; default a day ago")] = None,
                 until: Annotated[UnixTime | None, Query(description="unix seconds; default now")] = None,
                 kind: Annotated[str | None, Query(description=" | ".join(KINDS))] = None,
                 limit: Annotated[int, Query(ge=1, le=events_repository.MAX_EVENTS)] = 200
                 ) -> list[dict[str, Any]]:
    """Every target's change events, oldest first (the newest ``limit``)."""
    return _events(session, None, since, until, kind, limit)
