"""Histogram math that answers exactly what Prometheus 2.42 answers.

The product promise is "p50/p90/p95/p99 of TTFT over the last N minutes, the same
number Prometheus/Grafana would show". Users compare against Debian's Prometheus
2.42.0, so every rule below mirrors that release's Go code operation by operation
(same float64 operations in the same order), not a "nicer" re-derivation:

* ``increase``/``rate`` mirror ``extrapolatedRate`` in ``promql/functions.go``
  (``funcIncrease`` = ``extrapolatedRate(isCounter=true, isRate=false)``,
  ``funcRate`` = ``extrapolatedRate(isCounter=true, isRate=true)``).
* ``histogram_quantile`` mirrors ``bucketQuantile`` + ``coalesceBuckets`` +
  ``ensureMonotonic`` in ``promql/quantile.go`` of the 2.4x line *before* later
  changes (2.48+ added a 1e-12 relative "small delta" tolerance to the
  monotonicity fix, 3.x reworked NaN/annotation handling). 2.42 has the plain
  envelope fix and nothing else.
* Which samples a range selector ``x[w]`` evaluated at ``t`` sees: the CLOSED
  interval ``[t - w, t]`` (``matrixIterSlice`` in ``promql/engine.go`` of 2.x keeps
  buffered samples with ``t >= mint`` and the sought sample when ``t == maxt``;
  Prometheus 3.0 made the left end open). See :func:`select_range`.
  ``tests/test_quantiles_prometheus.py`` confirms this against the real binary
  with eval times whose window start and end fall exactly on scrape timestamps.

Timestamps: Prometheus stores integer milliseconds and does all duration math as
``float64(ms_a - ms_b) / 1000``. Every function here therefore converts its
float-second timestamps (samples and range edges) to integer milliseconds with
:func:`to_millis` (round to nearest, so ``1700000000.123`` that is really
``...0.12299999`` in binary maps to the right millisecond) and then computes
exactly like Go. Inputs that already are millisecond-precise (everything
Prometheus or our scraper stores) give bit-identical results.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Point",
    "HistogramSnapshot",
    "WindowHistogram",
    "LatencySummary",
    "QUANTILES",
    "to_millis",
    "select_range",
    "increase",
    "counter_over",
    "divide",
    "extrapolate",
    "rate",
    "window_histogram",
    "merge",
    "histogram_quantile",
    "histogram_quantiles",
    "histogram_quantile_interval",
    "bucket_quantile",
    "bucket_quantiles",
    "summarize",
]

Point = tuple[float, float]  # (unix seconds, value)

#: The quantiles :func:`summarize` reports, in field order of :class:`LatencySummary`.
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))


# --------------------------------------------------------------------------- helpers


def to_millis(t: float) -> int:
    """Unix seconds -> integer milliseconds, the resolution Prometheus stores.

    Rounds to the nearest millisecond: a float like ``1700000000.123`` is stored in
    binary as ``1700000000.1229999...`` and must still map to ``...123``.
    """
    return int(round(float(t) * 1000.0))


def _go_div(a: float, b: float) -> float:
    """``a / b`` with Go float64 semantics (x/0 = ±Inf, 0/0 = NaN, no exception).

    Needed where Go silently divides by zero, e.g. ``histogram_quantile(0, h)`` when
    the lowest bucket is empty computes ``0/0`` and Prometheus answers NaN.
    """
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def divide(a: float, b: float) -> float:
    """PromQL's ``a / b`` between two samples: Go's float division (a zero divisor gives NaN or an
    infinity, never an error)."""
    return _go_div(a, b)


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """``kahanSumInc`` of promql/functions.go (2.42): Neumaier's compensated addition."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def sum_over_time(values: Sequence[float]) -> float:
    """``sum_over_time`` of one series' samples (``funcSumOverTime``, 2.42: compensated)."""
    total = c = 0.0
    for v in values:
        total, c = _kahan_inc(v, total, c)
    return total if math.isinf(total) else total + c


def avg_over_time(values: Sequence[float]) -> float:
    """``avg_over_time`` of one series' samples (``funcAvgOverTime``, 2.42: an incremental,
    compensated mean that keeps an infinite mean once reached)."""
    mean = count = c = 0.0
    for v in values:
        count += 1
        if math.isinf(mean) and ((math.isinf(v) and (mean > 0) == (v > 0)) or (not math.isinf(v) and v == v)):
            continue
        mean, c = _kahan_inc(v / count - mean / count, mean, c)
    return mean if math.isinf(mean) else mean + c


def sum_of(values: Sequence[float]) -> float:
    """``sum`` over the series of a group, in their order (the aggregation, 2.42: plain ``+=``)."""
    total = values[0]
    for v in values[1:]:
        total += v
    return total


def avg_of(values: Sequence[float]) -> float:
    """``avg`` over the series of a group, in their order (the aggregation, 2.42: an
    incremental mean, each side divided by the count, an infinite mean kept)."""
    mean = values[0]
    for count, v in enumerate(values[1:], start=2):
        if math.isinf(mean) and ((math.isinf(v) and (mean > 0) == (v > 0)) or (not math.isinf(v) and v == v)):
            continue
        mean += v / count - mean / count
    return mean


def _go_sort_search(n: int, pred: Callable[[int], bool]) -> int:
    """Go's ``sort.Search``: smallest i in [0, n) with pred(i) true, else n.

    Implemented as the same binary search (not a linear scan) so that inputs for
    which the predicate is not monotone (NaN counts) land where Go's lands.
    """
    i, j = 0, n
    while i < j:
        h = (i + j) >> 1
        if not pred(h):
            i = h + 1
        else:
            j = h
    return i


def _go_duration_seconds(ms: int) -> float:
    """``time.Duration.Seconds()`` of a duration of ``ms`` milliseconds.

    Go computes ``float64(d / Second) + float64(d % Second) / 1e9``; for a range
    like 1.123s that can differ by one ulp from ``1123 / 1000``, so mirror it.
    """
    ns = abs(ms) * 1_000_000
    sign = -1 if ms < 0 else 1  # Go's / and % truncate toward zero
    sec, nsec = sign * (ns // 1_000_000_000), sign * (ns % 1_000_000_000)
    return float(sec) + float(nsec) / 1e9


def _select_ms(
    items: Iterable[tuple[float, object]], start_ms: int, end_ms: int
) -> list[tuple[int, object]]:
    """Items with integer-ms timestamp in the closed window, sorted, first wins on ties.

    Prometheus' TSDB cannot hold two samples of one series at the same millisecond
    (a later append with the same timestamp is rejected as a duplicate), so the
    first one given is kept.
    """
    keyed = sorted(((to_millis(t), i, v) for i, (t, v) in enumerate(items)), key=lambda x: (x[0], x[1]))
    out: list[tuple[int, object]] = []
    last = None
    for ms, _, v in keyed:
        if ms < start_ms or ms > end_ms or ms == last:
            continue
        out.append((ms, v))
        last = ms
    return out


def select_range(points: Iterable[Point], range_start: float, range_end: float) -> list[Point]:
    """The samples a Prometheus 2.x range selector sees: closed window ``[start, end]``.

    ``x[w]`` evaluated at ``t`` selects samples with ``t - w <= ts <= t`` (both ends
    inclusive in 2.x: ``matrixIterSlice`` in ``promql/engine.go`` keeps buffered
    samples with ``t >= mint`` plus the sought sample when ``t == maxt``). Comparison
    is done on integer milliseconds (see :func:`to_millis`). Result is sorted by time,
    timestamps normalised to whole milliseconds; of two samples in the same
    millisecond the first given is kept.

    Use this when loading snapshots from SQL for a window; :func:`increase`,
    :func:`rate` and :func:`window_histogram` apply it themselves as well.
    """
    start_ms, end_ms = to_millis(range_start), to_millis(range_end)
    return [(ms / 1000.0, float(v)) for ms, v in _select_ms(points, start_ms, end_ms)]  # type: ignore[arg-type]


def _extrapolated_rate(
    ts_ms: Sequence[int],
    values: Sequence[float],
    start_ms: int,
    end_ms: int,
    *,
    is_counter: bool,
    is_rate: bool,
) -> float | None:
    """Float-sample branch of ``extrapolatedRate`` (promql/functions.go, 2.42).

    ``ts_ms``/``values`` are the selected samples (sorted, unique timestamps).
    Returns None where Prometheus emits no sample (fewer than two points).

    Rules, in Go's order:

    1. ``result = last - first``. For counters, walk the samples and whenever a value
       is lower than its predecessor (a counter reset, e.g. an engine restart) add
       the predecessor's value: the counter is assumed to have restarted from 0, so
       the increase across the reset is the new value and nothing is lost or
       negative. (Hence a window spanning a restart never yields negative or huge
       values.) The sum of all increments is >= 0 for non-negative counters.
    2. ``durationToStart = (first_ts - rangeStart)/1000``,
       ``durationToEnd = (rangeEnd - last_ts)/1000``,
       ``sampledInterval = (last_ts - first_ts)/1000``,
       ``averageDurationBetweenSamples = sampledInterval / (n-1)``.
    3. Counters only, if ``result > 0`` and ``first >= 0``: the counter cannot have
       been below zero, so ``durationToZero = sampledInterval * (first/result)``
       caps ``durationToStart`` (no extrapolation to negative counts).
    4. ``threshold = average * 1.1``. Each side is extrapolated to the range edge if
       its gap is below the threshold, otherwise by only ``average/2`` (the series
       probably started/ended inside the range).
    5. ``factor = extrapolateToInterval / sampledInterval``; rate additionally
       divides the factor by the range in seconds; ``result * factor``.
    """
    n = len(ts_ms)
    if n < 2:
        return None
    first_v = values[0]
    result = reset_corrected(values) if is_counter else values[-1] - first_v
    return extrapolate(result, first_v, ts_ms[0], ts_ms[-1], n, start_ms, end_ms, is_counter=is_counter,
                       is_rate=is_rate)


def reset_corrected(values: Sequence[float]) -> float:
    """Rule 1 of :func:`_extrapolated_rate` for a counter: ``last - first``, plus the value
    before each reset (a value lower than its predecessor), added in time order."""
    result = values[-1] - values[0]
    prev = values[0]
    for v in values[1:]:
        if v < prev:
            result += prev
        prev = v
    return result


def extrapolate(result: float, first_v: float, first_ms: int, last_ms: int, n: int, start_ms: int, end_ms: int,
                *, is_counter: bool, is_rate: bool) -> float:
    """Rules 2-5 of :func:`_extrapolated_rate` from what they read of the samples: the
    reset-corrected ``result`` (rule 1), the first value, the first and last timestamps and
    the number of samples. A downsampled level (:mod:`app.store.levels`) keeps exactly
    these per interval, which is why its windows give the same number as the raw samples."""
    return extrapolate_all((result,), (first_v,), first_ms, last_ms, n, start_ms, end_ms, is_counter=is_counter,
                           is_rate=is_rate)[0]


def extrapolate_all(results: Sequence[float], firsts: Sequence[float], first_ms: int, last_ms: int, n: int,
                    start_ms: int, end_ms: int, *, is_counter: bool, is_rate: bool) -> list[float]:
    """:func:`extrapolate` of several series sampled at the same instants (a histogram's
    buckets, ``_sum`` and ``_count``): what depends only on the timestamps is computed once,
    and only a component whose extrapolation to zero moves its start (rule 3) gets a factor
    of its own. Every value is the same float the one-at-a-time arithmetic gives; computed
    per bucket it would be a sixth of the summary round (1,000 targets, 25 components each)."""
    duration_to_start = float(first_ms - start_ms) / 1000
    duration_to_end = float(end_ms - last_ms) / 1000
    sampled_interval = float(last_ms - first_ms) / 1000
    average_between = _go_div(sampled_interval, float(n - 1))
    threshold = average_between * 1.1
    to_end = duration_to_end if duration_to_end < threshold else average_between / 2
    window = _go_duration_seconds(end_ms - start_ms) if is_rate else 0.0

    def factor(to_start: float) -> float:
        extrapolate_to = sampled_interval
        extrapolate_to += to_start if to_start < threshold else average_between / 2
        extrapolate_to += to_end
        f = _go_div(extrapolate_to, sampled_interval)
        return _go_div(f, window) if is_rate else f

    common = factor(duration_to_start)
    out = []
    for result, first_v in zip(results, firsts, strict=True):
        if is_counter and result > 0 and first_v >= 0:
            duration_to_zero = sampled_interval * (first_v / result)
            if duration_to_zero < duration_to_start:
                out.append(result * factor(duration_to_zero))
                continue
        out.append(result * common)
    return out


def _counter_over_range(
    points: Sequence[Point], range_start: float, range_end: float, *, is_rate: bool
) -> float | None:
    start_ms, end_ms = to_millis(range_start), to_millis(range_end)
    sel = _select_ms(points, start_ms, end_ms)
    return _extrapolated_rate(
        [ms for ms, _ in sel],
        [float(v) for _, v in sel],  # type: ignore[arg-type]
        start_ms,
        end_ms,
        is_counter=True,
        is_rate=is_rate,
    )


# --------------------------------------------------------------------------- counters


def increase(points: Sequence[Point], range_start: float, range_end: float) -> float | None:
    """Prometheus ``increase(x[w])`` evaluated at ``range_end`` with ``w = range_end - range_start``.

    = ``extrapolatedRate(isCounter=True, isRate=False)`` of promql/functions.go
    (2.42); the exact rules are listed in :func:`_extrapolated_rate`. ``points`` are
    the samples of one counter series sorted by time; only those inside the closed
    window ``[range_start, range_end]`` are used (:func:`select_range`), so passing
    the already-selected samples is fine too.

    Counter resets (engine restart: the value drops, typically to ~0) are handled as
    Prometheus does: a drop adds the previous value, i.e. the counter is taken to
    have restarted from zero. The result is never negative for non-negative
    counters, and a restart never produces a huge value.

    Returns None when fewer than two samples are in the window (Prometheus then
    returns no result for the series).
    """
    return _counter_over_range(points, range_start, range_end, is_rate=False)


def counter_over(ts_ms: Sequence[int], values: Sequence[float], start_ms: int, end_ms: int, *,
                 is_rate: bool = False) -> float | None:
    """:func:`increase` (``is_rate``: :func:`rate`) of one series' samples already selected for
    ``[start_ms, end_ms]``: sorted, unique integer-millisecond timestamps."""
    return _extrapolated_rate(ts_ms, values, start_ms, end_ms, is_counter=True, is_rate=is_rate)


def rate(points: Sequence[Point], range_start: float, range_end: float) -> float | None:
    """Prometheus ``rate(x[w])``: :func:`increase` divided by the range in seconds.

    = ``extrapolatedRate(isCounter=True, isRate=True)``; Go divides the
    extrapolation factor (not the result) by ``Range.Seconds()``, mirrored here.
    None when fewer than two samples are in the window.
    """
    return _counter_over_range(points, range_start, range_end, is_rate=True)


# --------------------------------------------------------------------------- histograms


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """One scrape of one classic histogram series (cumulative, as exposed)."""

    ts: float  # unix seconds of the scrape
    counts: tuple[float, ...]  # cumulative bucket counts aligned with the series' bounds
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class WindowHistogram:
    """What ``increase(x_bucket[w])`` (plus ``_sum``/``_count``) gives for one series,
    or ``sum by (le)`` of several (see :func:`merge`)."""

    bounds: tuple[float, ...]  # ascending upper bounds; last is math.inf when the series has +Inf
    increases: tuple[float, ...]  # per-bucket (cumulative) increase, extrapolated per bucket series
    sum: float  # increase of _sum
    count: float  # increase of _count
    #: only ``_sum`` and ``_count`` were read (a source's means-first read): no buckets, so no
    #: quantile; the mean and the count are exact all the same
    means_only: bool = False


def window_histogram(
    bounds: Sequence[float],
    snapshots: Sequence[HistogramSnapshot],
    range_start: float,
    range_end: float,
) -> WindowHistogram | None:
    """``increase(x_bucket[w])``, ``increase(x_sum[w])``, ``increase(x_count[w])`` at ``range_end``.

    Prometheus has no notion of "a histogram" here: every ``le`` bucket, ``_sum`` and
    ``_count`` is its own counter series, and ``increase`` extrapolates each one
    independently (the zero-point cap of rule 3 in :func:`_extrapolated_rate`
    depends on each series' own values). The resulting per-bucket increases can
    therefore be slightly non-monotonic across buckets; :func:`histogram_quantile`
    repairs that exactly as Prometheus does. Each series also detects its own
    counter resets.

    Snapshots outside the closed window ``[range_start, range_end]`` are ignored.
    Returns None when fewer than two snapshots are in the window (Prometheus returns
    no samples, hence no quantile). Raises ValueError when a snapshot's ``counts`` is
    not aligned with ``bounds``.
    """
    bounds_t = tuple(float(b) for b in bounds)
    nb = len(bounds_t)
    for s in snapshots:
        if len(s.counts) != nb:
            raise ValueError(
                f"snapshot at {s.ts} has {len(s.counts)} bucket counts, expected {nb} (bounds {bounds_t})"
            )
    start_ms, end_ms = to_millis(range_start), to_millis(range_end)
    sel = _select_ms(((s.ts, s) for s in snapshots), start_ms, end_ms)
    if len(sel) < 2:
        return None
    ts_ms = [ms for ms, _ in sel]
    snaps: list[HistogramSnapshot] = [s for _, s in sel]  # type: ignore[misc]

    def inc(values: list[float]) -> float:
        r = _extrapolated_rate(ts_ms, values, start_ms, end_ms, is_counter=True, is_rate=False)
        assert r is not None  # len(sel) >= 2
        return r

    increases = tuple(inc([float(s.counts[i]) for s in snaps]) for i in range(nb))
    return WindowHistogram(
        bounds=bounds_t,
        increases=increases,
        sum=inc([float(s.sum) for s in snaps]),
        count=inc([float(s.count) for s in snaps]),
    )


def _add(acc: float | None, v: float) -> float:
    # Go's sum aggregation starts the group with the first value, then "+=".
    return v if acc is None else acc + v


def merge(histograms: Iterable[WindowHistogram | None]) -> WindowHistogram | None:
    """``sum by (le) (...)`` over several series' window histograms.

    Buckets are matched by numeric upper bound and the result carries the union of
    all bounds (ascending). A bound present in only some series gets only those
    series' contributions -- exactly what ``sum by (le)`` does; the resulting
    cumulative counts may then be non-monotonic and :func:`histogram_quantile`
    applies Prometheus' monotonicity fix. ``sum`` and ``count`` are added.
    Values are accumulated in input order like Go's aggregation (first value, then
    ``+=``); Prometheus sums in label-set order, so pass series in that order for
    bit-identical results. ``None`` entries (series without a result in the window)
    are skipped; returns None when nothing is left.
    """
    present = [h for h in histograms if h is not None]
    if not present:
        return None
    if any(h.means_only for h in present):
        # the buckets of some members alone would misstate the whole's distribution: keep the
        # sum and count, which add exactly
        return WindowHistogram((), (), _total(h.sum for h in present),
                               _total(h.count for h in present), means_only=True)
    first = present[0]
    if all(h.bounds == first.bounds for h in present) and all(map(operator.lt, first.bounds, first.bounds[1:])):
        # Same ascending layout everywhere (the usual case): bucket by bucket, in input order,
        # the same additions as below without a dict per merge.
        increases, total, n = list(first.increases), first.sum, first.count
        for h in present[1:]:
            increases = [a + b for a, b in zip(increases, h.increases, strict=True)]
            total, n = total + h.sum, n + h.count
        return WindowHistogram(first.bounds, tuple(increases), total, n)
    by_bound: dict[float, float | None] = {}
    total_sum: float | None = None
    total_count: float | None = None
    seen = False
    for h in present:
        seen = True
        for b, v in zip(h.bounds, h.increases, strict=True):
            by_bound[b] = _add(by_bound.get(b), v)
        total_sum = _add(total_sum, h.sum)
        total_count = _add(total_count, h.count)
    if not seen:
        return None
    bounds = tuple(sorted(by_bound))
    return WindowHistogram(
        bounds=bounds,
        increases=tuple(by_bound[b] for b in bounds),  # type: ignore[misc]
        sum=total_sum if total_sum is not None else 0.0,
        count=total_count if total_count is not None else 0.0,
    )


def _total(values: Iterable[float]) -> float:
    """Values added in input order, like Go's aggregation (first value, then ``+=``)."""
    total: float | None = None
    for v in values:
        total = v if total is None else total + v
    return 0.0 if total is None else total


def _coalesce(buckets: list[list[float]]) -> list[list[float]]:
    """``coalesceBuckets``: merge adjacent (sorted) buckets with the same upper bound
    by adding their counts (e.g. ``le="1"`` and ``le="1.0"`` from different series)."""
    out: list[list[float]] = []
    last = list(buckets[0])
    for b in buckets[1:]:
        if b[0] == last[0]:
            last[1] += b[1]
        else:
            out.append(last)
            last = list(b)
    out.append(last)
    return out


def _ensure_monotonic(buckets: list[list[float]]) -> bool:
    """``ensureMonotonic`` of 2.42: replace each count by the running maximum.

    Cumulative counts must not decrease with the bound, but per-bucket
    extrapolation, ``sum by (le)`` over series with different layouts, or
    non-atomic ingestion can make them do so. 2.42 takes the "envelope": any count
    lower than the maximum seen so far (from the lowest bucket up, including the
    +Inf bucket) is raised to that maximum. There is NO tolerance for tiny float
    differences in 2.42 (that 1e-12 "small delta" rule came in later releases).
    NaN counts compare false both ways and are left as they are, as in Go.
    Returns whether anything was changed.
    """
    forced = False
    mx = buckets[0][1]
    for i in range(1, len(buckets)):
        c = buckets[i][1]
        if c > mx:
            mx = c
        elif c < mx:
            buckets[i][1] = mx
            forced = True
    return forced


def histogram_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """``histogram_quantile(q, ...)`` for one classic histogram: ``bucketQuantile`` of
    promql/quantile.go (2.42), rule for rule:

    1. ``q`` NaN -> NaN; ``q < 0`` -> -Inf; ``q > 1`` -> +Inf (before anything else).
    2. Buckets are sorted by upper bound. If the highest bound is not +Inf -> NaN.
       (No buckets at all: Prometheus emits no sample; we return NaN.)
    3. Buckets with equal bounds are coalesced (counts added), then the
       monotonicity fix of :func:`_ensure_monotonic` is applied.
    4. Fewer than 2 buckets -> NaN. Zero observations (count of the +Inf bucket)
       -> NaN.
    5. ``rank = q * observations``; ``b`` = first bucket (excluding +Inf, found with
       Go's binary ``sort.Search``) whose count >= rank.
    6. If that is the +Inf bucket (rank beyond every finite bucket) the answer is
       the upper bound of the second-highest bucket, i.e. the largest finite bound
       -- never an extrapolated value.
    7. If it is the lowest bucket and its bound is <= 0, that bound is returned.
    8. Otherwise linear interpolation inside the bucket; the lowest bucket
       interpolates from 0 (its implicit lower bound):
       ``start + (end - start) * ((rank - count_below) / (count_b - count_below))``.
       Go's division semantics are kept: q=0 with an empty lowest bucket is 0/0 =
       NaN in Prometheus and here.
    """
    return bucket_quantiles((q,), bounds, cumulative)[0][0]


def histogram_quantiles(qs: Sequence[float], bounds: Sequence[float], cumulative: Sequence[float]) -> list[float]:
    """:func:`histogram_quantile` for several ``qs`` of one histogram (see :func:`bucket_quantiles`)."""
    return [value for value, _ in bucket_quantiles(qs, bounds, cumulative)]


def histogram_quantile_interval(q: float, bounds: Sequence[float],
                                cumulative: Sequence[float]) -> tuple[float, float] | None:
    """The bucket that holds ``histogram_quantile(q, ...)``: ``(lower, upper)`` bounds.

    The interpolated value is one point of this interval; the histogram knows no more than
    "the q-quantile of the observations is somewhere in here". Found by the very steps of
    :func:`histogram_quantile` (:func:`bucket_quantile`), so the two always agree. The
    lowest bucket's lower end is 0 (Prometheus' implicit lower bound; ``-inf`` when its upper
    bound is <= 0); a quantile in the +Inf bucket is ``(largest finite bound, inf)``. None
    where the quantile is NaN or ``q`` is outside [0, 1].
    """
    return bucket_quantiles((q,), bounds, cumulative)[0][1]


def bucket_quantile(q: float, bounds: Sequence[float],
                    cumulative: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """:func:`histogram_quantile` and :func:`histogram_quantile_interval` in one pass."""
    return bucket_quantiles((q,), bounds, cumulative)[0]


def bucket_quantiles(qs: Sequence[float], bounds: Sequence[float],
                     cumulative: Sequence[float]) -> list[tuple[float, tuple[float, float] | None]]:
    """:func:`bucket_quantile` for several ``qs`` of one histogram: the buckets are sorted,
    coalesced and made monotonic once (a diagnosis round asks four quantiles of every
    histogram of every target), then each ``q`` is answered by the same rules 1 and 4-8."""
    if len(bounds) != len(cumulative):
        raise ValueError(f"{len(bounds)} bounds but {len(cumulative)} counts")
    buckets = [[float(b), float(c)] for b, c in zip(bounds, cumulative)]
    if not all(map(operator.lt, bounds, bounds[1:])):  # not already strictly ascending
        buckets.sort(key=lambda x: x[0])
    prepared: list[list[float]] | None = None
    if buckets and math.isinf(buckets[-1][0]) and buckets[-1][0] > 0:
        prepared = _coalesce(buckets)
        _ensure_monotonic(prepared)
    return [_bucket_quantile(float(q), prepared) for q in qs]


def _bucket_quantile(q: float, buckets: list[list[float]] | None) -> tuple[float, tuple[float, float] | None]:
    """One quantile of buckets already sorted, coalesced and monotonic (None: no +Inf bucket),
    with the bucket that holds it."""
    if math.isnan(q):
        return math.nan, None
    if q < 0:
        return -math.inf, None
    if q > 1:
        return math.inf, None
    if buckets is None or len(buckets) < 2:
        return math.nan, None
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan, None
    rank = q * observations
    b = _go_sort_search(len(buckets) - 1, lambda i: buckets[i][1] >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0], (buckets[-2][0], math.inf)
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0], (-math.inf, buckets[0][0])
    bucket_start = 0.0
    bucket_end = buckets[b][0]
    count = buckets[b][1]
    if b > 0:
        bucket_start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    value = bucket_start + (bucket_end - bucket_start) * _go_div(rank, count)
    return value, (None if math.isnan(value) else (bucket_start, bucket_end))


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """JSON-friendly quantiles of a window: NaN/±Inf become None.

    ``intervals`` holds, per quantile with a value, the bucket ``(lower, upper)`` that
    contains it (:func:`histogram_quantile_interval`; ``upper`` is ``inf`` for the +Inf
    bucket): the interpolated value is a point in it, not a measurement. ``count_estimate``
    is True when ``count`` is an ``increase()`` extrapolated to the window's edges (so not
    a whole number of requests).
    """

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    count: float
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    count_estimate: bool = False

    def interval(self, key: str) -> tuple[float, float] | None:
        """The bucket holding quantile ``key`` (``"p99"``), None without a value."""
        return self.intervals.get(key)


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def summarize(h: WindowHistogram | None) -> LatencySummary:
    """p50/p90/p95/p99 via :func:`histogram_quantile`, ``mean = sum/count``.

    Any NaN or infinite value (no data, no observations in the window, a series
    without +Inf bucket, ...) becomes None so the result serialises to JSON.
    ``mean`` is None unless ``count > 0``. ``count`` is the (extrapolated) increase
    of ``_count``, 0.0 when there is no window histogram. Each quantile carries the
    bucket that holds it (``intervals``), from the same computation.
    """
    if h is None:
        return LatencySummary(None, None, None, None, None, 0.0)
    mean = _finite_or_none(h.sum / h.count) if h.count > 0 else None
    if not h.bounds:  # means only (or no bucket): no quantile, as bucket_quantiles would say
        return LatencySummary(None, None, None, None, mean, h.count, count_estimate=h.count != 0)
    qs: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float]] = {}
    answers = bucket_quantiles([q for _, q in QUANTILES], h.bounds, h.increases)
    for (name, _), (value, interval) in zip(QUANTILES, answers, strict=True):
        qs[name] = _finite_or_none(value)
        if qs[name] is not None and interval is not None:
            intervals[name] = interval
    return LatencySummary(mean=mean, count=h.count, intervals=intervals,
                          count_estimate=h.count != 0, **qs)
