"""The regime registry: every module of this package (but :mod:`.base`) is one regime.

A rule is a pure function ``(Signals, Thresholds) -> Finding | None``. Its module
docstring says the symptom and why it matters; its thresholds are fields of
:mod:`app.core.thresholds`; its remedies are phrased for the engine that was
detected; it ends in ``RULE = Rule(...)`` (:class:`app.diagnosis.rules.base.Rule`), which
also carries its rank, PromQL twin and dashboard colour. Everything that lists regimes
reads :data:`RULES`: the engine, ``findings.REGIMES``, the alert names and runbooks
(``app.alerts.config``), ``llm-latency rules export`` and ``grafana/generate.py``.

To add a regime: a module here, a runbook ``docs/runbooks/<regime>.md``, and a firing and
a quiet test.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

from app.core.thresholds import Thresholds
from app.diagnosis.rules.base import Rule


def collect(package: str, path: Iterable[str]) -> tuple[Rule, ...]:
    """Every regime module's ``RULE`` in package ``package`` (at ``path``), in precedence
    order, checked for what the rest of the product assumes of them."""
    rules = []
    for module in pkgutil.iter_modules(path):
        if module.name == "base":
            continue
        rule = getattr(importlib.import_module(f"{package}.{module.name}"), "RULE", None)
        if not isinstance(rule, Rule):
            raise ImportError(f"{package}.{module.name}: a regime module must end in RULE = Rule(...)")
        if rule.regime != module.name:
            raise ImportError(f"{package}.{module.name}: RULE.regime is {rule.regime!r}, must be the module's name")
        field = Thresholds.model_fields.get(rule.min_scrapes)
        if rule.min_scrapes and (field is None or field.annotation is not int):
            raise ImportError(f"{package}.{module.name}: min_scrapes {rule.min_scrapes!r} is not a whole-number "
                              "field of app.core.thresholds.Thresholds")
        if (rule.promql is None) == (not rule.no_promql):
            raise ImportError(f"{package}.{module.name}: give either promql or no_promql (why there is none)")
        rules.append(rule)
    rules.sort(key=lambda r: r.precedence)
    for before, after in zip(rules, rules[1:]):
        if before.precedence == after.precedence:
            raise ImportError(f"regimes {before.regime} and {after.regime} share precedence {before.precedence}")
    names = {r.regime for r in rules}
    for rule in rules:
        if unknown := set(rule.causes) - names:
            raise ImportError(f"{package}.{rule.regime}: causes unknown regime(s) {', '.join(sorted(unknown))}")
    return tuple(rules)


#: Every regime, in precedence order (causes first).
RULES: tuple[Rule, ...] = collect(__name__, __path__)
