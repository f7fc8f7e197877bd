"""The capacity signal: how many replicas a target (or a Prometheus source's service) needs
for its current load, and whether adding replicas is the answer at all.

An autoscaler acts on one number: ``llm_latency_capacity_desired_replicas`` (KEDA's
Prometheus scaler or an HPA external metric with a target of 1 per replica, examples in
``deploy/autoscaling/``). It is computed from the latest diagnosis of each target and model
(the same :class:`app.diagnosis.signals.Signals`, saved as ``Diagnosis.signals``), never from
numbers of its own, in two steps:

1. **Load.** Each input is a utilization, 1.0 meaning "exactly the replicas there are":

   * ``slots``: requests in the engine (running + waiting, means over the diagnosis window)
     over the most it ran at once in the window (``running_max``; a service's is the sum of
     its replicas' maxima). With requests waiting the batch is full, so this is Little's law
     for the batch: the queue would fit in ``running + waiting`` slots. Without a queue it is
     below 1 and measures how much of the batch the traffic used.
   * ``kv_cache``: mean KV-cache usage over ``capacity_kv_usage`` (0.8): near-full caches
     preempt sequences, and spreading the batch over more replicas frees blocks.
   * ``arrival``: only while requests wait (mean waiting >= ``queue_waiting``, the engine is
     at its service rate): arrival rate over completion rate. Completions are the
     ``requests_total`` rate; arrivals are completions plus the growth of the requests in the
     engine, ``2 x (last - mean) / window`` (a linear ramp's mean is its midpoint). A queue
     growing by one request a second on an engine that finishes two a second needs 1.5x.

   Utilization is the largest input; ``desired = ceil(current x utilization)``, at least 1,
   and ``current`` unchanged while utilization is within ``capacity_tolerance`` (0.1) of 1.
   ``current`` is 1 for an engine and the replicas with data for a service.

   **SLO burn.** The load model estimates; the SLOs of the ``slos:`` section measure. When an
   SLO evaluated on the target burns its error budget faster than it lasts over both of its two
   shortest windows (5 m and 30 m by default; burn rate > 1 in each, so one slow request does
   not count), ``desired`` is at least ``current + 1``. The burn rates are the latest alerting
   round's (:class:`app.slo.status.SloStatus`, the numbers of ``GET /api/v1/slos``). A service
   takes the fastest burn among its replicas (SLOs are evaluated on a source's replicas).

2. **Whether replicas help.** The diagnosis decides. When the verdict is a regime whose
   rule says more replicas do not fix it (``Rule.replicas_help`` False: prefill
   interference, bandwidth-bound decode, weights offloaded, long-prompt prefill, a slow
   front end outside the engine, replicas unevenly loaded), the signal holds:
   ``desired = current``, ``scaling_helps = 0`` and ``reason`` the regime. So does a verdict
   of ``insufficient_data`` (too little traffic to judge) and a target without a running
   gauge (``no_load_data``), and ``unexplained`` (slow for a reason no rule could name: scaling
   would be a guess). ``healthy``, ``not_judged`` (no regime found, though not every one could be
   judged: the load numbers are still measured) and the load regimes (``queueing``,
   ``kv_cache_pressure``) act: ``scaling_helps = 1``, ``desired`` from the load, which for a
   healthy engine is at most ``current``.

Pure functions of a diagnosis (the dicts ``GET /api/v1/diagnoses`` returns and the diagnosis
round exports), so the API and ``/metrics`` give the same answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.thresholds import Thresholds
from app.diagnosis.rules import RULES
from app.slo.status import SloStatus

#: the load inputs, in the order they are shown
INPUTS = ("slots", "kv_cache", "arrival")
#: ``reason`` of a target whose diagnosis has no running-requests gauge to size it with
NO_LOAD_DATA = "no_load_data"
#: regimes more replicas fix (``Rule.replicas_help``), and the verdicts that found no regime; every
#: other verdict holds the count
SCALING_REGIMES = frozenset(rule.regime for rule in RULES if rule.replicas_help) | {"healthy", "not_judged"}


@dataclass(slots=True)
class Capacity:
    """The capacity signal of one target (or service) and model."""

    target: str
    model: str
    kind: str                      # "engine" or "service" (a Prometheus source's replicas as one)
    current_replicas: int
    desired_replicas: int
    scaling_helps: bool            # the autoscaler may act on desired_replicas
    reason: str                    # the verdict it was decided by, or no_load_data
    utilization: float | None      # the largest input; None without load data
    bound_by: str | None           # which input that was
    inputs: dict[str, float] = field(default_factory=dict)  # input -> utilization (1.0 = at capacity)
    evaluated_at: float | None = None
    summary: str = ""
    slo: str | None = None                # the SLO on this target burning fastest over its two shortest windows
    slo_burn_rate: float | None = None    # ... the lower of those two burn rates (> 1: burning)


def slo_burn(statuses: Sequence[SloStatus], targets: Iterable[str]) -> tuple[str, float] | None:
    """(SLO, burn rate) of the SLO evaluated on one of ``targets`` (a target, or a service's
    replicas: SLOs are evaluated on a source's replicas, not on the services grouping them)
    that burns fastest, the burn rate being the lower of its two shortest windows' (both must
    agree); None without such an SLO."""
    names = set(targets)
    best: tuple[str, float] | None = None
    for status in statuses:
        for part in status.targets:
            if part.target not in names or part.error is not None or len(part.windows) < 2:
                continue
            rates = [w.burn_rate(status.objective) for w in part.windows[:2]]
            if any(r is None for r in rates):
                continue
            burn = min(r for r in rates if r is not None)
            if best is None or burn > best[1]:
                best = (status.name, burn)
    return best


def _number(signals: Mapping[str, Any], key: str) -> float | None:
    value = signals.get(key)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def load_inputs(signals: Mapping[str, Any], t: Thresholds) -> dict[str, float]:
    """Each load input's utilization from a diagnosis' signals (``Signals.to_dict()``);
    inputs whose numbers are missing are left out."""
    running, running_max = _number(signals, "running_mean"), _number(signals, "running_max")
    waiting = _number(signals, "waiting_mean") or 0.0
    inputs: dict[str, float] = {}
    if running is not None and running_max is not None:
        if running_max > 0:
            inputs["slots"] = (running + waiting) / running_max
        elif waiting == 0:
            inputs["slots"] = 0.0  # nothing ran and nothing waited: idle
    kv = _number(signals, "kv_usage_mean")
    if kv is not None:
        inputs["kv_cache"] = kv / t.capacity_kv_usage
    completions = _number(signals, "requests_per_second")
    start, end = _number(signals, "window_start"), _number(signals, "window_end")
    if waiting >= t.queue_waiting and running is not None and completions and start is not None \
            and end is not None and end > start:
        last = (_number(signals, "running_last") or 0.0) + (_number(signals, "waiting_last") or 0.0)
        growth = 2.0 * (last - (running + waiting)) / (end - start)
        inputs["arrival"] = max(0.0, completions + growth) / completions
    return inputs


def _evaluated_at(diagnosis: Mapping[str, Any]) -> float | None:
    """When the diagnosis was made: stored rows say so, a round's own results end their window then."""
    if isinstance(diagnosis.get("evaluated_at"), (int, float)):
        return float(diagnosis["evaluated_at"])
    window = diagnosis.get("window") or {}
    return float(window["end"]) if isinstance(window.get("end"), (int, float)) else None


def assess(diagnosis: Mapping[str, Any], t: Thresholds, slos: Sequence[SloStatus] = ()) -> Capacity:
    """The capacity signal of one diagnosis (a dict as ``GET /api/v1/diagnoses`` lists it), with
    the burn rates of ``slos`` (the latest alerting round's statuses)."""
    signals: Mapping[str, Any] = diagnosis.get("signals") or {}
    replicas = signals.get("replicas") or []
    kind = "service" if replicas else "engine"
    current = max(1, len(replicas))
    verdict = diagnosis.get("verdict") or "insufficient_data"
    inputs = load_inputs(signals, t)
    utilization = max(inputs.values()) if inputs else None
    bound_by = max(inputs, key=lambda k: inputs[k]) if inputs else None
    base = Capacity(diagnosis["target"], diagnosis.get("model") or "", kind, current, current, False, verdict,
                    utilization, bound_by, inputs, _evaluated_at(diagnosis))
    burning = slo_burn(slos, [base.target, *(r["target"] for r in replicas if isinstance(r, Mapping))])
    if burning is not None:
        base.slo, base.slo_burn_rate = burning
    if verdict not in SCALING_REGIMES:
        base.summary = (f"Holding {current} replica(s): the diagnosis is {verdict}, which more replicas do not fix."
                        if verdict != "insufficient_data" else
                        f"Holding {current} replica(s): too little traffic in the window to size the target.")
        return base
    if "slots" not in inputs:
        base.reason = NO_LOAD_DATA
        base.summary = f"Holding {current} replica(s): no running-requests gauge to size the target with."
        return base
    assert utilization is not None and bound_by is not None
    base.scaling_helps = True
    if abs(utilization - 1.0) > t.capacity_tolerance:
        base.desired_replicas = max(1, math.ceil(current * utilization - 1e-9))
    if base.slo_burn_rate is not None and base.slo_burn_rate > 1.0 and base.desired_replicas <= current:
        base.desired_replicas, base.bound_by = current + 1, "slo_burn"
    change = ("keep" if base.desired_replicas == current else
              "add" if base.desired_replicas > current else "remove")
    why = (f"SLO {base.slo} burns its budget {base.slo_burn_rate:.1f}x as fast as it lasts"
           if base.bound_by == "slo_burn" else f"{bound_by} utilization {utilization:.2f}")
    base.summary = (f"{change.capitalize()} replicas: {current} -> {base.desired_replicas} ({why}, verdict "
                    f"{verdict})." if change != "keep" else
                    f"Keep {current} replica(s): utilization {utilization:.2f} ({bound_by}), verdict {verdict}.")
    return base


def assess_all(diagnoses: Iterable[Mapping[str, Any]], t: Thresholds,
               slos: Sequence[SloStatus] = ()) -> list[Capacity]:
    """Every diagnosis' capacity signal, by target and model."""
    return sorted((assess(d, t, slos) for d in diagnoses), key=lambda c: (c.target, c.model))
