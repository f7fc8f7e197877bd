"""An attribution: for TTFT, ITL (or TPOT) and end-to-end, the change between a baseline window
and the current one, its exact components, the drivers ranked by the seconds they explain, the
events between the two, the gaps in the data, and one sentence that says it first.

Quantiles (the sentence's p99) come from the windows' histograms with the bucket that holds
them; every split and explanation is of exact means. A signal "changed" when its mean moved by
more than its noise over the baseline (:mod:`app.attribution.drivers`) and 5 %; when none did,
the answer says nothing changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.attribution import algebra, drivers
from app.attribution.algebra import Split
from app.attribution.drivers import Driver
from app.attribution.events import ChangeEvent
from app.attribution.measures import Facts
from app.core import human
from app.core.durations import format_duration
from app.latency import WindowSummary

NAMES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "end-to-end"}
#: the order the sentence prefers among signals that changed by the same share
ORDER = ("ttft", "itl", "tpot", "e2e")
#: a window holding scrapes for less than this share of the baseline's densest stretch has a gap
MIN_COVERAGE = 0.8


@dataclass(slots=True)
class SignalChange:
    """One signal's change: summaries before and after, the split, what explains it."""

    split: Split
    before: WindowSummary | None
    after: WindowSummary | None
    noise: float | None
    changed: bool
    explained: dict[str, float] = field(default_factory=dict)

    @property
    def not_explained(self) -> float:
        return self.split.change - math.fsum(self.explained.values())

    def to_dict(self) -> dict[str, Any]:
        s = self.split
        return {"before": self.before.to_dict() if self.before else {"mean": s.before},
                "after": self.after.to_dict() if self.after else {"mean": s.after},
                "change": {"mean": s.change, "relative": s.change / s.before if s.before else None,
                           **_quantile_change(self.before, self.after)},
                "noise": self.noise, "changed": self.changed,
                "components": [c.to_dict() for c in s.components], "notes": list(s.notes),
                "explained": dict(self.explained), "not_explained": self.not_explained}


def _quantile_change(before: WindowSummary | None, after: WindowSummary | None) -> dict[str, float]:
    out = {}
    for key in ("p50", "p99"):
        b, a = getattr(before, key, None), getattr(after, key, None)
        if b is not None and a is not None:
            out[key] = a - b
    return out


@dataclass(slots=True)
class Attribution:
    """The whole answer (``GET /api/v1/targets/{name}/changes``)."""

    window: tuple[float, float]
    baseline: tuple[float, float]
    baseline_kind: str
    signals: dict[str, SignalChange]
    drivers: list[Driver]
    events: list[ChangeEvent]
    gaps: list[str]
    lead: str | None
    summary: str = ""

    @property
    def changed(self) -> bool:
        return self.lead is not None

    def to_dict(self) -> dict[str, Any]:
        totals = {name: c.split.change for name, c in self.signals.items()}
        return {"summary": self.summary, "changed": self.changed, "lead": self.lead,
                "window": {"start": self.window[0], "end": self.window[1]},
                "baseline": {"kind": self.baseline_kind, "start": self.baseline[0], "end": self.baseline[1]},
                "signals": {name: c.to_dict() for name, c in self.signals.items()},
                "drivers": [d.to_dict(totals) for d in self.drivers],
                "events": [e.to_dict() for e in self.events], "gaps": list(self.gaps)}


def gaps(before: Facts, after: Facts, parts: Sequence[Facts]) -> list[str]:
    """Where the windows lack data, said in words: sub-windows of the baseline without a scrape,
    and a current window (or baseline) with fewer scrapes than the baseline's densest sub-window."""
    out = []
    densest = max((p.scrapes / p.seconds for p in parts if p.seconds > 0), default=0.0)
    empty = [p for p in parts if p.scrapes == 0]
    if empty:
        runs: list[list[float]] = []
        for p in empty:  # consecutive empty parts as one span
            if runs and runs[-1][1] == p.start:
                runs[-1][1] = p.end
            else:
                runs.append([p.start, p.end])
        spans = ", ".join(f"{_clock(a)}-{_clock(b)}" for a, b in runs)
        out.append(f"the baseline has no scrape in {len(empty)} of its {len(parts)} parts ({spans} UTC)")
    for what, facts in (("current window", after), ("baseline", before)):
        if densest > 0 and facts.seconds > 0:
            coverage = facts.scrapes / (densest * facts.seconds)
            if coverage < MIN_COVERAGE and not (what == "baseline" and empty):
                out.append(f"the {what} holds scrapes for {coverage:.0%} of it")
    return out


def _clock(ts: float) -> str:
    return time.strftime("%H:%M", time.gmtime(ts))


def _context(events: Sequence[ChangeEvent], restarts: int | None) -> list[Driver]:
    """Restarts and configuration changes between the windows, as drivers without a model:
    evidence the others' notes point at."""
    out = []
    restart_events = [e for e in events if e.kind == "restart"]
    count = max(len(restart_events), restarts or 0)
    if count:
        when = ", ".join(_clock(e.ts) for e in restart_events) or "in the current window"
        out.append(Driver("restart", "engine restarts", "restarts", 0.0, float(count), 0.0, True,
                          note=f"restarted {when} UTC" if restart_events else "restarted in the current window"))
    config = [e for e in events if e.kind == "config"]
    if config:
        out.append(Driver("config", "configuration", "labels", None, None, 0.0, True,
                          note="; ".join(f"{e.subject}: {e.before} -> {e.after}" for e in config)))
    return out


def attribute(before: Facts, after: Facts, parts: Sequence[Facts], events: Sequence[ChangeEvent] = (),
              baseline_kind: str = "previous", prefill_per_token: float | None = None) -> Attribution:
    """The attribution of ``after`` against ``before``; ``parts`` are the baseline's sub-windows
    (the noise), ``events`` those between the baseline's start and the current window's end;
    ``prefill_per_token`` the hardware profile's compute per prompt token, where one is set."""
    splits = algebra.splits(before, after)
    found = drivers.measured(before, after, parts)
    for extra in (drivers.capacity(before, after), drivers.replicas(before, after),
                  drivers.step_time(splits.get("itl"), parts)):
        if extra is not None:
            found[extra.name] = extra
    explained = drivers.Explainer(before, after, splits, found, prefill_per_token).explain()
    signals = {}
    for name, split in splits.items():
        sd = drivers.noise(parts, _mean_of(name))
        changed = drivers.significant(split.before, split.after, sd, min_relative=drivers.SIGNAL_MIN_RELATIVE)
        signals[name] = SignalChange(split, before.summaries.get(name), after.summaries.get(name), sd, changed,
                                     explained.get(name, {}))
    lead = max((n for n in ORDER if n in signals and signals[n].changed),
               key=lambda n: (abs(signals[n].split.change / signals[n].split.before) if signals[n].split.before
                              else math.inf, -ORDER.index(n)), default=None)
    context = _context(events, after.restarts)
    ranked = sorted(found.values(), key=lambda d: (-abs(d.explains.get(lead or "", 0.0)), not d.significant,
                                                   d.name))
    for driver in context:
        _link(driver, ranked)
    shown = [d for d in ranked if d.significant or d.explains] + context
    result = Attribution((after.start, after.end), (before.start, before.end), baseline_kind, signals, shown,
                         list(events), gaps(before, after, parts), lead)
    result.summary = sentence(result)
    return result


def _mean_of(signal: str) -> Callable[[Facts], float | None]:
    return lambda facts: facts.mean(signal)


def _link(context: Driver, ranked: Sequence[Driver]) -> None:
    """Point the drivers a restart or a configuration change can set at it (capacity, cache)."""
    for driver in ranked:
        if driver.significant and driver.name in ("capacity", "prefix_cache") and driver.explains:
            driver.note = "; ".join(p for p in (driver.note, f"{context.label}: {context.note}") if p)


# ---------------------------------------------------------------------------- the sentence

def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + human.seconds(abs(seconds))


def _percent(driver: Driver) -> str:
    rel = driver.relative
    return "" if rel is None else f"{rel:+.0%} "


def value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "s":
        return human.seconds(value)
    if unit == "share":
        return f"{value:.0%}"
    return f"{value:.3g}" if unit in ("req/s", "requests") else f"{value:.0f}"


def phrase(d: Driver) -> str:
    """One driver as the sentence says it."""
    b, a = value_text(d.before, d.unit), value_text(d.after, d.unit)
    if d.name == "load":
        return f"request rate {_percent(d)}({b} → {a} req/s)"
    if d.name in ("prompt_length", "output_length"):
        what = "prompts" if d.name == "prompt_length" else "outputs"
        longer = "longer" if (d.change or 0) > 0 else "shorter"
        return f"{what} {abs(d.relative or 0):.0%} {longer} ({b} → {a} tokens)"
    if d.name == "prefix_cache":
        return f"prefix-cache hit rate {b} → {a}"
    if d.name == "capacity":
        return (f"capacity {a} running requests, down from at least {b}" if (d.change or 0) < 0
                else f"capacity {b} → {a} running requests")
    if d.name == "replicas":
        return f"replicas {b} → {a}" + (f" ({d.note})" if d.note else "")
    if d.name == "step_time":
        return f"decode steps {abs(d.relative or 0):.0%} {'slower' if (d.change or 0) > 0 else 'faster'} at the " \
               f"same batch size ({b} → {a})"
    if d.name == "batch_size":
        return f"running batch {b} → {a}"
    return d.note or d.label


def _headline(name: str, c: SignalChange) -> str:
    before, after = c.before, c.after
    if before is not None and after is not None and before.p99 is not None and after.p99 is not None:
        return (f"{NAMES[name]} p99 {human.quantile(before.p99, before.interval('p99'))} → "
                f"{human.quantile(after.p99, after.interval('p99'))}")
    return f"{NAMES[name]} mean {human.seconds(c.split.before)} → {human.seconds(c.split.after)}"


def _when(a: Attribution) -> str:
    if a.baseline_kind.startswith("event:"):
        return f"since {_clock(a.baseline[1])} UTC"
    inside = sorted(e.ts for e in a.events if a.window[0] <= e.ts <= a.window[1] and e.kind != "regime")
    if inside:
        return f"since {_clock(inside[0])} UTC"
    length = _duration(a.window[1] - a.window[0])
    if a.baseline_kind == "previous":
        return f"over the last {length} vs the {_duration(a.baseline[1] - a.baseline[0])} before"
    return f"over the last {length} vs the same {length} {_duration(a.window[1] - a.baseline[1])} earlier"


def _duration(seconds: float) -> str:
    """A window's length to the second (a one-shot watch's parts end at scrapes, not on the second)."""
    return format_duration(max(1, round(seconds)))


def _context_phrase(a: Attribution) -> str:
    said = [phrase(d) for d in a.drivers if d.name in ("restart", "config")]
    return "; ".join(said) if said else "no restart or config change"


def sentence(a: Attribution) -> str:
    """The one sentence the answer starts with (module docstring)."""
    gap = f"; data missing: {'; '.join(a.gaps)}" if a.gaps else ""
    if not a.signals:
        return f"No latency to compare {_when(a)}: one of the windows has none{gap}."
    if a.lead is None:
        shown = ", ".join(f"{_headline(n, c)}" for n, c in a.signals.items() if n != "e2e")
        return f"Nothing changed {_when(a)}: {shown}, within the baseline's noise; {_context_phrase(a)}{gap}."
    c = a.signals[a.lead]
    total = c.split.change
    parts = [p for p in c.split.components if p.change * total > 0]
    top = max(parts, key=lambda p: abs(p.change), default=None)
    split = f"{top.label} {_signed(top.change)} of {_signed(total)} (means)" if top is not None \
        and len(c.split.components) > 1 else f"mean {_signed(total)}"
    named = [d for d in a.drivers if d.explains.get(a.lead, 0.0) * total > 0]
    said = [phrase(d) for d in named[:2]]
    if named and named[0].name == "load":
        prompt = next((d for d in a.drivers if d.name == "prompt_length"), None)
        if prompt is None or not prompt.significant:
            said[0] += " with the same prompts"
    share = math.fsum(c.explained.values()) / total if total else 0.0
    if not said:
        said = ["not explained by load, workload, batch, capacity or replicas"]
    elif share < 0.5:
        said.append(f"{_signed(c.not_explained)} not explained")
    return f"{_headline(a.lead, c)} {_when(a)}: {split}; {', '.join(said)}; {_context_phrase(a)}{gap}."
