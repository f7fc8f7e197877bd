"""A Prometheus source's queries name SGLang and trtllm-serve families, stay within the round's
query budget, and read SGLang's millisecond KV-transfer histogram in seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS
from app.promsource.queries import COUNTER_FAMILIES, FAMILY_LABEL, GAUGE_FAMILIES, HISTOGRAM_FAMILIES, SourceQueries
from app.promsource.reader import SourceReader


@dataclass
class _Sample:
    labels: dict[str, str]
    value: float


@dataclass
class _Answer:
    data: list[Any] = field(default_factory=list)


class FakeClient:
    """Answers the one SGLang transfer family (index of ``sglang:kv_transfer_latency_ms``) to the
    queries that name ``answered`` (its buckets, by default), nothing else."""

    def __init__(self, samples: list[_Sample], answered: str = "sglang:kv_transfer_latency_ms_bucket") -> None:
        self.samples, self.answered = samples, answered
        self.queries: list[str] = []

    def query(self, promql: str, time: float) -> _Answer:
        self.queries.append(promql)
        return _Answer(self.samples if self.answered in promql else [])

    def query_range(self, promql: str, start: float, end: float, step: float) -> _Answer:
        self.queries.append(promql)
        return _Answer()

    def query_samples(self, selector: str, time: float) -> _Answer:
        self.queries.append(selector)
        return _Answer()

    def map(self, fn, items):
        return [fn(item) for item in items]

    def map_as_completed(self, fn, items):
        """As ``PrometheusClient.map_as_completed`` with calls finishing in item order:
        ``(index, result)`` as each call ends; after a failure every remaining call still
        runs, then the first error is raised and nothing after it is yielded."""
        items = list(items)
        for i, item in enumerate(items):
            try:
                result = fn(item)
            except Exception as error:
                for rest in items[i + 1:]:
                    try:
                        fn(rest)
                    except Exception:
                        pass
                raise error
            yield i, result


def test_every_engine_is_in_the_queries() -> None:
    engines = {f.engine for families in HISTOGRAM_FAMILIES.values() for f in families}
    assert engines == {"vllm", "tgi", "sglang", "trtllm"}
    assert [f.name for f in GAUGE_FAMILIES["running"]] == [
        "vllm:num_requests_running", "sglang:num_running_reqs", "sglang:num_requests_running",
        "trtllm_num_requests_running", "trtllm:num_requests_running", "tgi_batch_current_size"]
    names = {f.name for f in HISTOGRAM_FAMILIES["kv_transfer_time"]}
    assert names == {"vllm:nixl_xfer_time_seconds",
                     "trtllm_kv_transfer_latency_seconds", "trtllm:kv_transfer_latency_seconds",
                     "sglang:kv_transfer_latency_ms", "sglang:per_stage_req_latency_seconds"}
    assert [f.name for f in COUNTER_FAMILIES["kv_transfer_failures_total"]] == [
        "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_transfers",
        "sglang:num_transfer_failed_reqs_total", "trtllm_kv_transfer_failure_total", "trtllm:kv_transfer_failure_total"]
    text = SourceQueries(("pod",)).histogram("kv_transfer_time", 60)
    assert 'sglang:per_stage_req_latency_seconds_bucket{stage="prefill_transfer_kv_cache"}' in text


def test_a_diagnosis_round_stays_within_the_query_budget() -> None:
    client = FakeClient([])
    SourceReader(client, ["pod"]).windows(0.0, 60.0, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    # 38 per-signal queries (histograms incl. tpot, kv_transfer_time, render_time and SGLang's decode-side
    # kv_wait_time, prealloc_time and kv_alloc_time; gauges incl. its transfer and prealloc queues; counters incl.
    # spec_drafts_total and SGLang's four scheduler-time counters), TGI's raw KV samples, scrapes, counter resets
    # (restarts), configuration, per-rank loads, the ITL split: 44, and discovery's presence and up make a round 46
    assert len(client.queries) == 44
    assert all(q for q in client.queries)  # a signal no engine exports is not queried (no empty query)


def test_sglang_milliseconds_are_read_as_seconds() -> None:
    index = next(i for i, f in enumerate(HISTOGRAM_FAMILIES["kv_transfer_time"])
                 if f.name == "sglang:kv_transfer_latency_ms")
    tag = {FAMILY_LABEL: str(index), "pod": "p0", "model_name": "m"}
    samples = [_Sample({**tag, "le": le}, v) for le, v in (("1.0", 0), ("5.0", 10), ("50.0", 18), ("1000.0", 20),
                                                            ("+Inf", 20), ("sum", 1750.0), ("count", 20))]
    windows = SourceReader(FakeClient(samples), ["pod"]).windows(0.0, 60.0, ("kv_transfer_time",))
    h = windows[("p0",)].models["m"].histograms["kv_transfer_time"]
    assert h.bounds == (0.001, 0.005, 0.05, 1.0, math.inf)
    assert h.sum == pytest.approx(1.75) and h.count == 20


def test_sglang_speculation_gauges_count_only_while_speculating() -> None:
    """SGLang writes spec_accept_rate / _length as 0 with speculation off; its adapter drops those series and a
    source's query keeps a series only while the accept length stayed above 0 (else every SGLang target without
    speculation would read a 0 % acceptance)."""
    text = SourceQueries(("pod",), (("namespace", "=", "llm"),)).gauge("spec_accept_rate", 60)
    assert ('(avg_over_time(sglang:spec_accept_rate{namespace="llm"}[1m]) and '
            '(min_over_time(sglang:spec_accept_length{namespace="llm"}[1m]) > 0))') in text
    vllm_like = SourceQueries(("pod",)).gauge("running", 60)
    assert "min_over_time" not in vllm_like


def test_a_rounds_bucket_query_asks_only_the_families_its_means_came_from() -> None:
    """Every branch of a query costs the server, even one that matches nothing. A round reads
    means first; the buckets a target then needs can only be of the family its means came from
    (a family before it would have answered the means too), so only that family is asked - 2 of
    5 KV-transfer families' names here, SGLang's, where the means-first query named all 5."""
    index = next(i for i, f in enumerate(HISTOGRAM_FAMILIES["kv_transfer_time"])
                 if f.name == "sglang:kv_transfer_latency_ms")
    tag = {FAMILY_LABEL: str(index), "pod": "p0", "model_name": "m"}
    client = FakeClient([_Sample({**tag, "le": le}, v) for le, v in (("sum", 1750.0), ("count", 20))],
                        answered="sglang:kv_transfer_latency_ms_sum")  # the means-first query too
    reader = SourceReader(client, ["pod"])
    reader.round_windows(0.0, 60.0, ("kv_transfer_time",), lambda key, window: {"kv_transfer_time"})
    means, buckets = [q for q in client.queries if "sglang:kv_transfer_latency_ms_sum" in q]
    assert "vllm:nixl_xfer_time_seconds_sum" in means and "trtllm_kv_transfer_latency_seconds_sum" in means
    assert "sglang:kv_transfer_latency_ms_bucket" in buckets and "_bucket" not in means
    assert "vllm:" not in buckets and "trtllm" not in buckets and "per_stage" not in buckets
    assert reader.buckets_read == {"kv_transfer_time": 1}
