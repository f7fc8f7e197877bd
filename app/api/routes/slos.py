"""``GET /api/v1/slos``: the ``slos:`` section now (app/slo/status.py, the computation the
burn-rate alerts and ``/metrics`` use too)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from app.api.deps import BudgetDep, MonitorDep, SessionDep
from app.api.schemas import SloOut
from app.core.durations import format_duration
from app.runtime.budget import bounded
from app.slo.status import BurnAlertState, SloStatus, SloWindow, slo_statuses
from app.store.db import statement_budget

router = APIRouter(prefix="/api/v1", tags=["slos"])


def _window(window: SloWindow, objective: float) -> dict:
    return {"window": window.label, "seconds": window.window, "good": window.good, "total": window.total,
            "sli": window.sli, "burnRate": window.burn_rate(objective), "coveredSeconds": window.covered}


def _alert(alert: BurnAlertState) -> dict:
    return {"kind": alert.kind, "severity": alert.severity, "longWindow": alert.long.label,
            "shortWindow": alert.short.label, "factor": alert.factor, "longBurnRate": alert.long_burn,
            "shortBurnRate": alert.short_burn, "firing": alert.firing}


def slo_out(status: SloStatus) -> dict:
    objective = status.objective
    targets = []
    for part in status.targets:
        burn = None if part.period is None else part.period.burn_rate(objective)
        targets.append({"target": part.target, "labels": part.labels,
                        "sli": None if part.period is None else part.period.sli,
                        "budgetRemaining": None if burn is None else 1.0 - burn,
                        "windows": [_window(w, objective) for w in part.windows],
                        "alerts": [_alert(a) for a in part.alerts], "error": part.error})
    return {"name": status.name, "signal": status.signal, "threshold": status.threshold, "objective": objective,
            "period": format_duration(status.period_seconds), "periodSeconds": status.period_seconds,
            "sli": status.sli, "budgetRemaining": status.budget_remaining, "burnRates": status.burn_rates(),
            "currentBurnRate": status.current_burn, "timeToExhaustion": status.time_to_exhaustion,
            "coverage": status.coverage, "note": status.note, "periodWindow": _window(status.period, objective),
            "windows": [_window(w, objective) for w in status.windows], "targets": targets,
            "errors": list(status.errors)}


@router.get("/slos", response_model=list[SloOut])
def list_slos(monitor: MonitorDep, session: SessionDep, budget: BudgetDep) -> list[dict]:
    """Every SLO of the targets YAML: objective, SLI over the period and each alert window,
    budget left, burn rates, time to exhaustion, coverage; per matched target too. Reads what
    the alerting rounds recorded (and asks the Prometheus sources for their replicas, under the
    request's budget: 503 past ``api_request_budget``)."""
    now = time.time()
    with bounded(budget), statement_budget(session, budget):
        sums, errors = monitor.windows.slo_sums(monitor.sessions, monitor.slos, now) if monitor.slos else ({}, {})
        statuses = slo_statuses(session, monitor.slos, now, monitor.settings.retention, sums, errors)
    return [slo_out(s) for s in statuses]
