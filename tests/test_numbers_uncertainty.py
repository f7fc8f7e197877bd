"""Numbers that never claim more than the buckets know: quantile intervals, the TGI TTFT bound,
bounded shares, counts as estimates — in the JSON and as people read them."""

from __future__ import annotations

import math
import random

from app import latency
from app.core import human, quantiles
from app.core.quantiles import WindowHistogram
from app.diagnosis.findings import Evidence
from app.diagnosis.oneshot import OneShotResult, format_text
from app.diagnosis.signals import from_window
from app.window import GaugeStats, ModelWindow, TargetWindow

INF = math.inf
# vLLM's request-phase buckets (queue, prefill): nothing below 0.3 s
VLLM_PHASE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
              480.0, 960.0, 1920.0, 7680.0, INF)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0, INF)


def cumulative(bounds: tuple[float, ...], values: list[float]) -> tuple[float, ...]:
    return tuple(float(sum(v <= b for v in values)) for b in bounds)


def hist(bounds: tuple[float, ...], values: list[float]) -> WindowHistogram:
    return WindowHistogram(bounds, cumulative(bounds, values), float(sum(values)), float(len(values)))


def test_interval_is_the_bucket_of_the_same_computation() -> None:
    h = WindowHistogram((0.1, 0.5, 1.0, INF), (10.0, 50.0, 90.0, 100.0), 42.0, 100.0)
    for q, bucket in ((0.05, (0.0, 0.1)), (0.5, (0.1, 0.5)), (0.51, (0.5, 1.0)), (0.95, (1.0, INF))):
        value, interval = quantiles.bucket_quantile(q, h.bounds, h.increases)
        assert value == quantiles.histogram_quantile(q, h.bounds, h.increases)
        assert interval == bucket == quantiles.histogram_quantile_interval(q, h.bounds, h.increases)
        assert interval[0] <= value <= interval[1]
    assert quantiles.histogram_quantile_interval(math.nan, h.bounds, h.increases) is None
    assert quantiles.histogram_quantile_interval(0.5, (1.0, INF), (0.0, 0.0)) is None  # no observations


def test_vllm_half_millisecond_queue_is_below_the_lowest_bucket() -> None:
    """The real page: 0.5 ms mean queue time, vLLM's lowest queue bucket 0.3 s. histogram_quantile
    says p50 150 ms / p99 297 ms (Prometheus would too); people are told "< 0.3 s"."""
    queue = hist(VLLM_PHASE, [0.0005] * 136)
    window = TargetWindow(0.0, 60.0, overall=ModelWindow(histograms={"queue_time": queue}))
    body = latency.report_from_window(window, per_model=False)["queue_time"]
    assert body["p50"] == 0.15 and math.isclose(body["p99"], 0.297)  # as Prometheus interpolates
    assert math.isclose(body["mean"], 0.0005)
    assert body["intervals"] == {"p50": [0.0, 0.3], "p90": [0.0, 0.3], "p95": [0.0, 0.3], "p99": [0.0, 0.3]}
    assert body["count_estimate"] is True
    assert human.summary_quantile(body, "p50") == "< 0.3 s" == human.summary_quantile(body, "p99")
    assert human.seconds(body["mean"]) == "0.5 ms"
    # the CLI says the same
    text = format_text(OneShotResult("http://e/metrics", "vllm", [], {"window_seconds": 60.0, "queue_time": body},
                                     []))
    row = next(line for line in text.splitlines() if line.strip().startswith("queue"))
    assert row.split() == ["queue", "<", "0.3", "s", "<", "0.3", "s", "0.5", "ms", "≈136"]
    assert "150" not in row and "297" not in row


def test_plus_inf_bucket_is_above_the_largest_bound() -> None:
    h = hist(VLLM_ITL, [0.02] * 90 + [100.0] * 10)
    s = quantiles.summarize(h)
    assert s.p99 == 80.0 and s.interval("p99") == (80.0, INF)
    assert human.quantile(s.p99, s.interval("p99")) == "> 80 s"
    body = latency.WindowSummary.of(s).to_dict()
    assert body["intervals"]["p99"] == [80.0, None]  # JSON has no Infinity
    # a quantile in an inner bucket is its interpolated value, the bucket in the tooltip
    assert human.quantile(s.p50, s.interval("p50")) == f"{s.p50 * 1000:.1f} ms"
    assert human.summary_bucket(body, "p50") == "interpolated inside the bucket 0.01 – 0.025 s"


def test_tgi_ttft_is_a_mean_and_a_bound_not_a_sum_of_quantiles() -> None:
    """Quantiles do not add: with queue and prefill each 0 or 1 s (40 % of requests each,
    independent), both medians are 0 but 64 % of TTFTs are at least 1 s."""
    rng = random.Random(7)
    bounds = (0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, INF)
    queue = [1.0 if rng.random() < 0.4 else 0.0005 for _ in range(5000)]
    prefill = [1.0 if rng.random() < 0.4 else 0.0005 for _ in range(5000)]
    ttft = sorted(q + p for q, p in zip(queue, prefill))
    qh, ph = hist(bounds, queue), hist(bounds, prefill)
    d = latency.derived_ttft(qh, ph)
    assert d.p50 is None and d.p99 is None and d.derived  # no quantile claimed
    assert d.mean is not None and math.isclose(d.mean, sum(ttft) / len(ttft), rel_tol=1e-12)  # means add
    true_p50 = ttft[int(0.5 * len(ttft))]
    sum_of_p50 = quantiles.histogram_quantile(0.5, bounds, qh.increases) + \
        quantiles.histogram_quantile(0.5, bounds, ph.increases)
    assert true_p50 > 1.0 > sum_of_p50  # the old "queue p50 + prefill p50" was below the true p50
    low, high = d.bounds["p50"]
    assert low <= true_p50 <= high and (low, high) == (0.0, 2.0)  # honest: wide, but it holds
    for key, q in quantiles.QUANTILES:  # the bound holds for every quantile
        true = ttft[min(len(ttft) - 1, math.ceil(q * len(ttft)) - 1)]
        assert d.bounds[key][0] <= true <= d.bounds[key][1], key
    body = d.to_dict()
    assert body["derived"] is True and body["bounds"]["p99"] == [0.5, 2.0] and body["p99"] is None
    assert human.summary_quantile(body, "p99") == "500.0 ms – 2.00 s"


def test_tgi_bound_numbers() -> None:
    """p99: lower = max of the buckets' lower edges at 0.99, upper = sum of upper edges at 0.995."""
    bounds = (0.1, 0.2, 0.5, 1.0, INF)
    queue = WindowHistogram(bounds, (50.0, 90.0, 99.0, 100.0, 100.0), 12.0, 100.0)  # p99 in (0.2, 0.5]
    prefill = WindowHistogram(bounds, (0.0, 10.0, 98.0, 100.0, 100.0), 40.0, 100.0)  # p99 in (0.5, 1.0]
    d = latency.derived_ttft(queue, prefill)
    assert d.bounds["p99"] == (0.5, 2.0)  # max(0.2, 0.5) .. 1.0 (queue p99.5) + 1.0 (prefill p99.5)
    assert d.mean == 0.12 + 0.4


def test_share_above_one_is_bounded_and_explained() -> None:
    """Queue time and TTFT count different requests in a window: mean queue 1.01 x mean TTFT."""
    window = TargetWindow(0.0, 60.0)
    window.models["m"] = ModelWindow(
        histograms={"ttft": hist(VLLM_PHASE, [2.0] * 100), "queue_time": hist(VLLM_PHASE, [2.02] * 100)},
        gauges={"waiting": GaugeStats(4.0, 4.0, 6.0)})
    (s,) = from_window(window, "t", "vllm")
    assert s.queue_share == 1.0
    assert "raw ratio 1.010 bounded to 100%" in s.share_notes["queue_share"]
    assert "different" in s.share_notes["queue_share"]


def test_counts_are_estimates_for_people() -> None:
    assert human.count(135.75441489463694) == "≈136"
    assert human.count(2826.0, estimate=False) == "2,826"
    assert human.count(0.0) == "0" and human.count(None) == "–"


def test_evidence_with_a_bucket_reads_like_the_bucket() -> None:
    e = Evidence("queue p99", 0.297, "info", None, "s", True, "", [0.0, 0.3])
    assert e.text() == "queue p99 = < 0.3 s"
    assert Evidence.from_dict({"name": "x", "value": 80.0, "op": "info", "unit": "s",
                               "interval": [80.0, None]}).text() == "x = > 80 s"


def test_a_quantile_on_an_edge_of_its_bucket_is_shown_as_the_bucket() -> None:
    """vLLM's phase buckets: 10 requests at 12 s and 10 at 30 s put the rank of p50 (10) exactly on
    the 15 s bucket's cumulative count, so histogram_quantile says 15.0; people read "10–15 s"."""
    s = quantiles.summarize(hist(VLLM_PHASE, [12.0] * 10 + [30.0] * 10))
    assert s.p50 == 15.0 and s.interval("p50") == (10.0, 15.0)
    assert human.quantile(s.p50, s.interval("p50")) == "10–15 s"
    body = latency.WindowSummary.of(s).to_dict()
    assert body["p50"] == 15.0  # the JSON keeps Prometheus' number
    assert human.summary_quantile(body, "p50") == "10–15 s"
    assert human.summary_bucket(body, "p50") == ("the interpolated value 15.00 s sits on the edge of the bucket "
                                                 "10 – 15 s: the histogram says only that it lies in that bucket")
    # every request in one bucket: p99 is 99 % of the way through it (0.01 + 0.99 x 0.015 s), an artefact
    one = quantiles.summarize(hist(VLLM_ITL, [0.02] * 200))
    assert math.isclose(one.p99, 0.01 + 0.99 * 0.015) and human.quantile(one.p99, one.interval("p99")) == "10–25 ms"
    # p50 half-way through it, and p95 5 % from its top, are values: 2 % of the width (0.3 ms) is the limit
    assert human.quantile(one.p50, one.interval("p50")) == "17.5 ms"
    assert human.quantile(one.p95, one.interval("p95")) == "24.2 ms"  # 0.02425 s
    assert human.quantile(0.02471, (0.01, 0.025)) == "10–25 ms" and human.quantile(0.0246, (0.01, 0.025)) == "24.6 ms"
    assert human.quantile(4096.0, (2048.0, 4096.0), "tokens") == "2,048–4,096 tokens"
    # the evidence of a rule and the CLI spell it the same way
    assert Evidence("TTFT p50", 15.0, "info", None, "s", True, "", [10.0, 15.0]).text() == "TTFT p50 = 10–15 s"
    text = format_text(OneShotResult("http://e/metrics", "vllm", [], {"window_seconds": 60.0, "ttft": body}, []))
    row = next(line for line in text.splitlines() if line.strip().startswith("TTFT"))
    assert row.split()[:3] == ["TTFT", "10–15", "s"]


def test_numbers_are_plain_never_scientific() -> None:
    assert [human.number(v) for v in (10912.3, 1.09e4, 999.6, 123.4, 12.0, 1.5, 0.0123456, 1.2345e-5, 0.0, 1e9)] == [
        "10,912", "10,900", "1,000", "123", "12", "1.5", "0.0123", "0.0000123", "0", "1,000,000,000"]
    assert human.number(13036.0, "tokens") == "13,036 tokens" and human.number(None) == "–"
    assert [human.given(v) for v in (2000.0, 0.125, 1.234567, 16384.0)] == ["2,000", "0.125", "1.23457", "16,384"]
    assert human.interval((2048.0, None), "tokens") == "2,048 – +Inf tokens"
    # a rule's evidence: a token count and a rate from the engine, a threshold, none in e-notation
    assert Evidence("mean prompt length", 10912.3, ">=", 2000.0, "tokens", True).text() == (
        "mean prompt length = 10,912 tokens (>= 2,000 tokens)")
    assert Evidence("preemptions", 0.000123, ">", 0.0001, "/s", True).text() == (
        "preemptions = 0.000123 /s (> 0.0001 /s)")
