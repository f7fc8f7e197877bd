"""Regime rules: one file per regime, registered here.

A rule is a pure function ``(Signals, Thresholds) -> Finding | None``. Its module
docstring says the symptom and why it matters; its thresholds live in
:mod:`app.diagnosis.thresholds`; its remedies are phrased for the engine that was
detected. ``causes`` lists the regimes a rule's condition produces as *symptoms*
(e.g. a full KV cache makes requests wait), so the engine can name the cause as the
primary finding instead of the symptom.

To add a regime: a module here with ``RULE = Rule(...)``, an entry in ``RULES``, a
runbook ``docs/runbooks/<regime>.md``, and a firing and a quiet test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from app.diagnosis.findings import Evidence, Finding
from app.diagnosis.signals import Signals
from app.diagnosis.thresholds import Thresholds


@dataclass(frozen=True)
class Rule:
    regime: str
    evaluate: Callable[[Signals, Thresholds], Finding | None]
    causes: tuple[str, ...] = ()


def check(name: str, value: float | None, op: str, threshold: float, unit: str = "", note: str = "") -> Evidence:
    """Evidence for one comparison; a missing value never meets its condition."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = False
    elif op == ">=":
        met = value >= threshold
    elif op == ">":
        met = value > threshold
    elif op == "<=":
        met = value <= threshold
    else:
        raise ValueError(op)
    return Evidence(name, value, op, threshold, unit, met, note)


def info(name: str, value: float | str | None, unit: str = "", note: str = "") -> Evidence:
    return Evidence(name, value, "info", None, unit, True, note)


def confidence(conditions: list[Evidence], observations: float, wanted: float) -> float:
    """0.5 when the weakest condition is just met, rising with its margin (x2 -> 0.75,
    x4 -> ~1), scaled down when the window holds few observations."""
    margins = []
    for e in conditions:
        if not isinstance(e.value, (int, float)) or not isinstance(e.threshold, (int, float)):
            continue
        if e.op in (">=", ">"):
            margins.append(e.value / e.threshold if e.threshold > 0 else 4.0)
        else:
            margins.append(e.threshold / e.value if e.value > 0 else 4.0)
    weakest = max(min(margins, default=1.0), 1.0)
    base = min(0.99, 0.5 + 0.25 * math.log2(weakest))
    data = min(1.0, 0.5 + 0.5 * observations / max(wanted, 1.0))
    return round(base * data, 3)


def probe_evidence(s: Signals, key: str, label: str) -> list[Evidence]:
    """Client-side single-request numbers, when a probe or canary measured them."""
    b = s.probe_baseline
    value = ((b or {}).get(key) or {}).get("p50")
    if value is None:
        return []
    return [info(f"single-request {label} p50 (client probe)", value, "s",
                 f"probe run {b['run_id']}, {b['prompt_tokens']} prompt tokens, {b['age_seconds']:.0f} s ago")]


def remedies(engine: str, vllm: list[str], tgi: list[str], sglang: list[str]) -> list[str]:
    return {"vllm": vllm, "tgi": tgi, "sglang": sglang}.get(engine, vllm)


from app.diagnosis.rules import (  # noqa: E402  (the rule modules import the helpers above)
    bandwidth_bound,
    kv_cache_pressure,
    outside_engine,
    prefill_compute,
    prefill_interference,
    queueing,
    weights_offloaded,
)

#: Order = precedence when several fire and none explains the other: causes first.
RULES: tuple[Rule, ...] = (
    kv_cache_pressure.RULE,
    weights_offloaded.RULE,
    prefill_interference.RULE,
    prefill_compute.RULE,
    bandwidth_bound.RULE,
    queueing.RULE,
    outside_engine.RULE,  # client-side: time before the engine; independent of the engine regimes
)
