"""The component algebra: a latency signal's change as the exact sum of its components' changes.

Means add where quantiles do not, so every split is of window means (``increase(_sum) /
increase(_count)``):

* **TTFT** = queue + prefill (+ KV transfer) (+ front end) + the rest. Each part is its own
  histogram's mean; the rest (tokenization, the first step where the engine times it apart,
  and the requests one histogram counted and the other not yet) is TTFT less the parts, so the
  parts' changes add up to TTFT's change by construction. On a P/D decode worker the queue is
  the decode side's and "prefill" is its first step.
* **ITL** = a batch-size part + a step-time part (+ what the batch split does not cover). Each
  scrape interval gives the ITL of its decode steps next to its running batch. A line
  ``ITL = a + c x batch + d x [after]`` fitted to both windows' intervals (weighted by steps,
  one intercept per window) has, by its normal equations, each window's step-weighted ITL
  exactly on it: ITL' - ITL = c x (batch' - batch) + d. ``c`` is the slope *within* each
  window (how ITL grows with the batch under one condition, the decode floor plus the KV read
  per sequence), ``d`` the step time at the same batch; ``c`` is never negative (a step does not
  get faster with more sequences in it) and is 0 when the batch did not vary in either window
  (then the batch effect cannot be told from the step time and is not claimed).
* **End-to-end** = TTFT + decode (+ the rest), decode = (output tokens - 1) x time per token.
  A product's change is split symmetrically, exactly: x'y' - xy = (x' - x)(y + y')/2 +
  (y' - y)(x + x')/2, so neither factor is favoured by the order of the two windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from app.attribution.measures import Facts

#: TTFT's parts: (component, histogram, label, label on a P/D decode worker)
TTFT_PARTS = (("queue", "queue_time", "queue", "decode-side queue"),
              ("prefill", "prefill_time", "prefill", "first step"),
              ("transfer", "kv_transfer_time", "KV transfer", "KV transfer"),
              ("front_end", "render_time", "front end", "front end"))
#: the least spread of the running batch (requests, weighted by steps) within the windows for the
#: ITL-by-batch slope to be read from them
MIN_BATCH_SPREAD = 0.5


@dataclass(frozen=True, slots=True)
class Component:
    """One part of a signal's mean, before and after, and its share of the signal's change."""

    name: str
    label: str
    before: float | None
    after: float | None
    change: float
    share: float | None  # change / the signal's change (None when the signal did not change)

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "before": self.before, "after": self.after,
                "change": self.change, "share": self.share}


@dataclass(frozen=True, slots=True)
class Split:
    """A signal's mean before and after, and its change as the sum of its components' changes."""

    signal: str
    before: float
    after: float
    components: tuple[Component, ...]
    notes: tuple[str, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)  # numbers the drivers read (ITL: slope, batches)

    @property
    def change(self) -> float:
        return self.after - self.before

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)


def _share(change: float, total: float) -> float | None:
    return change / total if total != 0 else None


def _split(signal: str, before: float, after: float, parts: list[tuple[str, str, float | None, float | None]],
           rest_label: str, notes: list[str], extra: dict[str, float] | None = None) -> Split:
    """``parts`` (name, label, before, after) and the rest, which makes them add up to the signal."""
    total = after - before
    components = [Component(name, label, b, a, (a or 0.0) - (b or 0.0), _share((a or 0.0) - (b or 0.0), total))
                  for name, label, b, a in parts]
    rest_b = before - math.fsum(b or 0.0 for _, _, b, _ in parts)
    rest_a = after - math.fsum(a or 0.0 for _, _, _, a in parts)
    components.append(Component("rest", rest_label, rest_b, rest_a, rest_a - rest_b, _share(rest_a - rest_b, total)))
    return Split(signal, before, after, tuple(components), tuple(notes), extra or {})


def ttft_split(before: Facts, after: Facts) -> Split | None:
    """TTFT's change as queue + prefill (+ transfer, front end) + the rest; None without TTFT."""
    tb, ta = before.mean("ttft"), after.mean("ttft")
    if tb is None or ta is None:
        return None
    decode = after.decode_worker or before.decode_worker
    parts: list[tuple[str, str, float | None, float | None]] = []
    notes = []
    for name, histogram, label, decode_label in TTFT_PARTS:
        b, a = before.mean(histogram), after.mean(histogram)
        if b is not None and a is not None:
            parts.append((name, decode_label if decode else label, b, a))
        elif b is not None or a is not None:
            notes.append(f"{label} is timed in only one of the windows: it is in the rest")
    return _split("ttft", tb, ta, parts, "the rest (tokenization, scheduling, requests counted in one histogram only)",
                  notes)


def batch_fit(before: Facts, after: Facts) -> tuple[float, float, float, float, float] | None:
    """``(slope, batch before, batch after, ITL before, ITL after)`` over the scrape intervals of
    both windows (step-weighted means; see the module's docstring), None without intervals in both."""
    groups = []
    for facts in (before, after):
        rows = [(i.itl_count, i.itl_sum / i.itl_count, i.running) for i in facts.intervals if i.itl_count > 0]
        weight = math.fsum(w for w, _, _ in rows)
        if weight <= 0:
            return None
        x = math.fsum(w * r for w, _, r in rows) / weight
        y = math.fsum(i.itl_sum for i in facts.intervals if i.itl_count > 0) / weight
        groups.append((rows, weight, x, y))
    sxx = math.fsum(w * (r - x) ** 2 for rows, _, x, _ in groups for w, _, r in rows)
    sxy = math.fsum(w * (r - x) * (v - y) for rows, _, x, y in groups for w, v, r in rows)
    total = groups[0][1] + groups[1][1]
    slope = max(0.0, sxy / sxx) if sxx > 0 and math.sqrt(sxx / total) >= MIN_BATCH_SPREAD else 0.0
    return slope, groups[0][2], groups[1][2], groups[0][3], groups[1][3]


def itl_split(before: Facts, after: Facts) -> Split | None:
    """ITL's change as the batch-size part + the step time at the same batch (+ what the scrape
    intervals do not cover: the histogram's mean less the intervals'); None without an ITL histogram."""
    ib, ia = before.mean("itl"), after.mean("itl")
    if ib is None or ia is None:
        return None
    fit = batch_fit(before, after)
    if fit is None:
        return _split("itl", ib, ia, [], "not split by batch size (no ITL by scrape interval in both windows)", [])
    slope, xb, xa, yb, ya = fit
    total = ia - ib
    batch = slope * (xa - xb)
    step = (ya - yb) - batch
    rest_b, rest_a = ib - yb, ia - ya
    notes = () if slope > 0 else ("the running batch did not vary enough within the windows to read how ITL grows "
                                  "with it: no change is put on the batch size",)
    components = (Component("batch", "batch size", None, None, batch, _share(batch, total)),
                  Component("step_time", "step time at the same batch", None, None, step, _share(step, total)),
                  Component("rest", "not covered by the scrape intervals' batch split", rest_b, rest_a,
                            rest_a - rest_b, _share(rest_a - rest_b, total)))
    return Split("itl", ib, ia, components, notes,
                 {"slope": slope, "batch_before": xb, "batch_after": xa, "covered_before": yb, "covered_after": ya})


def tpot_split(before: Facts, after: Facts) -> Split | None:
    """Time per output token per request (engines without a per-step ITL, e.g. trtllm-serve): not split."""
    tb, ta = before.mean("tpot"), after.mean("tpot")
    if tb is None or ta is None:
        return None
    return _split("tpot", tb, ta, [], "per-request time per output token (no per-step ITL to split by batch)", [])


def product_split(xb: float, yb: float, xa: float, ya: float) -> tuple[float, float]:
    """``x'y' - xy`` as (the part of x's change, the part of y's change), symmetric and exact."""
    return (xa - xb) * (yb + ya) / 2.0, (ya - yb) * (xb + xa) / 2.0


def e2e_split(before: Facts, after: Facts) -> Split | None:
    """End-to-end's change as TTFT + decode (+ the rest); the decode part further as output length
    and time per token (``extra``: ``decode_length``, ``decode_per_token``)."""
    eb, ea = before.mean("e2e"), after.mean("e2e")
    if eb is None or ea is None:
        return None
    parts: list[tuple[str, str, float | None, float | None]] = []
    notes = []
    tb, ta = before.mean("ttft"), after.mean("ttft")
    if tb is not None and ta is not None:
        parts.append(("ttft", "TTFT", tb, ta))
    db, da = before.mean("decode_time"), after.mean("decode_time")
    if (db is None or da is None) and tb is not None and ta is not None:
        db, da = eb - tb, ea - ta
        notes.append("no decode-time histogram: decode is end-to-end less TTFT")
    extra: dict[str, float] = {}
    if db is not None and da is not None:
        parts.append(("decode", "decode", db, da))
        lb, la = before.output_mean, after.output_mean
        if lb is not None and la is not None and lb > 1 and la > 1:
            length, per_token = product_split(lb - 1, db / (lb - 1), la - 1, da / (la - 1))
            extra = {"decode_length": length, "decode_per_token": per_token,
                     "per_token_before": db / (lb - 1), "per_token_after": da / (la - 1)}
    return _split("e2e", eb, ea, parts, "the rest (requests counted in one histogram only)", notes, extra)


#: the signals :func:`splits` splits: facts with none of their means leave nothing to split
SPLIT_SIGNALS = ("ttft", "itl", "e2e", "tpot")


def splittable(facts: Facts) -> bool:
    """Whether ``facts`` can be one side of a split: :func:`splits` of facts with none of
    :data:`SPLIT_SIGNALS`' means is empty whatever the other side."""
    return any(facts.mean(signal) is not None for signal in SPLIT_SIGNALS)


def splits(before: Facts, after: Facts) -> dict[str, Split]:
    """Every signal that can be split, by name (ITL where there is one, else TPOT)."""
    out = {}
    for signal, fn in (("ttft", ttft_split), ("itl", itl_split), ("e2e", e2e_split)):
        split = fn(before, after)
        if split is not None:
            out[signal] = split
    if "itl" not in out:
        split = tpot_split(before, after)
        if split is not None:
            out["tpot"] = split
    return out
