"""The drivers of a change, their noise, and how much of each component's change they explain
under the service's own models.

**Noise.** A driver is named only when its own change is larger than its noise. The baseline
window is read again as :data:`PARTS` equal sub-windows; a driver's value in each gives its
spread ``s`` at that resolution, so the noise of a whole window's value is ``s / sqrt(k)`` and
that of the difference of two windows ``s x sqrt(2 / k)`` (the current window assumed as noisy
as the baseline). A change is significant above :data:`SIGNIFICANCE` (3) times that and above
a floor (:data:`MIN_RELATIVE` of the value, or a driver's absolute floor), so a steady Poisson
load is not "a change". Without three sub-windows with data there is no estimate, and only a
change above :data:`NO_NOISE_RELATIVE` is named.

**Models** (each driver explains only what its model says it causes, in seconds of the mean):

* queue time grows with utilization, load over capacity: ``rho = rate x service time /
  (replicas x capacity per replica)``, so ``d ln rho`` is the sum of the drivers' log changes;
  the queue's change is shared among the drivers pushing it the same way, by their terms.
  Capacity (the running batch at which requests wait) is known only in a window that ends with
  requests waiting; a lower one after, while the engine ran more at once before, is a capacity
  change.
* prefill grows with the prompt tokens the engine computes, ``prompt x (1 - cache hit rate)``:
  the change this predicts (up to the measured change) is shared between prompt length and
  the cache by their log terms; a KV transfer grows with the prompt length.
* ITL grows with the batch (the batch part of :func:`app.attribution.algebra.itl_split`), and
  the batch by Little's law with ``rate x service time / replicas`` (or with the capacity when
  requests wait); the step time at the same batch is its own driver (a neighbour on the GPU,
  clocks, a slower kernel).
* end-to-end: its TTFT part as TTFT's; the decode part as output length and time per token,
  the latter shared as ITL's change is.

Service time (e2e less queue) is itself shared among what lengthened it: prefill (prompt and
cache), output length and the step time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.attribution.algebra import Split
from app.attribution.measures import Facts

#: sub-windows of the baseline the noise is estimated from
PARTS = 6
SIGNIFICANCE = 3.0
MIN_RELATIVE = 0.02
NO_NOISE_RELATIVE = 0.2
#: a latency signal "changed" when its mean moved by more than its noise and this share
SIGNAL_MIN_RELATIVE = 0.05


@dataclass(slots=True)
class Driver:
    """A candidate cause: its value before and after, its noise, and the seconds of each signal's
    mean change it explains (``explains``)."""

    name: str
    label: str
    unit: str
    before: float | None
    after: float | None
    noise: float | None = None
    significant: bool = False
    explains: dict[str, float] = field(default_factory=dict)
    note: str = ""
    at_least: str = ""  # "before" or "after": that value is a lower bound (the limit was not reached)

    @property
    def change(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def relative(self) -> float | None:
        change = self.change
        return None if change is None or not self.before else change / abs(self.before)

    def to_dict(self, totals: dict[str, float]) -> dict:
        return {"name": self.name, "label": self.label, "unit": self.unit, "before": self.before, "after": self.after,
                "change": self.change, "relative": self.relative, "noise": self.noise,
                "significant": self.significant, "at_least": self.at_least or None,
                "explains": dict(self.explains),
                "share": {s: v / totals[s] for s, v in self.explains.items() if totals.get(s)},
                "note": self.note}


#: the drivers measured in every window: label, unit, value, absolute floor of a named change
MEASURED: dict[str, tuple[str, str, Callable[[Facts], float | None], float]] = {
    "load": ("request rate", "req/s", lambda f: f.arrival_rate, 0.0),
    "prompt_length": ("prompt length", "tokens", lambda f: f.prompt_mean, 1.0),
    "output_length": ("output length", "tokens", lambda f: f.output_mean, 1.0),
    "prefix_cache": ("prefix-cache hit rate", "share", lambda f: f.hit_rate, 0.02),
    "batch_size": ("running batch", "requests", lambda f: f.running_mean, 0.5),
}


def noise(parts: Sequence[Facts], value: Callable[[Facts], float | None]) -> float | None:
    """One standard deviation of the difference of two whole windows' values, from the spread
    of ``value`` over the baseline's sub-windows (None with fewer than three)."""
    values = [v for v in (value(p) for p in parts) if v is not None and math.isfinite(v)]
    if len(values) < 3:
        return None
    mean = math.fsum(values) / len(values)
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return spread * math.sqrt(2.0 / len(values))


def significant(before: float | None, after: float | None, sd: float | None, floor: float = 0.0,
                min_relative: float = MIN_RELATIVE) -> bool:
    """The change is larger than its noise (and than the floors); see the module's docstring."""
    if before is None or after is None:
        return False
    change = abs(after - before)
    if change <= floor or change == 0:
        return False
    if sd is None:
        return change > NO_NOISE_RELATIVE * abs(before)
    return change > SIGNIFICANCE * sd and change > min_relative * abs(before)


def measured(before: Facts, after: Facts, parts: Sequence[Facts]) -> dict[str, Driver]:
    """The drivers every window measures, with their noise and significance."""
    out = {}
    for name, (label, unit, value, floor) in MEASURED.items():
        b, a = value(before), value(after)
        if b is None and a is None:
            continue
        sd = noise(parts, value)
        out[name] = Driver(name, label, unit, b, a, sd, significant(b, a, sd, floor))
    return out


def _batch_limit(f: Facts) -> float:
    """Where requests wait at the window's end, the batch then running is the limit (the window's
    maximum may hold a sample from before a restart); elsewhere the most that ran at once (a lower
    bound)."""
    return (f.running_last or 0.0) if f.saturated else (f.running_max or 0.0)


def capacity(before: Facts, after: Facts) -> Driver | None:
    """The running batch per replica at which requests wait, where a window shows it (module docstring)."""
    if before.running_max is None or after.running_max is None:
        return None
    cb = _batch_limit(before) / max(1, len(before.replicas))
    ca = _batch_limit(after) / max(1, len(after.replicas))
    driver = Driver("capacity", "capacity (running batch at which requests wait)", "requests", cb, ca)
    if after.saturated and not before.saturated:
        driver.at_least, driver.significant = "before", cb > ca + 0.5
        driver.note = f"requests wait at {ca:.3g} running now; {cb:.0f} ran at once before without a queue"
    elif before.saturated and not after.saturated:
        driver.at_least, driver.significant = "after", ca > cb + 0.5
    elif before.saturated and after.saturated:
        driver.significant = abs(ca - cb) > max(1.0, MIN_RELATIVE * cb)
    else:
        return None
    return driver


def replicas(before: Facts, after: Facts) -> Driver | None:
    """A service's replicas up (scraped) in each window (None for one engine)."""
    if not before.replicas and not after.replicas:
        return None
    gone, new = sorted(set(before.replicas) - set(after.replicas)), sorted(set(after.replicas) - set(before.replicas))
    note = "; ".join(part for part in (f"gone: {', '.join(gone)}" if gone else "",
                                       f"new: {', '.join(new)}" if new else "") if part)
    return Driver("replicas", "replicas up", "replicas", float(len(before.replicas)), float(len(after.replicas)),
                  0.0, len(before.replicas) != len(after.replicas), note=note)


def step_time(itl: Split | None, parts: Sequence[Facts]) -> Driver | None:
    """Decode step time at the baseline's batch size: the ITL after, moved to the baseline's batch
    along the fitted slope, against the ITL before (noise: the ITL's spread over the sub-windows)."""
    if itl is None or "slope" not in itl.extra:
        return None
    x = itl.extra
    before = x["covered_before"]
    after = x["covered_after"] - x["slope"] * (x["batch_after"] - x["batch_before"])
    sd = noise(parts, lambda f: f.mean("itl"))
    return Driver("step_time", "decode step time at the same batch size", "s", before, after, sd,
                  significant(before, after, sd),
                  note="a neighbour on the GPU, lower clocks or a slower kernel make every step slower")


def _log(after: float | None, before: float | None) -> float | None:
    if after is None or before is None or after <= 0 or before <= 0:
        return None
    return math.log(after / before)


def allocate(amount: float, terms: dict[str, float]) -> dict[str, float]:
    """``amount`` shared among the terms that push the same way as it, in proportion to them."""
    same = {k: t for k, t in terms.items() if t * amount > 0}
    total = math.fsum(same.values())
    return {k: amount * t / total for k, t in same.items()} if total else {}


def _add(into: dict[str, float], parts: dict[str, float], scale: float = 1.0) -> None:
    for k, v in parts.items():
        into[k] = into.get(k, 0.0) + v * scale


#: the most of the GPU's time prefills are taken to fill (a busier engine queues instead)
MAX_PREFILL_SHARE = 0.95


class Explainer:
    """The explained seconds of each signal's change, driver by driver (module docstring).

    ``prefill_per_token``: seconds of compute per uncached prompt token (the hardware profile's,
    :meth:`app.diagnosis.profile.HardwareProfile.prefill_seconds`); None: the baseline's own mean
    prefill over its mean uncached prompt."""

    def __init__(self, before: Facts, after: Facts, splits: dict[str, Split], drivers: dict[str, Driver],
                 prefill_per_token: float | None = None) -> None:
        self.b, self.a, self.splits, self.drivers = before, after, splits, drivers
        self.per_token = prefill_per_token
        if self.per_token is None and before.mean("prefill_time") and before.uncached_prompt:
            self.per_token = before.mean("prefill_time") / before.uncached_prompt  # type: ignore[operator]
        self.step_explained: dict[str, float] = {}

    def _named(self, name: str) -> bool:
        driver = self.drivers.get(name)
        return driver is not None and driver.significant

    def _term(self, name: str, after: float | None, before: float | None, sign: float = 1.0) -> dict[str, float]:
        value = _log(after, before)
        return {name: sign * value} if value is not None and self._named(name) else {}

    def _uncached_terms(self) -> dict[str, float]:
        """Log terms of the uncached prompt tokens per request: prompt length and cache misses."""
        terms = self._term("prompt_length", self.a.prompt_mean, self.b.prompt_mean)
        if self.b.hit_rate is not None and self.a.hit_rate is not None:
            terms.update(self._term("prefix_cache", 1.0 - self.a.hit_rate, 1.0 - self.b.hit_rate))
        return terms

    def prefill(self, change: float, prefill_before: float | None) -> dict[str, float]:
        """Prefill grows with the uncached prompt tokens: the predicted change, up to the measured one."""
        terms = self._uncached_terms()
        if not terms or not prefill_before:
            return {}
        predicted = prefill_before * (math.exp(math.fsum(terms.values())) - 1.0)
        if predicted * change <= 0:
            return {}
        return allocate(math.copysign(min(abs(predicted), abs(change)), change), terms)

    def _prefill_share(self, f: Facts) -> float | None:
        """The share of the GPU's time spent computing prefills: requests per second x uncached
        prompt tokens x compute per token."""
        if self.per_token is None or f.request_rate is None or f.uncached_prompt is None:
            return None
        return min(MAX_PREFILL_SHARE, f.request_rate * f.uncached_prompt * self.per_token)

    def step(self, change: float, step_before: float) -> dict[str, float]:
        """The step time at the same batch: prefills sharing the steps stretch each by
        ``1 / (1 - prefill share)``; what that predicts (up to the measured change) is the drivers'
        of the prefill tokens per second, the rest the step time's own (a neighbour, clocks)."""
        got: dict[str, float] = {}
        fb, fa = self._prefill_share(self.b), self._prefill_share(self.a)
        terms = {**self._term("load", self.a.request_rate, self.b.request_rate), **self._uncached_terms()}
        if fb is not None and fa is not None and terms and step_before > 0:
            predicted = step_before * ((1.0 - fb) / (1.0 - fa) - 1.0)
            if predicted * change > 0:
                got = allocate(math.copysign(min(abs(predicted), abs(change)), change), terms)
        rest = change - math.fsum(got.values())
        if self._named("step_time") and rest * change > 0:
            got["step_time"] = rest
        return got

    def service_causes(self) -> dict[str, float]:
        """What lengthened (or shortened) the time a request holds a slot, in seconds: its prefill,
        its output length and the step time (as the ITL's step part is explained)."""
        causes: dict[str, float] = {}
        ttft, e2e, itl = self.splits.get("ttft"), self.splits.get("e2e"), self.splits.get("itl")
        prefill = ttft.component("prefill") if ttft else None
        if prefill is not None:
            _add(causes, self.prefill(prefill.change, prefill.before))
        if e2e is not None and self._named("output_length"):
            causes["output_length"] = e2e.extra.get("decode_length", 0.0)
        per_token = e2e.extra.get("decode_per_token") if e2e is not None else None
        if per_token and itl is not None and itl.change:
            _add(causes, self.step_explained, per_token / itl.change)
        return causes

    def _load_terms(self, capacity_sign: float) -> dict[str, float]:
        """Log terms of the utilization (queue: capacity counts against it; batch: for it)."""
        terms = {**self._term("load", self.a.arrival_rate, self.b.arrival_rate),
                 **self._term("replicas", float(len(self.a.replicas)), float(len(self.b.replicas)), -1.0)}
        cap = self.drivers.get("capacity")
        if cap is not None and cap.significant:
            value = _log(cap.after, cap.before)
            if value is not None:
                terms["capacity"] = capacity_sign * value
        service = _log(self.a.service_time, self.b.service_time)
        if service is not None:
            _add(terms, allocate(service, self.service_causes()))
        return terms

    def explain(self) -> dict[str, dict[str, float]]:
        """Signal -> driver -> seconds of the signal's mean change; recorded on the drivers too."""
        out: dict[str, dict[str, float]] = {}
        itl = self.splits.get("itl")
        if itl is not None:  # first: the service time's causes read the step part's explanation
            got: dict[str, float] = {}
            step = itl.component("step_time")
            if step is not None and step.change:
                self.step_explained = self.step(step.change, itl.extra.get("covered_before", itl.before))
                _add(got, self.step_explained)
            batch = itl.component("batch")
            if batch is not None and batch.change:
                traced = allocate(batch.change, self._load_terms(1.0))
                if not traced and self._named("batch_size"):
                    traced = {"batch_size": batch.change}
                _add(got, traced)
            out["itl"] = got
        ttft = self.splits.get("ttft")
        if ttft is not None:
            got = {}
            queue, prefill, transfer = (ttft.component(n) for n in ("queue", "prefill", "transfer"))
            if queue is not None:
                _add(got, allocate(queue.change, self._load_terms(-1.0)))
            if prefill is not None:
                _add(got, self.prefill(prefill.change, prefill.before))
            if transfer is not None and transfer.before and "prompt_length" in self._term(
                    "prompt_length", self.a.prompt_mean, self.b.prompt_mean):
                predicted = transfer.before * ((self.a.prompt_mean or 0.0) / (self.b.prompt_mean or 1.0) - 1.0)
                if predicted * transfer.change > 0:
                    _add(got, {"prompt_length": math.copysign(min(abs(predicted), abs(transfer.change)),
                                                              transfer.change)})
            out["ttft"] = got
        e2e = self.splits.get("e2e")
        if e2e is not None:
            got = {}
            if e2e.component("ttft") is not None:
                _add(got, out.get("ttft", {}))
            if self._named("output_length") and "decode_length" in e2e.extra:
                got["output_length"] = got.get("output_length", 0.0) + e2e.extra["decode_length"]
            per_token = e2e.extra.get("decode_per_token")
            if per_token and itl is not None and itl.change:
                _add(got, {k: v for k, v in out.get("itl", {}).items() if v * itl.change > 0}, per_token / itl.change)
            out["e2e"] = got
        for signal, got in out.items():
            for name, seconds in got.items():
                if name in self.drivers:
                    self.drivers[name].explains[signal] = seconds
        return out
