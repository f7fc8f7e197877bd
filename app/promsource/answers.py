"""How a source's answers read: bucket bounds, the family tag its queries set, histograms.

The reader (:mod:`app.promsource.reader`) turns each answer's series into windows with these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core import quantiles
from app.core.quantiles import WindowHistogram
from app.promsource.queries import FAMILY_LABEL

#: Why a series of an answer was dropped (``llm_latency_source_bad_series_total{reason}``).
BAD_SERIES_REASONS = {
    "bad_bound": "a histogram bucket whose le label is not a number",
    "bad_count": "a count of scrapes or counter resets that is not a finite number >= 0",
    "bad_label": "a label the query sets itself that is not one it set",
}


def bound(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "+inf", "inf") else float(le)


def valid_le(le: str) -> bool:
    """A bucket's ``le`` (or the ``sum``/``count`` tag the query gives those series): a number, not NaN."""
    if le in ("sum", "count"):
        return True
    try:
        return not math.isnan(bound(le))
    except ValueError:
        return False


def family(labels: dict[str, str], families: int | None = None) -> int | None:
    """The candidate-family index the query tagged a series with; None when the label is not
    one it set (``families``: how many candidates the query had, when known)."""
    text = labels.get(FAMILY_LABEL, "0")
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        return None
    index = int(text)
    return index if families is None or index < families else None


def first_family(by_family: dict[int, Any]) -> Any:
    return by_family[min(by_family)]


def rescaled(buckets: dict[str, float], scale: float) -> dict[str, float]:
    """A histogram answer in another unit (SGLang's milliseconds) -> seconds: bounds and sum
    divided by ``scale`` (division, so 5 ms is the double nearest 0.005 s); counts unchanged."""
    if scale == 1.0:
        return buckets
    out = {}
    for le, value in buckets.items():
        if le == "sum":
            out[le] = value / scale
        elif le == "count" or bound(le) == math.inf:
            out[le] = value
        else:
            out[repr(bound(le) / scale)] = value
    return out


def histogram(buckets: dict[str, float], means_only: bool = False) -> WindowHistogram:
    """One answer's series of a target and model -> its window histogram (``means_only``: the
    query asked for ``_sum`` and ``_count`` alone)."""
    if means_only:
        return WindowHistogram((), (), buckets.get("sum", math.nan), buckets.get("count", math.nan), means_only=True)
    bounds = sorted((bound(le), v) for le, v in buckets.items() if le not in ("sum", "count"))
    count = buckets.get("count")
    if count is None:
        count = bounds[-1][1] if bounds and bounds[-1][0] == math.inf else math.nan
    return WindowHistogram(tuple(b for b, _ in bounds), tuple(v for _, v in bounds), buckets.get("sum", math.nan),
                           count)


@dataclass(frozen=True, slots=True)
class Around:
    """What a target's buckets around the thresholds tell (:meth:`app.promsource.reader.SourceReader._around`)."""

    above: bool  # one of its quantiles may be above its threshold
    histogram: WindowHistogram | None = None  # those buckets, where they tell every quantile exactly
    upward: bool = False  # its buckets L and U are the layout's and a quantile lies above U


def judge_around(h: WindowHistogram, total: float, limits: Sequence[tuple[float, float]],
                 around: list[tuple[float | None, float]]) -> Around:
    """:meth:`SourceReader._around` for one target: ``h`` holds its buckets ``L`` and ``U`` of each limit."""
    at = {bound: value for bound, value in zip(h.bounds, h.increases, strict=True)}
    if any((low is not None and low not in at) or up not in at for low, up in around):
        return Around(True)  # this target's layout differs: read its buckets
    above = False
    for (q, threshold), (low, up) in zip(limits, around, strict=True):
        rank = q * total
        if low is not None and at[low] >= rank:
            continue  # at or below L, at or below the threshold
        if up == math.inf:
            continue  # in +Inf: histogram_quantile gives L, at or below the threshold
        if at[up] < rank or low == up:
            return Around(True, upward=True)  # above U: its buckets from L up tell where
        above = above or quantiles.histogram_quantile(q, h.bounds, h.increases) > threshold
    return Around(above, h)


def judge_histogram(h: WindowHistogram | None, limits: Sequence[tuple[float, float]]) -> Around | None:
    """What one target's whole histogram tells: whether a quantile of ``limits`` lies above its
    threshold (``histogram_quantile``'s own answer); None without an observation in the window."""
    if h is None or not h.bounds or h.bounds[-1] != math.inf or not h.increases[-1] > 0:
        return None
    return Around(any(quantiles.histogram_quantile(q, h.bounds, h.increases) > threshold for q, threshold in limits), h)
