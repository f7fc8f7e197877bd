"""Numbers as people read them: a quantile no more precise than its bucket, an estimate marked.

The JSON answers keep every number exactly as computed (plus its bucket interval and an
``estimate`` marker); the CLI, the status page and the alert annotations spell them with
these functions, so all three say the same thing:

* a quantile that lies in the lowest bucket is "< <bound>": ``histogram_quantile`` then
  interpolates between 0 and the bound, and "150 ms" for a queue histogram whose lowest
  bucket is 0.3 s would claim a precision the buckets do not have (the mean may be 0.5 ms);
* a quantile in the +Inf bucket is "> <largest finite bound>" (Prometheus answers that
  bound itself, whatever the observations were);
* a quantile whose interpolated value sits on an edge of its bucket (within
  :data:`EDGE_TOLERANCE` of the bucket's width) is the bucket, "10–15 s": the rank landed on
  (or next to) a bucket's cumulative count, e.g. the p50 of a window whose requests all lie in
  two buckets, or the p99 of one whose requests all lie in one bucket (99 % of its width), and
  "15.00 s" would read as a measurement;
* any other quantile is its interpolated value (its bucket is in the JSON and the page's
  tooltip);
* a count extrapolated like Prometheus' ``increase`` is "≈136", not "135.75441489463694";
* every other number is plain (:func:`number`): "10,912 tokens", "0.0005", never "1.09e+04".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

__all__ = ["seconds", "number", "bound", "quantile", "interval", "bounded", "count", "summary_quantile",
           "summary_bucket", "on_edge", "given", "span", "ESTIMATE_NOTE", "EDGE_TOLERANCE"]

#: An interpolated quantile this close to an edge of its bucket (a share of the bucket's width)
#: is shown as the bucket: the interpolation put it there, not the observations.
EDGE_TOLERANCE = 0.02

#: What ``≈`` in front of a count means, for tooltips and footnotes.
ESTIMATE_NOTE = ("estimate: the increase of the counter extrapolated to the window's edges, as Prometheus' "
                 "increase() does")


def seconds(value: float | None) -> str:
    """``17.7 ms``, ``15.00 s``; ``–`` for no value (the status page's and the evidence's spelling)."""
    if value is None or not math.isfinite(value):
        return "–"
    if abs(value) < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def number(value: float | None, unit: str = "", digits: int = 3) -> str:
    """A plain number, never in scientific notation: whole numbers from 1,000 up with thousands
    separators (``10,912``), smaller ones to ``digits`` significant digits (``3.5``, ``0.0123``);
    ``–`` for no value."""
    if value is None or not math.isfinite(value):
        return "–"
    rounded = float(f"{value:.{digits}g}")
    if abs(rounded) >= 1000:
        text = f"{value:,.0f}"
    else:
        text = format(Decimal(repr(rounded)).normalize(), "f")
        text = "0" if text in ("-0", "0") else text
    return f"{text} {unit}" if unit else text


def given(value: float | None, unit: str = "") -> str:
    """A number as it was given (a threshold, a bucket bound): :func:`number` to 6 significant
    digits, as ``:g`` would write it but never in scientific notation (``2,000``, ``0.125``)."""
    return number(value, unit, digits=6)


def _plain(value: float | None, unit: str) -> str:
    if unit == "s":
        return seconds(value)
    return number(value, unit)


def bound(value: float, unit: str = "s") -> str:
    """A bucket bound as written in the engine's histogram: ``0.3 s``, ``2,048 tokens``."""
    return given(value, unit)


def span(lower: float, upper: float, unit: str = "s") -> str:
    """A bucket as a range of values: ``10–15 s``, ``25–50 ms`` (below a second in milliseconds),
    ``2,048–4,096 tokens``."""
    if unit == "s" and upper < 1:
        return f"{number(lower * 1000)}–{number(upper * 1000)} ms"
    return f"{number(lower)}–{number(upper, unit)}"


def on_edge(value: float, lower: float, upper: float) -> bool:
    """Whether an interpolated ``value`` sits on an edge of its finite bucket ``(lower, upper]``."""
    slack = EDGE_TOLERANCE * (upper - lower)
    return value - lower <= slack or upper - value <= slack


def quantile(value: float | None, bucket: Sequence[float | None] | None, unit: str = "s") -> str:
    """A quantile for people: ``< 0.3 s`` in the lowest bucket, ``> 60 s`` in the +Inf
    bucket, the bucket ``10–15 s`` when the value sits on one of its edges, else the
    interpolated value (``unit`` "s" for seconds, "tokens", or "")."""
    if value is None or not math.isfinite(value):
        return "–"
    if bucket is not None and len(bucket) == 2:
        lower, upper = bucket
        if upper is None or (isinstance(upper, float) and math.isinf(upper)):
            return f"> {bound(float(lower if lower is not None else value), unit)}"
        if lower is not None and lower <= 0 < upper:
            return f"< {bound(float(upper), unit)}"
        if lower is not None and math.isfinite(lower) and on_edge(value, float(lower), float(upper)):
            return span(float(lower), float(upper), unit)
    return _plain(value, unit)


def interval(bucket: Sequence[float | None] | None, unit: str = "s") -> str:
    """The bucket itself: ``0 – 0.3 s``, ``2.5 s – +Inf``; empty without one."""
    if bucket is None or len(bucket) != 2:
        return ""
    lower, upper = bucket
    low = "-Inf" if lower is None or math.isinf(lower) else given(lower)
    high = "+Inf" if upper is None or math.isinf(upper) else given(upper)
    suffix = " s" if unit == "s" else (f" {unit}" if unit else "")
    return f"{low} – {high}{suffix}"


def count(value: float | None, estimate: bool = True) -> str:
    """``≈136`` for an extrapolated count, ``136`` for an exact one, ``–`` for none."""
    if value is None or not math.isfinite(value):
        return "–"
    text = f"{round(value):,}"
    return f"≈{text}" if estimate and value != 0 else text


def bounded(bucket: Sequence[float | None] | None, unit: str = "s") -> str:
    """A derived quantile known only as a bound: ``0.30 s – 1.20 s``, ``≥ 0.30 s`` when open above."""
    if bucket is None or len(bucket) != 2 or bucket[0] is None:
        return "–"
    lower, upper = float(bucket[0]), bucket[1]
    if upper is None or math.isinf(upper):
        return f"≥ {_plain(lower, unit)}"
    return f"{_plain(lower, unit)} – {_plain(float(upper), unit)}"


def field(summary: object, name: str) -> object:
    """A field of a summary given as an object (:class:`app.latency.WindowSummary`) or its JSON form."""
    if summary is None:
        return None
    if isinstance(summary, dict):
        return summary.get(name)
    return getattr(summary, name, None)


def summary_quantile(summary: object, key: str, unit: str = "s") -> str:
    """Quantile ``key`` of a summary (object or JSON) for people: with its bucket (:func:`quantile`),
    or, for a derived signal without quantiles, its bound (:func:`bounded`)."""
    value = field(summary, key)
    intervals = field(summary, "intervals") or {}
    assert isinstance(intervals, dict)
    if value is None:
        bounds = field(summary, "bounds") or {}
        assert isinstance(bounds, dict)
        return bounded(bounds.get(key), unit) if key in bounds else "–"
    assert isinstance(value, (int, float))
    return quantile(float(value), intervals.get(key), unit)


def summary_bucket(summary: object, key: str, unit: str = "s") -> str:
    """A tooltip for quantile ``key``: which bucket holds it, or how a derived bound was made."""
    intervals = field(summary, "intervals") or {}
    assert isinstance(intervals, dict)
    if key in intervals:
        lower, upper = intervals[key]
        value = field(summary, key)
        if (isinstance(value, (int, float)) and lower is not None and upper is not None and 0 < lower
                and math.isfinite(upper) and on_edge(float(value), lower, upper)):
            return (f"the interpolated value {_plain(float(value), unit)} sits on the edge of the bucket "
                    f"{interval(intervals[key], unit)}: the histogram says only that it lies in that bucket")
        return f"interpolated inside the bucket {interval(intervals[key], unit)}"
    bounds = field(summary, "bounds") or {}
    assert isinstance(bounds, dict)
    if key in bounds:
        return f"derived: the true {key} lies in {bounded(bounds[key], unit)} (quantiles do not add)"
    return ""
