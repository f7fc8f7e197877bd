"""Unit and property tests for app.core.quantiles (Prometheus 2.42 histogram math).

Hand-computed expectations are worked out in the comments next to each case; the
real-binary comparison lives in tests/test_quantiles_prometheus.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from app.core.quantiles import (
    HistogramSnapshot,
    LatencySummary,
    WindowHistogram,
    histogram_quantile,
    increase,
    merge,
    rate,
    select_range,
    summarize,
    to_millis,
    window_histogram,
)

INF = math.inf
NAN = math.nan


def same(a: float, b: float) -> bool:
    """Equal, treating NaN as equal to NaN."""
    return (math.isnan(a) and math.isnan(b)) or a == b


# --------------------------------------------------------------------------- histogram_quantile: hand-computed

B4 = (0.1, 0.5, 1.0, INF)
C4 = (10.0, 50.0, 80.0, 100.0)  # 10 obs <=0.1, 40 in (0.1,0.5], 30 in (0.5,1], 20 above 1


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        # rank = 0.5*100 = 50; first bucket with count >= 50 is le=0.5 (50);
        # 0.1 + (0.5-0.1) * (50-10)/(50-10) = 0.5
        (0.5, 0.5),
        # rank 5 lands in the lowest bucket (10 >= 5): interpolate from 0: 0.1 * 5/10 = 0.05
        (0.05, 0.05),
        # rank 25 -> le=0.5: 0.1 + 0.4 * (25-10)/40 = 0.1 + 0.15 = 0.25
        (0.25, 0.25),
        # rank 70 -> le=1: 0.5 + 0.5 * (70-50)/30 = 0.8333...
        (0.7, 0.5 + 0.5 * 20 / 30),
        # rank 80 -> le=1 exactly full: 0.5 + 0.5 * 30/30 = 1.0
        (0.8, 1.0),
        # rank 0 -> lowest bucket: 0 + 0.1 * 0/10 = 0
        (0.0, 0.0),
    ],
)
def test_quantile_hand_computed(q: float, expected: float) -> None:
    assert histogram_quantile(q, B4, C4) == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize("q", [0.81, 0.9, 0.99, 1.0])
def test_quantile_in_inf_bucket_returns_second_highest_bound(q: float) -> None:
    # rank = q*100 > 80 = count of the highest finite bucket -> the rank is in the
    # +Inf bucket: Prometheus returns the upper bound of the 2nd highest bucket (1.0),
    # never an extrapolated value.
    assert histogram_quantile(q, B4, C4) == 1.0


def test_quantile_one_when_highest_finite_bucket_holds_everything() -> None:
    # counts (10,50,100,100): rank for q=1 is 100, le=1 has 100 >= 100 -> stays in the
    # finite bucket: 0.5 + 0.5 * (100-50)/(100-50) = 1.0
    assert histogram_quantile(1.0, B4, (10, 50, 100, 100)) == 1.0


def test_lowest_bucket_interpolates_from_zero_for_positive_bound() -> None:
    # bounds (2,4,+Inf) counts (4,8,8): q=0.25 -> rank 2 in lowest bucket (4 >= 2):
    # 0 + (2-0) * 2/4 = 1.0 (implicit lower bound 0)
    assert histogram_quantile(0.25, (2, 4, INF), (4, 8, 8)) == 1.0


def test_lowest_bucket_with_nonpositive_bound_returns_that_bound() -> None:
    # bounds (-1,0,1,+Inf) counts (4,6,10,10)
    b, c = (-1.0, 0.0, 1.0, INF), (4.0, 6.0, 10.0, 10.0)
    # q=0.2: rank 2, lowest bucket (4 >= 2) has bound -1 <= 0 -> -1 (no interpolation)
    assert histogram_quantile(0.2, b, c) == -1.0
    # q=0.5: rank 5 -> le=0 (6 >= 5): -1 + (0-(-1)) * (5-4)/(6-4) = -0.5
    assert histogram_quantile(0.5, b, c) == -0.5
    # q=0.7: rank 7 -> le=1: 0 + 1 * (7-6)/(10-6) = 0.25
    assert histogram_quantile(0.7, b, c) == 0.25
    # bound exactly 0 is "<= 0" too: bounds (0,1,+Inf) counts (3,5,5), q=0.1 -> 0.0
    assert histogram_quantile(0.1, (0.0, 1.0, INF), (3, 5, 5)) == 0.0


def test_all_negative_bounds() -> None:
    # bounds (-3,-2,+Inf) counts (2,6,8): q=0.5 -> rank 4 -> le=-2: -3 + 1*(4-2)/(6-2) = -2.5
    assert histogram_quantile(0.5, (-3, -2, INF), (2, 6, 8)) == -2.5
    # q=0.9 -> rank 7.2 > 6 -> +Inf bucket -> second highest bound -2
    assert histogram_quantile(0.9, (-3, -2, INF), (2, 6, 8)) == -2.0


@pytest.mark.parametrize(
    ("q", "expected"),
    [(-0.1, -INF), (-INF, -INF), (1.0000001, INF), (INF, INF)],
)
def test_q_out_of_range(q: float, expected: float) -> None:
    assert histogram_quantile(q, B4, C4) == expected
    # checked before anything else, even for histograms that would give NaN
    assert histogram_quantile(q, (1.0,), (0.0,)) == expected


def test_q_nan_gives_nan() -> None:
    assert math.isnan(histogram_quantile(NAN, B4, C4))


@pytest.mark.parametrize(
    ("bounds", "counts"),
    [
        ((), ()),  # empty (Prometheus: no sample at all)
        ((0.1, 0.5, 1.0), (1, 2, 3)),  # highest bound is not +Inf
        ((INF,), (5.0,)),  # fewer than 2 buckets
        ((INF, INF), (2.0, 3.0)),  # coalesced into 1 bucket
        ((0.1, 0.5, INF), (0, 0, 0)),  # zero observations
    ],
)
def test_quantile_nan_cases(bounds: tuple[float, ...], counts: tuple[float, ...]) -> None:
    assert math.isnan(histogram_quantile(0.5, bounds, counts))


def test_q_zero_with_empty_lowest_bucket_is_nan_like_go() -> None:
    # rank 0 -> lowest bucket (0 >= 0) -> 0 + 0.1 * (0/0): Go's float division gives NaN
    assert math.isnan(histogram_quantile(0.0, (0.1, 1.0, INF), (0, 5, 5)))
    # any q > 0 is fine: rank 2.5 -> le=1: 0.1 + 0.9 * 2.5/5 = 0.55
    assert histogram_quantile(0.5, (0.1, 1.0, INF), (0, 5, 5)) == pytest.approx(0.55, rel=1e-12)


def test_non_monotonic_counts_get_the_envelope() -> None:
    # counts (5,3,8,6) -> ensureMonotonic -> (5,5,8,8)
    b, c = (1.0, 2.0, 3.0, INF), (5.0, 3.0, 8.0, 6.0)
    # q=0.5: observations 8 (the fixed +Inf count), rank 4 -> le=1: 1 * 4/5 = 0.8
    assert histogram_quantile(0.5, b, c) == 0.8
    # q=0.75: rank 6 -> le=3 (first count >= 6 after the fix): 2 + 1*(6-5)/(8-5) = 2.333..
    assert histogram_quantile(0.75, b, c) == pytest.approx(2 + 1 / 3, rel=1e-12)
    # the +Inf bucket is raised too: (1,+Inf) counts (5,3) -> (5,5): rank 2.5 -> 1*2.5/5 = 0.5
    assert histogram_quantile(0.5, (1.0, INF), (5.0, 3.0)) == 0.5


def test_no_small_delta_tolerance_in_2_42() -> None:
    # le=2 has one observation more than le=1 out of 1e13 (relative 1e-13). Releases
    # after 2.42 flatten such deltas (<= 1e-12) as float noise; 2.42 does not:
    # q = (1e13+0.5)/2e13 -> rank 1e13+0.5 -> le=2: 1 + 1 * (0.5/1) = 1.5
    # (with the later tolerance le=2 would be 1e13 and the answer the +Inf rule's 2.0)
    q = 0.500000000000025
    assert q * 2e13 == 1e13 + 0.5
    assert histogram_quantile(q, (1.0, 2.0, INF), (1e13, 1e13 + 1, 2e13)) == 1.5


def test_unsorted_and_duplicate_bounds_are_sorted_and_coalesced() -> None:
    # (+Inf:10, 1:3, 1:2, 0.5:2) -> sorted, equal bounds added: (0.5:2, 1:5, +Inf:10)
    # q=0.5: rank 5 -> le=1: 0.5 + 0.5 * (5-2)/(5-2) = 1.0
    assert histogram_quantile(0.5, (INF, 1.0, 1.0, 0.5), (10, 3, 2, 2)) == 1.0
    # q=0.1: rank 1 -> le=0.5: 0.5 * 1/2 = 0.25
    assert histogram_quantile(0.1, (INF, 1.0, 1.0, 0.5), (10, 3, 2, 2)) == 0.25


def test_quantile_rejects_misaligned_input() -> None:
    with pytest.raises(ValueError):
        histogram_quantile(0.5, (1.0, INF), (1.0,))


# --------------------------------------------------------------------------- increase / rate: hand-computed


def test_increase_no_extrapolation_when_edges_are_samples() -> None:
    # samples at the range edges: factor = sampledInterval/sampledInterval = 1
    assert increase([(0, 0), (10, 10), (20, 20)], 0, 20) == 20.0


def test_increase_extrapolates_to_both_edges() -> None:
    # samples at 5,15,25 = 10,20,30 in [0,30]: result 20, sampled 20, avg 10, threshold 11;
    # durationToStart 5 (zero point 20*10/20 = 10 is not < 5), durationToEnd 5:
    # 20 * (20+5+5)/20 = 30
    assert increase([(5, 10), (15, 20), (25, 30)], 0, 30) == 30.0


def test_increase_start_capped_at_counter_zero_point() -> None:
    # samples 5:2, 15:12, 25:22 in [0,30]: result 20; durationToZero = 20 * 2/20 = 2 < 5,
    # so only 2s are extrapolated at the start: 20 * (20+2+5)/20 = 27
    assert increase([(5, 2), (15, 12), (25, 22)], 0, 30) == 27.0


def test_increase_series_starting_inside_the_window() -> None:
    # first sample 20s after range start, avg spacing 5 -> threshold 5.5:
    # counter starting at 0: zero point caps durationToStart to 0 -> 10 * (10+0+0)/10 = 10
    assert increase([(20, 0), (25, 5), (30, 10)], 0, 30) == 10.0
    # counter at 100: zero point 10*100/10 = 100 is not < 20, 20 >= 5.5 -> add avg/2 = 2.5:
    # 10 * (10 + 2.5 + 0)/10 = 12.5
    assert increase([(20, 100), (25, 105), (30, 110)], 0, 30) == 12.5


def test_increase_series_ending_inside_the_window() -> None:
    # last sample 20s before the end (>= 1.1*avg) -> only avg/2 added at the end:
    # result 10, sampled 10, avg 5: 10 * (10 + 0 + 2.5)/10 = 12.5
    assert increase([(0, 100), (5, 105), (10, 110)], 0, 30) == 12.5


def test_increase_counter_reset_adds_previous_value() -> None:
    # 10 -> 20 (+10), restart: 20 -> 5 (counter restarted from 0: +5), 5 -> 15 (+10) = 25
    # Go: last-first = 15-10 = 5, plus 20 for the drop = 25; edges on samples: factor 1
    pts = [(0, 10), (10, 20), (20, 5), (30, 15)]
    assert increase(pts, 0, 30) == 25.0
    assert rate(pts, 0, 30) == pytest.approx(25 / 30, rel=1e-15)


def test_increase_reset_to_zero_never_negative_or_huge() -> None:
    # engine restart drops every counter to 0: 1000 -> 1010 -> 0 -> 3
    # increments 10, 0 (restart from 0), 3 = 13
    assert increase([(0, 1000), (10, 1010), (20, 0), (30, 3)], 0, 30) == 13.0


def test_increase_needs_two_points() -> None:
    assert increase([], 0, 10) is None
    assert increase([(5, 1)], 0, 10) is None
    assert rate([(5, 1)], 0, 10) is None


def test_window_is_closed_on_both_ends() -> None:
    pts = [(0, 0), (10, 10), (20, 20), (30, 30)]
    # [10, 20] keeps both edge samples (Prometheus 2.x matrixIterSlice: t >= mint, t == maxt)
    assert select_range(pts, 10, 20) == [(10.0, 10.0), (20.0, 20.0)]
    assert increase(pts, 10, 20) == 10.0
    # one millisecond less on either side drops that sample -> a single sample -> None
    assert increase(pts, 10.001, 20) is None
    assert increase(pts, 10, 19.999) is None


def test_timestamps_are_compared_in_milliseconds() -> None:
    assert to_millis(1700000000.123) == 1700000000123
    # a sub-millisecond difference is the same Prometheus timestamp; the first sample wins
    assert select_range([(10.0, 1.0), (10.0002, 2.0), (11.0, 3.0)], 0, 20) == [(10.0, 1.0), (11.0, 3.0)]


def test_rate_is_increase_per_range_second() -> None:
    # increase 30 (see test_increase_extrapolates_to_both_edges) over a 30s range
    assert rate([(5, 10), (15, 20), (25, 30)], 0, 30) == 1.0


# --------------------------------------------------------------------------- window_histogram / merge / summarize


def test_window_histogram_per_bucket_extrapolation_can_break_monotonicity() -> None:
    # One series starting inside the window [0,30], samples at 20 and 30, bounds (1,+Inf).
    # le=1: 10 -> 20: result 10, zero point 10*10/10 = 10 < durationToStart 20 -> 10,
    #   which is < threshold 11 -> extrapolate 10: 10 * (10+10+0)/10 = 20
    # +Inf: 20 -> 31: result 11, zero point 10*20/11 = 18.18 < 20 but >= 11 -> only avg/2 = 5:
    #   11 * (10+5+0)/10 = 16.5
    snaps = [
        HistogramSnapshot(ts=20, counts=(10, 20), sum=5.0, count=20),
        HistogramSnapshot(ts=30, counts=(20, 31), sum=9.0, count=31),
    ]
    h = window_histogram((1.0, INF), snaps, 0, 30)
    assert h is not None
    assert h.bounds == (1.0, INF)
    assert h.increases == (20.0, 16.5)
    assert h.count == 16.5
    # _sum 5 -> 9: result 4, zero point 10*5/4 = 12.5 < 20 but >= 11 -> 4 * 15/10 = 6
    assert h.sum == 6.0
    # histogram_quantile repairs the envelope: (20, 20); q=0.5 -> rank 10 -> 1 * 10/20 = 0.5
    # (without the fix it would be 8.25/20 = 0.4125)
    assert histogram_quantile(0.5, h.bounds, h.increases) == 0.5


def test_window_histogram_with_reset_and_filtering() -> None:
    bounds = (0.1, 1.0, INF)
    snaps = [
        HistogramSnapshot(0, (1, 2, 3), 1.0, 3),  # outside [10, 30]
        HistogramSnapshot(10, (5, 8, 9), 4.0, 9),
        HistogramSnapshot(20, (7, 12, 14), 6.5, 14),
        HistogramSnapshot(30, (1, 1, 2), 0.5, 2),  # engine restarted
    ]
    h = window_histogram(bounds, snaps, 10, 30)
    assert h is not None
    # edges on samples -> no extrapolation; le=0.1: 5->7 (+2), reset 7->1 (+1) = 3
    # le=1: 8->12 (+4), 12->1 (+1) = 5 ; +Inf: 9->14 (+5), 14->2 (+2) = 7
    assert h.increases == (3.0, 5.0, 7.0)
    assert h.count == 7.0
    assert h.sum == 3.0  # 4 -> 6.5 (+2.5), restart -> 0.5 (+0.5)
    assert window_histogram(bounds, snaps, 25, 30) is None  # one snapshot only
    with pytest.raises(ValueError):
        window_histogram((1.0, INF), snaps, 10, 30)


def test_merge_is_sum_by_le_with_union_of_bounds() -> None:
    a = WindowHistogram(bounds=(0.5, 1.0, INF), increases=(2.0, 6.0, 10.0), sum=3.0, count=10.0)
    b = WindowHistogram(bounds=(0.3, 1.0, INF), increases=(1.0, 3.0, 4.0), sum=1.5, count=4.0)
    m = merge([a, None, b])
    assert m == WindowHistogram(
        bounds=(0.3, 0.5, 1.0, INF),
        # 0.3 and 0.5 only get the contribution of the series that has them
        increases=(1.0, 2.0, 9.0, 14.0),
        sum=4.5,
        count=14.0,
    )
    assert merge([]) is None
    assert merge([None]) is None
    # cumulative (1,2,9,14): q=0.5 -> rank 7 -> le=1: 0.5 + 0.5*(7-2)/(9-2) = 0.857142...
    assert histogram_quantile(0.5, m.bounds, m.increases) == pytest.approx(0.5 + 0.5 * 5 / 7, rel=1e-12)


def test_merge_only_partially_present_bucket_triggers_monotonicity_fix() -> None:
    a = WindowHistogram(bounds=(1.0, INF), increases=(5.0, 10.0), sum=0.0, count=10.0)
    b = WindowHistogram(bounds=(2.0, INF), increases=(3.0, 4.0), sum=0.0, count=4.0)
    m = merge([a, b])
    assert m is not None and m.increases == (5.0, 3.0, 14.0)
    # envelope (5,5,14): q=0.5 -> rank 7 -> +Inf-free search: le=1 5<7, le=2 5<7 -> +Inf
    # bucket -> second highest bound 2.0
    assert histogram_quantile(0.5, m.bounds, m.increases) == 2.0


def test_summarize_values_and_json_friendly_none() -> None:
    h = WindowHistogram(bounds=B4, increases=C4, sum=42.0, count=100.0)
    s = summarize(h)
    # p50 = 0.5 (see above); p90/p95/p99 ranks 90/95/99 are in the +Inf bucket -> 1.0
    assert s == LatencySummary(p50=0.5, p90=1.0, p95=1.0, p99=1.0, mean=0.42, count=100.0,
                               intervals={"p50": (0.1, 0.5), "p90": (1.0, INF), "p95": (1.0, INF),
                                          "p99": (1.0, INF)}, count_estimate=True)
    assert summarize(None) == LatencySummary(None, None, None, None, None, 0.0)
    # means only (a source's _sum/_count without buckets): the mean and count, no quantile
    means = summarize(WindowHistogram(bounds=(), increases=(), sum=42.0, count=100.0, means_only=True))
    assert means == LatencySummary(None, None, None, None, mean=0.42, count=100.0, count_estimate=True)
    assert summarize(WindowHistogram(bounds=(), increases=(), sum=0.0, count=0.0, means_only=True)) == \
        LatencySummary(None, None, None, None, None, 0.0)
    # zero observations: every quantile NaN -> None, mean undefined
    z = summarize(WindowHistogram(bounds=B4, increases=(0, 0, 0, 0), sum=0.0, count=0.0))
    assert z == LatencySummary(None, None, None, None, None, 0.0)
    # no +Inf bucket -> NaN quantiles -> None, but the mean is still known
    n = summarize(WindowHistogram(bounds=(1.0, 2.0), increases=(1.0, 2.0), sum=3.0, count=2.0))
    assert n == LatencySummary(None, None, None, None, 1.5, 2.0, count_estimate=True)


# --------------------------------------------------------------------------- property tests

finite_bounds = st.lists(
    st.floats(min_value=-1e3, max_value=1e4, allow_nan=False, allow_infinity=False),
    min_size=1, max_size=12, unique=True
)
counts_st = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def histograms(draw: st.DrawFn, monotone: bool = False) -> tuple[list[float], list[float]]:
    bounds = sorted(draw(finite_bounds)) + [INF]
    counts = draw(st.lists(counts_st, min_size=len(bounds), max_size=len(bounds)))
    if monotone:
        counts = sorted(counts)
    return bounds, counts


def reference_quantile(q: float, bounds: list[float], counts: list[float]) -> float:
    """Independent plain-language restatement for sorted, unique, monotone input, 0<q<=1."""
    total = counts[-1]
    if total == 0:
        return NAN
    rank = q * total
    for i in range(len(bounds) - 1):
        if counts[i] >= rank:
            if i == 0 and bounds[0] <= 0:
                return bounds[0]
            lo = bounds[i - 1] if i > 0 else 0.0
            below = counts[i - 1] if i > 0 else 0.0
            return lo + (bounds[i] - lo) * ((rank - below) / (counts[i] - below))
    return bounds[-2]


@settings(max_examples=300)
@given(histograms(), st.floats(min_value=0, max_value=1), st.floats(min_value=0, max_value=1))
def test_prop_quantile_monotone_in_q(h: tuple[list[float], list[float]], q1: float, q2: float) -> None:
    bounds, counts = h
    lo, hi = sorted((q1, q2))
    # q=0 (or a rank that underflows to 0) with an empty lowest bucket is 0/0 = NaN (tested above)
    assume(lo * max(counts) > 0 or counts[0] > 0)
    a, b = histogram_quantile(lo, bounds, counts), histogram_quantile(hi, bounds, counts)
    if math.isnan(a) or math.isnan(b):
        assert max(counts) == 0 or len(bounds) < 2  # only "no observations" gives NaN here
        return
    # Mathematically a <= b. In float64, "start + (end-start)*1.0" at the top of a bucket
    # can round one ulp above "end", the next bucket's start, so allow a few ulps.
    tol = 4 * math.ulp(max(abs(a), abs(b), 1e-300))
    assert a <= b + tol


@settings(max_examples=300)
@given(histograms(monotone=True), st.floats(min_value=0, max_value=1, exclude_min=True))
def test_prop_quantile_matches_plain_reference(h: tuple[list[float], list[float]], q: float) -> None:
    bounds, counts = h
    assume(q * counts[-1] > 0)  # rank 0 with an empty lowest bucket is Go's 0/0 (tested above)
    assert same(histogram_quantile(q, bounds, counts), reference_quantile(q, bounds, counts))


@settings(max_examples=200)
@given(histograms(), st.floats(min_value=0, max_value=1, exclude_min=True))
def test_prop_quantile_within_bucket_range(h: tuple[list[float], list[float]], q: float) -> None:
    bounds, counts = h
    v = histogram_quantile(q, bounds, counts)
    if math.isnan(v):
        # only: no observations, or Go's 0/0 when the rank is 0 in an empty lowest
        # bucket that is interpolated (bound > 0)
        assert max(counts) == 0 or (q * max(counts) == 0 and counts[0] == 0 and bounds[0] > 0)
        return
    lowest = min(bounds[0], 0.0)
    highest_finite = max(bounds[-2], 0.0)
    slack = 4 * math.ulp(max(abs(lowest), abs(highest_finite), 1.0))
    assert lowest - slack <= v <= highest_finite + slack


@st.composite
def counter_series(draw: st.DrawFn, integer: bool = False, min_size: int = 0) -> list[tuple[float, float]]:
    """Strictly increasing ms timestamps; non-negative values that grow and sometimes reset."""
    n = draw(st.integers(min_value=min_size, max_value=25))
    t_ms = draw(st.integers(min_value=0, max_value=10_000))
    v = 0.0
    pts = []
    for _ in range(n):
        t_ms += draw(st.integers(min_value=1, max_value=30_000))
        if draw(st.integers(0, 5)) == 0:  # reset: engine restart
            v = float(draw(st.integers(0, 50))) if integer else draw(st.floats(0, 50))
        else:
            v += float(draw(st.integers(0, 1000))) if integer else draw(st.floats(0, 1e6))
        pts.append((t_ms / 1000, v))
    return pts


@settings(max_examples=300)
@given(counter_series(), st.integers(0, 800_000), st.integers(0, 800_000))
def test_prop_increase_never_negative(pts: list[tuple[float, float]], a: int, b: int) -> None:
    start, end = sorted((a / 1000, b / 1000))
    inc = increase(pts, start, end)
    r = rate(pts, start, end)
    n_in = len(select_range(pts, start, end))
    if n_in < 2:
        assert inc is None and r is None
    else:
        assert inc is not None and r is not None
        assert inc >= 0 and r >= 0


@settings(max_examples=300)
@given(counter_series(integer=True, min_size=2), counter_series(integer=True, min_size=2), st.integers(1, 20))
def test_prop_reset_splits_into_halves(
    pre: list[tuple[float, float]], post_raw: list[tuple[float, float]], restart_at: int
) -> None:
    """What is exactly true about a reset, with range edges on the first/last samples
    (so the extrapolation factor is exactly 1):

        increase(all) == increase(pre) + post[0].value + increase(post)

    The post-reset first value is not lost: Prometheus treats the counter as having
    restarted from 0, so the gap across the reset contributes the new value itself.
    Integer counts keep float arithmetic exact.
    """
    last_t = pre[-1][0]
    # shift the second half after the first; force a real drop at the boundary
    offset = last_t - post_raw[0][0] + 1.0
    post = [(round(t + offset, 3), v) for t, v in post_raw]
    post[0] = (post[0][0], min(post[0][1], pre[-1][1] - 1))
    assume(post[0][1] >= 0)
    post = [post[0]] + [(t, v) for t, v in post[1:]]
    all_pts = pre + post
    whole = increase(all_pts, all_pts[0][0], all_pts[-1][0])
    first = increase(pre, pre[0][0], pre[-1][0])
    second = increase(post, post[0][0], post[-1][0])
    assert whole is not None and first is not None and second is not None
    assert whole == first + post[0][1] + second


@settings(max_examples=200)
@given(counter_series(min_size=2), st.integers(0, 800_000), st.integers(0, 800_000))
def test_prop_points_outside_the_window_do_not_matter(
    pts: list[tuple[float, float]], a: int, b: int
) -> None:
    start, end = sorted((a / 1000, b / 1000))
    inside = select_range(pts, start, end)
    assert same_opt(increase(pts, start, end), increase(inside, start, end))


def same_opt(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and same(a, b))


@st.composite
def window_histograms(draw: st.DrawFn, bounds: tuple[float, ...] | None = None) -> WindowHistogram:
    if bounds is None:
        bounds = tuple(sorted(draw(finite_bounds))) + (INF,)
    incs = tuple(draw(st.lists(counts_st, min_size=len(bounds), max_size=len(bounds))))
    return WindowHistogram(bounds=bounds, increases=incs, sum=draw(counts_st), count=incs[-1])


@settings(max_examples=200)
@given(st.data())
def test_prop_merge_equals_histogram_of_summed_counts(data: st.DataObject) -> None:
    bounds = tuple(sorted(data.draw(finite_bounds))) + (INF,)
    a = data.draw(window_histograms(bounds))
    b = data.draw(window_histograms(bounds))
    m = merge([a, b])
    summed = tuple(x + y for x, y in zip(a.increases, b.increases))
    assert m == WindowHistogram(bounds=bounds, increases=summed, sum=a.sum + b.sum, count=a.count + b.count)
    for q in (0.5, 0.9, 0.99):
        assert same(histogram_quantile(q, m.bounds, m.increases), histogram_quantile(q, bounds, summed))


@settings(max_examples=200)
@given(window_histograms(), window_histograms())
def test_prop_merge_with_different_layouts_is_per_bound_sum(a: WindowHistogram, b: WindowHistogram) -> None:
    m = merge([a, b])
    assert m is not None
    assert list(m.bounds) == sorted(set(a.bounds) | set(b.bounds))
    for bound, v in zip(m.bounds, m.increases):
        parts = [h.increases[h.bounds.index(bound)] for h in (a, b) if bound in h.bounds]
        assert v == (parts[0] if len(parts) == 1 else parts[0] + parts[1])


@settings(max_examples=150)
@given(st.data())
def test_prop_window_histogram_is_per_bucket_increase(data: st.DataObject) -> None:
    """Each bucket, _sum and _count is its own counter series: window_histogram must
    equal increase() applied to each column, whatever the resets and the window."""
    nb = data.draw(st.integers(1, 5))
    bounds = tuple(sorted(data.draw(st.lists(st.floats(0.001, 100), min_size=nb, max_size=nb, unique=True)))) + (
        INF,
    )
    cols = [data.draw(counter_series(integer=True)) for _ in range(len(bounds) + 1)]
    n = min(len(c) for c in cols)
    ts = [t for t, _ in cols[0][:n]]
    snaps = [
        HistogramSnapshot(ts=ts[i], counts=tuple(c[i][1] for c in cols[:-1]), sum=cols[-1][i][1] / 7,
                          count=cols[-2][i][1])
        for i in range(n)
    ]
    a, b = sorted((data.draw(st.integers(0, 800_000)) / 1000, data.draw(st.integers(0, 800_000)) / 1000))
    h = window_histogram(bounds, snaps, a, b)
    col = lambda f: [(s.ts, f(s)) for s in snaps]  # noqa: E731
    if len(select_range(col(lambda s: s.count), a, b)) < 2:
        assert h is None
        return
    assert h is not None
    assert h.increases == tuple(increase(col(lambda s, i=i: s.counts[i]), a, b) for i in range(len(bounds)))
    assert h.count == increase(col(lambda s: s.count), a, b)
    assert h.sum == increase(col(lambda s: s.sum), a, b)


@settings(max_examples=150)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=2, max_size=15))
def test_prop_no_extrapolation_no_reset_is_additive(steps: list[tuple[int, int]]) -> None:
    """With edges on samples and no resets, the increase of summed counters is the sum
    of the increases (last - first is linear); with extrapolation or resets it is not,
    which is why merge() adds per-series increases like ``sum(increase())`` does."""
    a_vals, b_vals, ta, tb = [], [], 0, 0
    for da, db in steps:
        ta, tb = ta + da, tb + db
        a_vals.append(float(ta))
        b_vals.append(float(tb))
    ts = [float(i * 15) for i in range(len(steps))]
    inc = lambda vals: increase(list(zip(ts, vals)), ts[0], ts[-1])  # noqa: E731
    assert inc([x + y for x, y in zip(a_vals, b_vals)]) == inc(a_vals) + inc(b_vals)  # type: ignore[operator]


# --------------------------------------------------------------------------- extrapolate_all


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(2, 12), components=st.integers(1, 6))
def test_extrapolating_components_together_gives_each_ones_own_float(data, n: int, components: int) -> None:
    """A histogram's buckets, ``_sum`` and ``_count`` share their timestamps, so
    :func:`extrapolate_all` computes the timestamps' part once; every value must still be
    the very float :func:`increase` / :func:`rate` give for that component alone, including
    a component that starts near zero (its start extrapolated only to where it was 0), one
    with a reset and one that does not grow."""
    from app.core.quantiles import extrapolate_all

    steps = data.draw(st.lists(st.integers(1, 30_000), min_size=n - 1, max_size=n - 1))
    t0 = 1_700_000_000_000 + data.draw(st.integers(0, 60_000))
    ts_ms = [t0]
    for step in steps:
        ts_ms.append(ts_ms[-1] + step)
    start_ms = t0 - data.draw(st.integers(0, 60_000))
    end_ms = ts_ms[-1] + data.draw(st.integers(0, 60_000))
    value = st.floats(0, 1e6, allow_nan=False)
    series = [data.draw(st.lists(value, min_size=n, max_size=n)) for _ in range(components)]
    series[0] = sorted(series[0])  # a counter that never resets (rule 3 applies when it starts near 0)
    results = []
    for values in series:
        result = values[-1] - values[0]
        for prev, v in zip(values, values[1:]):
            if v < prev:
                result += prev  # rule 1: a reset
        results.append(result)
    firsts = [values[0] for values in series]
    start, end = start_ms / 1000, end_ms / 1000
    for is_rate, one in ((False, increase), (True, rate)):
        together = extrapolate_all(results, firsts, ts_ms[0], ts_ms[-1], n, start_ms, end_ms, is_counter=True,
                                   is_rate=is_rate)
        alone = [one([(t / 1000, v) for t, v in zip(ts_ms, values)], start, end) for values in series]
        assert [float(x).hex() for x in together] == [float(x).hex() for x in alone], (together, alone)


def test_extrapolating_together_keeps_a_near_zero_start_of_its_own() -> None:
    """Worked case: two components over samples at 10 s and 20 s of a [0, 30] s window. The
    gaps to the window's edges (10 s) are below 1.1 x the 10 s average, so both ends are
    extrapolated to the edges: the first component, 100 -> 200, gives 100 x 30/10 = 300. The
    second, 1 -> 11, would have been 0 only 1 s before its first sample (10 x 1/10), so its
    start is extrapolated by 1 s, not 10: 10 x (10 + 1 + 10)/10 = 21."""
    from app.core.quantiles import extrapolate_all

    assert extrapolate_all([100.0, 10.0], [100.0, 1.0], 10_000, 20_000, 2, 0, 30_000, is_counter=True,
                           is_rate=False) == [300.0, 21.0]
