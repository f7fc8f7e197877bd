"""What the raw-samples mirror of a source asks its server and keeps (app/promsource/mirror.py),
against a scripted server holding known samples: a first read of the retention in pieces, then
only the time since the last read; a sample on a piece's edge kept once; a reset between two
reads counted as Prometheus counts it; a gap past the retention read afresh; an answer too large
turns the mirror off (its rounds query). Agreement with a real Prometheus: the matrix tests."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from app.core import quantiles
from app.core.durations import parse_duration
from app.promql.client import PromAPIError, QueryResult, RangeSeries
from app.promsource.config import PrometheusSourceConfig
from app.promsource.mirror import EVERY, OVERLAP, PIECE, RETENTION, SampleMirror, wanted_by
from app.promsource.service import PrometheusSource

T0 = 1_800_000_000.0
POD = {"namespace": "llm", "pod": "a", "model_name": "m"}


class Server:
    """Answers a range selector at ``time`` with the samples in ``[time - range, time]`` of its
    series (``name`` or ``name|le``) whose names the selector's ``__name__=~"..."`` matches;
    ``max_samples``/``max_series``:
    an answer holding more is refused as too large, naming the limit."""

    def __init__(self, series: dict[str, list[tuple[float, float]]], too_large: bool = False,
                 max_samples: int | None = None, max_series: int | None = None) -> None:
        self.series, self.too_large = series, too_large
        self.max_samples, self.max_series = max_samples, max_series
        self.asked: list[tuple[float, float]] = []  # the means series' reads: (range seconds, evaluation time)
        self.asked_buckets: list[tuple[float, float]] = []  # the buckets' reads

    def query_samples(self, selector: str, time: float) -> QueryResult[RangeSeries]:
        seconds = parse_duration(selector.rsplit("[", 1)[1].rstrip("]"))
        names = re.search(r'__name__=~"([^"]*)"', selector)
        assert names is not None, selector
        wanted = re.compile(names.group(1).replace("\\\\", "\\"))
        (self.asked if wanted.fullmatch("up") else self.asked_buckets).append((seconds, time))
        if self.too_large:
            raise PromAPIError("too_large", "the answer holds more than 10 points (max_samples)", "max_samples")
        out = [RangeSeries({"__name__": name, **POD, **({"le": le} if le else {})},
                           [(t, v) for t, v in points if time - seconds <= t <= time])
               for name, le, points in ((*key.partition("|")[::2], points) for key, points in self.series.items())
               if wanted.fullmatch(name)]
        if self.max_series is not None and len(out) > self.max_series:
            raise PromAPIError("too_large", f"more than {self.max_series} series (max_series)", "max_series")
        if self.max_samples is not None and sum(len(r.points) for r in out) > self.max_samples:
            raise PromAPIError("too_large", f"more than {self.max_samples} points (max_samples)", "max_samples")
        return QueryResult(out, [])


def test_only_the_buckets_configured_are_kept() -> None:
    """With ``hold_buckets: []`` a mirror keeps the means series alone (one read); it refuses to
    keep the buckets of a histogram whose rounds do not read them from it."""
    points = [(T0 - 600 + 15 * k, float(k)) for k in range(41)]
    series = {"up": points, "vllm:time_to_first_token_seconds_bucket|+Inf": points}
    server = Server(series)
    mirror = SampleMirror(server, [], ["namespace", "pod"], buckets=())
    held = mirror.view(T0 - 60, T0)
    assert held is not None and held.buckets == frozenset() and mirror.buckets == frozenset()
    assert server.asked_buckets == [] and len(server.asked) == 4  # the means series, in 4 pieces
    assert mirror.series_held() == 1 and "vllm:time_to_first_token_seconds_bucket" not in mirror._series
    with pytest.raises(ValueError, match="buckets of"):
        held.answer(("histogram", "ttft"), T0 - 60, T0, EVERY, 0.0, buckets=True)
    with pytest.raises(ValueError, match=r"can be kept, not \['prefill_time'\]"):
        SampleMirror(server, [], ["pod"], buckets=("ttft", "prefill_time"))


def test_the_first_read_comes_in_pieces_then_only_what_is_new() -> None:
    points = [(T0 - 600 + 15 * k, 10.0 * k) for k in range(41)]  # to T0, every 15 s; one at T0 - 120 exactly
    server = Server({"vllm:request_success_total": points})
    mirror = SampleMirror(server, [("namespace", "=", "llm")], ["namespace", "pod"])
    assert mirror.view(T0 - 60, T0) is not None
    assert [round(t - T0) for _, t in server.asked] == [-360, -240, -120, 0]
    assert [s for s, _ in server.asked] == [PIECE] * 4 and 4 * PIECE == RETENTION
    (held,) = mirror._series["vllm:request_success_total"].values()
    assert list(held.ts) == [quantiles.to_millis(t) for t, _ in points if t >= T0 - RETENTION]  # each once
    server.series["vllm:request_success_total"] = points + [(T0 + 15, 400.0), (T0 + 30, 5.0)]  # a restart
    server.asked.clear()
    assert mirror.view(T0 - 30, T0 + 30) is not None
    assert server.asked == [(30 + OVERLAP, T0 + 30)]  # the time since the last read, and a little more
    got = mirror.view(T0 - 30, T0 + 30)
    assert got is not None
    (rate,) = got.counter("requests_total", T0 - 30, T0 + 30, EVERY)
    expected = quantiles.rate([(t, v) for t, v in server.series["vllm:request_success_total"]], T0 - 30, T0 + 30)
    assert rate.value == pytest.approx(expected, rel=1e-12) and rate.labels == {**POD, "llm_latency_family": "0"}


def test_a_gap_past_the_retention_is_read_afresh() -> None:
    points = [(T0 - 600 + 15 * k, float(k)) for k in range(100)]
    server = Server({"up": points})
    mirror = SampleMirror(server, [], ["namespace", "pod"])
    assert mirror.view(T0 - 60, T0) is not None
    server.asked.clear()
    later = T0 + 2 * RETENTION
    assert mirror.view(later - 60, later) is not None
    assert len(server.asked) == RETENTION / PIECE == 4 and mirror.held_from == later - RETENTION
    (held,) = mirror._series["up"].values()
    assert held.ts[0] >= quantiles.to_millis(later - RETENTION)


def test_an_answer_too_large_turns_the_mirror_off() -> None:
    server = Server({"up": [(T0, 1.0)]}, too_large=True)
    mirror = SampleMirror(server, [], ["pod"])
    assert mirror.view(T0 - 60, T0) is None and "max_samples" in mirror.refused
    server.asked.clear()
    assert mirror.view(T0 - 60, T0 + 30) is None and server.asked == []  # not asked again


def test_rounds_share_a_read_within_the_lag_and_one_target_never_lags() -> None:
    server = Server({"up": [(T0 - 600 + 15 * k, 1.0) for k in range(50)]})
    mirror = SampleMirror(server, [], ["namespace", "pod"], lag=20.0)
    assert mirror.view(T0 - 60, T0) is not None
    asked = len(server.asked)
    shared = mirror.view(T0 + 15 - 60, T0 + 15)  # a round 15 s later: the same read, its window ending at it
    assert shared is not None and shared.at == T0 and len(server.asked) == asked
    assert mirror.view(T0 + 15 - 60, T0 + 15, refresh=False) is None  # one target's window: queried instead
    one = mirror.view(T0 - 60, T0, refresh=False)
    assert one is not None and one.at == T0
    assert mirror.view(T0 + 25 - 60, T0 + 25) is not None and len(server.asked) == asked + 1  # past the lag


def test_the_diagnosis_round_reads_what_is_new_and_the_others_share_it() -> None:
    server = Server({"up": [(T0 - 600 + 15 * k, 1.0) for k in range(50)]})
    mirror = SampleMirror(server, [], ["namespace", "pod"], lag=20.0)
    assert mirror.view(T0 - 60, T0) is not None
    asked = len(server.asked)
    diagnosis = mirror.view(T0 + 15 - 60, T0 + 15, fresh=True)  # 15 s later: a read, its window to its end
    assert diagnosis is not None and diagnosis.at == T0 + 15 and len(server.asked) == asked + 1
    summaries = mirror.view(T0 + 30 - 300, T0 + 30)  # within the lag of it: shared
    assert summaries is not None and summaries.at == T0 + 15 and len(server.asked) == asked + 1


def test_a_piece_with_too_many_samples_is_read_in_halves() -> None:
    """A 2-minute piece of 4 series every 15 s holds 36 samples; past max_samples (20) it is read
    again as two minutes' halves, each sample kept once; too many series is not split in time."""
    points = [(T0 - 600 + 15 * k, float(k)) for k in range(41)]
    names = ["up", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total"]
    server = Server({name: points for name in names}, max_samples=20)
    mirror = SampleMirror(server, [], ["namespace", "pod"])
    assert mirror.view(T0 - 60, T0) is not None and not mirror.refused
    # each 120 s piece refused, then its two 60 s halves
    assert [s for s, _ in server.asked] == [PIECE, PIECE / 2, PIECE / 2] * 4
    assert [round(t - T0) for _, t in server.asked] == [-360, -420, -360, -240, -300, -240, -120, -180, -120,
                                                          0, -60, 0]
    for name in names:
        (held,) = mirror._series[name].values()
        assert list(held.ts) == [quantiles.to_millis(t) for t, _ in points if t >= T0 - RETENTION]
    narrow = Server({name: points for name in names}, max_series=3)
    refused = SampleMirror(narrow, [], ["namespace", "pod"])
    assert refused.view(T0 - 60, T0) is None and "max_series" in refused.refused and len(narrow.asked) == 1


def test_buckets_too_many_to_keep_are_queried_and_the_means_kept() -> None:
    """The TTFT buckets' answer holds more series than max_series: they are dropped from the
    mirror (their windows queried, the reason kept), the means series and the ITL buckets kept."""
    points = [(T0 - 600 + 15 * k, float(k)) for k in range(41)]
    series = {"up": points, "vllm:request_success_total": points,
              "vllm:inter_token_latency_seconds_bucket|+Inf": points}
    series |= {f"vllm:time_to_first_token_seconds_bucket|{le}": points for le in ("0.1", "1.0", "+Inf")}
    server = Server(series, max_series=2)
    mirror = SampleMirror(server, [], ["namespace", "pod"], buckets=("ttft", "itl"))
    held = mirror.view(T0 - 60, T0)
    assert held is not None and not mirror.refused
    assert held.buckets == {"itl"} and mirror.buckets == {"itl"} and "max_series" in mirror.refused_buckets["ttft"]
    assert "vllm:time_to_first_token_seconds_bucket" not in mirror._series
    assert {"up", "vllm:request_success_total", "vllm:inter_token_latency_seconds_bucket"} <= mirror._series.keys()
    with pytest.raises(ValueError, match="ttft are not held"):
        held.answer(("histogram", "ttft"), T0 - 60, T0, EVERY, 0.0, buckets=True)
    (itl,) = held.answer(("histogram", "itl"), T0 - 60, T0, EVERY, 0.0, buckets=True)[:1]
    assert itl.labels["le"] == "+Inf" and itl.value == pytest.approx(4.0)  # 1 a scrape over 60 s
    asked = len(server.asked_buckets)
    assert mirror.view(T0 - 30, T0 + 30) is not None and len(server.asked_buckets) == asked + 1  # ITL's only


def test_reads_that_share_a_refresh_compute_each_answer_once_and_a_few_targets_read_theirs() -> None:
    """Every target's answers are computed once per refresh (the SLO alerts' and summaries' rounds
    that share one ask the same), a new refresh computes them again, and a read of some targets
    (found through the index by target) gives those targets' numbers of the full read."""
    points = [(T0 - 600 + 15 * k, 10.0 * k) for k in range(41)]
    later = [(T0 - 600 + 15 * k, 3.0 * k) for k in range(43)]
    pods = {"a": points, "b": [(t, 2 * v) for t, v in points], "c": [(t, v + 1) for t, v in points]}

    class Pods(Server):  # the same series for three pods
        def query_samples(self, selector: str, time: float) -> QueryResult[RangeSeries]:
            out = []
            for pod, series in pods.items():
                self.series = {"vllm:request_success_total": series}
                answer = super().query_samples(selector, time)
                out += [RangeSeries({**r.labels, "pod": pod}, r.points) for r in answer.data]
            return QueryResult(out, [])

    mirror = SampleMirror(Pods({}), [], ["namespace", "pod"], lag=30.0)
    held = mirror.view(T0 - 60, T0)
    assert held is not None
    computed = []
    first = held.memo(("k",), lambda: computed.append(1) or ["answer"])
    again = mirror.view(T0 - 45, T0 + 15)  # within the lag: the same refresh, its answers
    assert again is not None and again.memo(("k",), lambda: computed.append(2) or ["other"]) is first
    assert computed == [1]
    job = ("counter", "requests_total")
    every = held.answer(job, T0 - 60, T0, EVERY, 0.0)
    assert held.answer(job, T0 - 60, T0, EVERY, 0.0) is every  # kept
    by_pod = {s.labels["pod"]: s.value for s in every}
    assert sorted(by_pod) == ["a", "b", "c"] and by_pod["b"] == 2 * by_pod["a"] > 0
    some = held.answer(job, T0 - 60, T0, wanted_by(None, None, [("llm", "c"), ("llm", "a")]), 0.0)
    assert {s.labels["pod"]: s.value for s in some} == {"a": by_pod["a"], "c": by_pod["c"]}
    one = held.answer(job, T0 - 60, T0, wanted_by(("llm", "b"), None, None), 0.0)
    assert [(s.labels["pod"], s.value) for s in one] == [("b", by_pod["b"])]
    pods.update(a=later)
    fresh = mirror.view(T0 - 30, T0 + 45)  # past the lag: a new refresh, its own answers
    assert fresh is not None and fresh.memo(("k",), lambda: computed.append(3) or ["new"]) == ["new"]
    assert computed == [1, 3]


def test_the_source_configuration_says_which_buckets_are_kept() -> None:
    """``hold_buckets`` reaches the source's mirror: TTFT and ITL by default, none with ``[]``;
    any other histogram is refused when the configuration is read, naming the field."""
    def config(**extra: object) -> PrometheusSourceConfig:
        return PrometheusSourceConfig.model_validate({"name": "prod", "url": "http://127.0.0.1:9", "target_labels":
                                                      ["namespace", "pod"], **extra})

    for extra, kept in (({}, {"ttft", "itl"}), ({"hold_buckets": []}, set()), ({"hold_buckets": ["itl"]}, {"itl"})):
        source = PrometheusSource(config(**extra), mirror_lag=0.0)
        try:
            assert source.reader.mirror is not None and source.reader.mirror.buckets == kept, extra
        finally:
            source.close()
    with pytest.raises(ValidationError, match=r"hold_buckets\.0\n  Input should be 'ttft' or 'itl'"):
        config(hold_buckets=["prefill_time"])
