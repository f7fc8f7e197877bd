"""Change events: what happened to a target, detected from its windows one round after another.

* ``restart``: the engine's counters went back to zero in the round's window (counter resets);
* ``config``: a label of an info metric (vLLM ``cache_config_info``: ``enable_prefix_caching``,
  ``block_size``, ``gpu_memory_utilization``, ``num_gpu_blocks``...; a version label where the
  engine exports one) has another value than the round before;
* ``replicas``: a service's replica is no longer scraped (its pod gone, or its scrapes failing), or
  a new one is: idle or busy alike (traffic is the ``step`` events'; see
  :func:`app.attribution.measures.facts_of`);
* ``regime``: a diagnosis finding became active or resolved (read from the findings table);
* ``step``: the request rate, the mean prompt or output length or the prefix-cache hit rate
  stepped, by the change-point test of :mod:`app.attribution.changepoint`.

Pure: :func:`detect` compares one round's observation with what the detector remembers and
returns the events and what to remember next (:mod:`app.attribution.rounds` reads and stores).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.attribution.changepoint import Cusum, CusumSettings
from app.attribution.measures import Facts
from app.sources.base import CanonicalInfo

KINDS = ("restart", "config", "replicas", "regime", "step")
#: the workload and load series the change-point test watches: name -> (label, unit, least spread)
STEP_SERIES = {"request_rate": ("request rate", "req/s", 0.01), "prompt_length": ("mean prompt length", "tokens", 1.0),
               "output_length": ("mean output length", "tokens", 1.0),
               "prefix_cache_hit_rate": ("prefix-cache hit rate", "share", 0.01)}
#: info labels that change without a change of configuration (vLLM writes the engine index)
VOLATILE_LABELS = frozenset({"engine"})


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """Something that happened to a target at ``ts`` (unix seconds)."""

    kind: str
    ts: float
    subject: str          # what changed: a label, a series, a replica, a regime
    before: str | None
    after: str | None
    summary: str
    id: int | None = None
    target: str = ""
    detected_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "target": self.target, "kind": self.kind, "ts": self.ts, "subject": self.subject,
                "before": self.before, "after": self.after, "summary": self.summary, "detected_at": self.detected_at}


def step_values(facts: Facts) -> dict[str, float]:
    """The round's value of each :data:`STEP_SERIES` it has (a length only when requests finished);
    the request rate is the arrivals' (:attr:`Facts.arrival_rate`): while requests queue, the
    finished ones are the engine's service rate, not its load."""
    out = {}
    if facts.arrival_rate is not None:
        out["request_rate"] = facts.arrival_rate
    if facts.request_rate:
        for name, value in (("prompt_length", facts.prompt_mean), ("output_length", facts.output_mean),
                            ("prefix_cache_hit_rate", facts.hit_rate)):
            if value is not None:
                out[name] = value
    return out


def config_of(infos: Sequence[CanonicalInfo]) -> dict[str, str]:
    """Every info label as ``metric[model].label`` -> value (the volatile ones left out). A label
    with two values at once is left out until one is left: a Prometheus source still sees a
    replaced info series until it goes stale (at once where Prometheus scraped the change; five
    minutes later in a TSDB without staleness markers)."""
    values: dict[str, set[str]] = {}
    for info in infos:
        where = f"{info.name}[{info.model}]" if info.model else info.name
        for label, value in info.labels.items():
            if label not in VOLATILE_LABELS:
                values.setdefault(f"{where}.{label}", set()).add(value)
    return {key: next(iter(found)) for key, found in sorted(values.items()) if len(found) == 1}


def config_changes(old: Mapping[str, str], new: Mapping[str, str], ts: float) -> list[ChangeEvent]:
    """The labels with another value in ``new`` than in ``old`` (one in only one of them is not a change:
    an info metric the engine began or stopped exporting)."""
    return [ChangeEvent("config", ts, key, old[key], new[key], f"{key}: {old[key]} -> {new[key]}")
            for key in sorted(set(old) & set(new)) if old[key] != new[key]]


@dataclass(slots=True)
class Memory:
    """What the detector of one target remembers between rounds (stored as JSON)."""

    config: dict[str, str] | None = None
    replicas: list[str] | None = None
    steps: dict[str, dict] = field(default_factory=dict)  # series -> Cusum state

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "replicas": self.replicas, "steps": self.steps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Memory:
        data = data or {}
        return cls(data.get("config"), data.get("replicas"), dict(data.get("steps") or {}))


def _fmt(value: float, unit: str) -> str:
    if unit == "share":
        return f"{value:.0%}"
    return f"{value:.3g} {unit}"


def detect(memory: Memory, facts: Facts, infos: Sequence[CanonicalInfo], is_service: bool,
           settings: CusumSettings) -> list[ChangeEvent]:
    """The events of one round's window (``facts``), updating ``memory``. The first round of a
    target only remembers (no baseline yet); a window without scrapes changes nothing."""
    events: list[ChangeEvent] = []
    t = facts.end
    if facts.scrapes == 0:
        return events
    if facts.restarts:
        events.append(ChangeEvent("restart", t, "engine", None, None,
                                  f"the engine restarted ({facts.restarts} counter reset"
                                  f"{'s' if facts.restarts > 1 else ''} in the {facts.seconds:.0f} s before)"))
    config = config_of(infos)
    if config and memory.config is not None:
        events += config_changes(memory.config, config, t)
    if config:
        memory.config = {**(memory.config or {}), **config}
    if is_service:
        now = sorted(facts.replicas)
        if memory.replicas is not None:
            for name in sorted(set(memory.replicas) - set(now)):
                events.append(ChangeEvent("replicas", t, name, "up", "gone",
                                          f"replica {name} is gone: no longer scraped ({len(now)} up)"))
            for name in sorted(set(now) - set(memory.replicas)):
                events.append(ChangeEvent("replicas", t, name, "absent", "up",
                                          f"replica {name} joined ({len(now)} up)"))
        memory.replicas = now
    if facts.restarts:  # the window of a restart holds its downtime: no step is judged from it
        return events
    for name, value in step_values(facts).items():
        label, unit, floor = STEP_SERIES[name]
        detector = Cusum.from_json(memory.steps.get(name), replace(settings, floor=floor))
        step = detector.update(value, facts.start, facts.end)
        memory.steps[name] = detector.to_json()
        if step is not None:
            events.append(ChangeEvent("step", step.at, name, _fmt(step.before, unit), _fmt(step.after, unit),
                                      f"{label} stepped {step.direction}: {_fmt(step.before, unit)} -> "
                                      f"{_fmt(step.after, unit)}"))
    return events
