"""A Prometheus source's answers with series that cannot be what the query reads: the reader drops
them with a named reason, the other targets' windows are exactly what they would be without them,
and nothing a round or a route does with the windows raises.

The answers come from :class:`ScriptedPrometheus`, which answers each of the reader's queries the
way a Prometheus holding two vLLM replicas (``good`` and ``bad``) would; hostile series are added
to ``bad``'s part of the answers (a bucket ``le="oops"``, a NaN scrape count, an altered family
tag, NaN and infinite values in any series, odd label values of the engine's info families)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from app import latency
from app.api.common import response_json
from app.api.routes.targets import TARGET_LATENCY_OUT
from app.core.thresholds import Thresholds
from app.diagnosis.engine import diagnose
from app.diagnosis.signals import DIAGNOSIS_HISTOGRAMS, from_window
from app.promsource.answers import BAD_SERIES_REASONS
from app.promsource.queries import (
    COUNTER_FAMILIES,
    FAMILY_LABEL,
    HISTOGRAM_FAMILIES,
    INFO_FAMILIES,
    JOB_LABEL,
    MODEL_LABEL,
    STAT_LABEL,
)
from app.promsource.reader import SourceReader
from app.sources.base import COUNTER_SIGNALS
from app.window import merge_windows

START, END = 1_800_000_000.0, 1_800_000_300.0
BOUNDS = ("0.01", "0.1", "1", "10", "+Inf")


@dataclass
class Sample:
    labels: dict[str, str]
    value: float


@dataclass
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class Answer:
    data: list[Any]
    warnings: list[str] = field(default_factory=list)


def kind_of(promql: str) -> str:
    """Which of the reader's queries this is (app/promsource/queries.py)."""
    if "timestamp(" in promql:
        return "first_seen"
    if "_bucket" in promql:
        return "histogram"
    if promql.startswith("group by"):
        return "presence"
    if "sum_over_time(up" in promql:
        return "scrapes"
    if "resets(" in promql:
        return "restarts"
    if "(up" in promql:
        return "up"
    if promql.startswith("{__name__=~"):
        return "infos"
    if STAT_LABEL in promql:
        return "stats"
    return "counter"


def split_combined(promql: str) -> list[tuple[str, str]] | None:
    """A combined request's (branch query, tag) pairs (one target's instant queries in one
    request, app/promsource/reader.py), else None."""
    if JOB_LABEL not in promql:
        return None
    return re.findall(rf'label_replace\((.*?), "{JOB_LABEL}", "(\d+)", "", ""\)(?: or |$)', promql)


def replica(pod: str, kind: str) -> list[Sample]:
    """One healthy vLLM replica's part of an answer of ``kind``."""
    own = {"namespace": "llm", "pod": pod}
    tagged = {**own, MODEL_LABEL: "m", FAMILY_LABEL: "0"}
    if kind == "histogram":
        return [*(Sample({**tagged, "le": le}, 10.0 * (i + 1)) for i, le in enumerate(BOUNDS)),
                Sample({**tagged, "le": "sum"}, 12.5), Sample({**tagged, "le": "count"}, 50.0)]
    if kind == "stats":  # gauges (last/avg/max), ranks (a gauge's name), ITL intervals (sum/count/running)
        return [Sample({**tagged, STAT_LABEL: stat, "engine": "0"}, value)
                for stat, value in (("last", 3.0), ("avg", 2.5), ("max", 4.0), ("running", 3.0), ("waiting", 1.0),
                                    ("kv_usage", 0.4), ("sum", 1.5), ("count", 60.0))]
    if kind == "counter":
        return [Sample(tagged, 0.5)]
    if kind == "presence":
        return [Sample({**own, "__name__": "vllm:num_requests_running"}, 1.0)]
    if kind == "infos":
        return [Sample({**tagged, "__name__": metric, "cpu_offload_gb": "0", "block_size": "16",
                        "sleep_state": "awake"}, 1.0) for _, metric in INFO_FAMILIES]
    if kind in ("up", "first_seen"):
        return [Sample(own, 1.0 if kind == "up" else START - 600.0)]
    if kind == "restarts":
        return [Sample(own, 0.0)]
    return [Sample(own, 20.0)]  # scrapes


Injection = tuple[str, int, tuple[str, str] | None, float | None]  # kind, which series, label, value


class ScriptedPrometheus:
    """The reader's query client, answering for ``good`` and ``bad``; ``injections`` add copies of
    ``bad``'s series with one label and/or the value replaced."""

    def __init__(self, injections: list[Injection] = ()) -> None:
        self.injections = list(injections)

    def _answer(self, kind: str) -> list[Sample]:
        data = replica("good", kind) + replica("bad", kind)
        own = replica("bad", kind)
        for inj_kind, index, label, value in self.injections:
            if inj_kind == kind:
                base = own[index % len(own)]
                labels = dict(base.labels) if label is None else {**base.labels, label[0]: label[1]}
                data.append(Sample(labels, base.value if value is None else value))
        return data

    def query(self, promql: str, time: float) -> Answer:
        parts = split_combined(promql)
        if parts is not None:
            return Answer([Sample({**s.labels, JOB_LABEL: tag}, s.value)
                           for branch, tag in parts for s in self.query(branch, time).data])
        return Answer(self._answer(kind_of(promql)))

    def query_range(self, promql: str, start: float, end: float, step: float) -> Answer:
        n = int(math.floor((end - start) / step + 1e-9)) + 1
        return Answer([Series(s.labels, [(start + i * step, s.value) for i in range(n)])
                       for s in self._answer(kind_of(promql))])

    def query_samples(self, selector: str, time: float) -> Answer:
        return Answer([])  # TGI's KV series: no TGI here

    def map(self, fn, items):
        return [fn(item) for item in items]

    def map_as_completed(self, fn, items):
        return [(i, fn(item)) for i, item in enumerate(items)]


def reader(injections: list[Injection] = ()) -> SourceReader:
    return SourceReader(ScriptedPrometheus(injections), ["namespace", "pod"], '{namespace="llm"}')


def expected_reason(kind: str, label: tuple[str, str] | None, value: float | None) -> str | None:
    """Why the windows' reading drops such a copy (None: it is read), but for a family tag, whose
    validity depends on how many candidate families each signal's query has."""
    if kind == "histogram" and label is not None and label[0] == "le" and label[1] not in ("sum", "count"):
        try:
            bound = float(label[1].replace("+Inf", "inf").replace("Inf", "inf"))
        except ValueError:
            return "bad_bound"
        return "bad_bound" if math.isnan(bound) else None
    if kind in ("scrapes", "restarts") and value is not None and not (math.isfinite(value) and value >= 0):
        return "bad_count"
    return None


def everything_downstream(r: SourceReader) -> None:
    """What rounds and routes do with a source's answers; every result must be JSON-safe."""
    r.discover(END)
    windows = r.windows(START, END, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    for window in windows.values():
        body = {"target": "t", "engine": "vllm", "window": "5m", **latency.report_from_window(window)}
        json.loads(response_json(TARGET_LATENCY_OUT, body, exclude_unset=True))
        for signals in from_window(window, "t", "vllm", None):
            json.dumps(diagnose(signals, Thresholds()).to_dict(), allow_nan=False)
            json.dumps(signals.to_dict(), allow_nan=False)
    merge_windows({"/".join(k): w for k, w in windows.items()}, START, END)
    r.histograms_over("ttft", [60.0, 300.0], END)
    r.first_seen("ttft", 3600.0, END)
    for q in (0.99, None):
        r.quantile_series("ttft", q, START, END, 60.0, 60.0, ("llm", "bad"))


def report(window) -> dict:
    return latency.report_from_window(window)


# --------------------------------------------------------------------------- examples

def test_a_bucket_le_oops_is_dropped_and_named() -> None:
    r = reader([("histogram", 0, ("le", "oops"), None)])
    windows = r.windows(START, END, ["ttft"], diagnosis=True)
    clean = reader().windows(START, END, ["ttft"], diagnosis=True)
    assert report(windows[("llm", "good")]) == report(clean[("llm", "good")])
    bad = windows[("llm", "bad")]
    assert bad.dropped == {("ttft", "bad_bound"): 1}
    assert report(bad)["dropped_series"] == [{"signal": "ttft", "reason": "bad_bound", "series": 1}]
    # without the bad bucket the window is the clean one: p99 over the five real buckets
    assert report(bad)["ttft"] == report(clean[("llm", "bad")])["ttft"]
    assert report(bad)["ttft"]["count"] == 50.0
    assert r.bad_series == Counter({"bad_bound": 1})


def test_a_nan_or_infinite_scrape_count_is_dropped() -> None:
    for value in (math.nan, math.inf, -math.inf, -1.0):
        r = reader([("scrapes", 0, None, value)])
        windows = r.windows(START, END, ["ttft"], diagnosis=True)
        assert windows[("llm", "good")].scrapes == 20
        assert windows[("llm", "bad")].scrapes == 20  # its valid count is kept, the copy dropped
        assert windows[("llm", "bad")].dropped == {("scrapes", "bad_count"): 1}
        assert r.bad_series == Counter({"bad_count": 1})


def test_an_altered_family_tag_is_dropped() -> None:
    r = reader([("histogram", 2, (FAMILY_LABEL, "x"), None), ("histogram", 1, (FAMILY_LABEL, "9999"), None),
                ("counter", 0, (FAMILY_LABEL, "-1"), None)])
    windows = r.windows(START, END, ["ttft"], diagnosis=True)
    counters = [s for s in COUNTER_SIGNALS if COUNTER_FAMILIES.get(s)]
    assert windows[("llm", "bad")].dropped == dict(sorted(
        {("ttft", "bad_label"): 2, **{(s, "bad_label"): 1 for s in counters}}.items()))
    assert r.bad_series == Counter({"bad_label": 2 + len(counters)})
    assert report(windows[("llm", "good")]) == report(reader().windows(START, END, ["ttft"], diagnosis=True)[
        ("llm", "good")])


def test_quantile_series_and_slo_histograms_drop_bad_buckets() -> None:
    r = reader([("histogram", 0, ("le", "NaN"), None)])
    clean = reader()
    assert r.quantile_series("ttft", 0.99, START, END, 60.0, 60.0, ("llm", "bad")) == \
        clean.quantile_series("ttft", 0.99, START, END, 60.0, 60.0, ("llm", "bad"))
    assert r.histograms_over("ttft", [300.0], END) == clean.histograms_over("ttft", [300.0], END)
    assert r.bad_series["bad_bound"] == 2  # once in each


# --------------------------------------------------------------------------- any hostile answer

KINDS = ("histogram", "stats", "counter", "scrapes", "restarts", "presence", "up", "infos", "first_seen")
LABELS = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["le", FAMILY_LABEL, STAT_LABEL, MODEL_LABEL, "engine", "cpu_offload_gb",
                               "block_size", "sleep_state", "__name__"]),
              st.one_of(st.sampled_from(["oops", "", "NaN", "-Inf", "+Inf", "1e999", "0", "99", "-1", "x",
                                         "weights_offloaded", "sum", "count", "\x00", "1e-320"]),
                        st.text(max_size=8))))
VALUES = st.one_of(st.none(), st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, 1e308, 5e-324]),
                   st.floats(allow_nan=True, allow_infinity=True))
INJECTIONS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 20), LABELS, VALUES), max_size=6)


@settings(max_examples=300, deadline=None)
@given(INJECTIONS)
@example([("histogram", 6, None, 5e-324)])  # a subnormal TTFT count: its rate over the window is 0, no division
def test_no_hostile_answer_escapes_and_the_other_target_is_untouched(injections: list[Injection]) -> None:
    r = reader(injections)
    everything_downstream(r)  # raises nothing
    r = reader(injections)
    windows = r.windows(START, END, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    clean = reader().windows(START, END, DIAGNOSIS_HISTOGRAMS, diagnosis=True)
    good = windows[("llm", "good")]
    assert report(good) == report(clean[("llm", "good")])
    assert good.dropped == {} and good.scrapes == 20 and good.restarts == 0
    # every series dropped is counted once by the reader and named in its target's window
    named = Counter()
    for (_, reason), n in windows[("llm", "bad")].dropped.items():
        named[reason] += n
    assert set(named) <= set(BAD_SERIES_REASONS) and r.bad_series == named
    # a bucket copy whose le is not a number is dropped from each histogram query, a bad scrape count once
    histograms = [s for s in DIAGNOSIS_HISTOGRAMS if s in HISTOGRAM_FAMILIES]
    for kind, _, label, value in injections:
        reason = expected_reason(kind, label, value)
        if reason == "bad_bound":
            assert all(windows[("llm", "bad")].dropped.get((s, "bad_bound"), 0) >= 1 for s in histograms)
        elif reason == "bad_count":
            assert windows[("llm", "bad")].dropped[(kind, "bad_count")] >= 1
    if not any(expected_reason(k, lb, v) for k, _, lb, v in injections):
        assert named.keys() <= {"bad_label"}  # only a family tag the query could not have set
