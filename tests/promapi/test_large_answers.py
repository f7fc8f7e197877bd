"""Huge answers from a Prometheus API cost memory in proportion to what is kept, not to their size:
an answer past max_series/max_samples is refused (too_large, naming the limit) as soon as the limit
is passed, decoded one series at a time when large; a round goes on without it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from app.promql.client import STREAM_FROM_BYTES, PromAPIError, PrometheusClient
from app.promsource.queries import FAMILY_LABEL, MODEL_LABEL
from app.promsource.reader import SourceReader
from tests.promapi.local_api import Answer, LocalAPI, Received
from tests.promsource.test_hostile_answers import END, START, ScriptedPrometheus, kind_of


def _vector(n: int, pad: int = 0) -> bytes:
    """An instant-vector answer of ``n`` series (``pad`` characters of label value each)."""
    value = "x" * pad
    items = ",".join(f'{{"metric":{{"pod":"p{i}","v":"{value}"}},"value":[1800000000,"1"]}}' for i in range(n))
    return ('{"status":"success","data":{"resultType":"vector","result":[' + items + "]}}").encode()


@pytest.fixture(scope="module")
def huge() -> Iterator[LocalAPI]:
    bodies = {"many": _vector(1_000_000), "big": _vector(400_000, pad=80), "fits": _vector(1000)}

    def answer(request: Received) -> Answer:
        return Answer(body=bodies[request.params["query"][0]])

    with LocalAPI(answer) as api:
        yield api


PEAK = """
import sys
from app.promql.client import PrometheusClient, PromAPIError
def peak():  # the process' high-water mark of resident memory, MB
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM")) // 1024
client = PrometheusClient(sys.argv[1], timeout=60)
before = peak()
try:
    client.query(sys.argv[2], 1800000000)
    outcome = "answered"
except PromAPIError as exc:
    outcome = f"{exc.kind}: {exc.message}"
print(outcome)
print(peak() - before)
"""


@pytest.mark.parametrize("query", ["many", "big"])
def test_a_huge_answer_is_refused_with_memory_bounded(huge: LocalAPI, query: str) -> None:
    """A fresh process asks for a 53-58 MiB answer (1,000,000 small series; 400,000 larger ones):
    its resident memory grows by the body plus 200,000 decoded series, about 140-160 MB (the whole
    document decoded at once took 470-890 MB)."""
    done = subprocess.run([sys.executable, "-c", PEAK, huge.url, query], capture_output=True, text=True, check=True,
                          timeout=300)
    outcome, grown = done.stdout.split("\n")[:2]
    assert outcome == "too_large: the answer holds more than 200000 series (max_series)", done.stderr
    assert int(grown) < 250, (query, grown)


def test_answers_within_the_limits_are_read_whole(huge: LocalAPI) -> None:
    with PrometheusClient(huge.url) as client:
        assert len(client.query("fits", 1.0).data) == 1000
    with PrometheusClient(huge.url, max_series=999) as client, pytest.raises(PromAPIError) as caught:
        client.query("fits", 1.0)
    assert caught.value.kind == "too_large" and "more than 999 series (max_series)" in caught.value.message


class _TooManyBuckets(ScriptedPrometheus):
    """The TTFT histogram's answer holds 30 more series than any other."""

    def query(self, promql: str, time: float):
        answer = super().query(promql, time)
        if "time_to_first_token_seconds_bucket" in promql:
            answer.data += [type(answer.data[0])({"namespace": "llm", "pod": f"x{i}", MODEL_LABEL: "m",
                                                  FAMILY_LABEL: "0", "le": "1"}, 1.0) for i in range(30)]
        return answer


def test_a_round_goes_on_without_a_refused_answer() -> None:
    body_of = {}

    def answer(request: Received) -> Answer:
        promql = request.params["query"][0]
        samples = _TooManyBuckets().query(promql, 0.0).data if kind_of(promql) != "infos" else []
        if promql.endswith("]"):
            return Answer(body=b'{"status":"success","data":{"resultType":"matrix","result":[]}}')
        body_of[promql] = len(samples)
        return Answer(body=json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": s.labels, "value": [END, repr(s.value)]} for s in samples]}}).encode())

    with LocalAPI(answer) as api, PrometheusClient(api.url, max_series=20) as client:
        reader = SourceReader(client, ["namespace", "pod"], '{namespace="llm"}')
        windows = reader.windows(START, END, ["ttft", "itl"])
    good = windows[("llm", "good")].overall
    assert "ttft" not in good.histograms and good.histograms["itl"].count == 50.0
    assert reader.refused == {"ttft": "the answer holds more than 20 series (max_series)"}


def test_a_large_answers_warnings_are_read_wherever_they_are_written() -> None:
    """An answer past STREAM_FROM_BYTES is decoded one series at a time; its warnings (Thanos'
    and Mimir's partial answers say so there) are read after the data, also when the key is
    written with a JSON escape, and a body without the key has none."""
    series = _vector(60_000, pad=40)
    assert len(series) > STREAM_FROM_BYTES
    bodies = {"none": series,
              "after": series[:-1] + b',"warnings":["partial: store eu-1 is down"]}',
              "escaped": series[:-1] + b',"\\u0077arnings":["partial: store eu-2 is down"]}',
              "before": b'{"status":"success","warnings":["partial: 1 of 3 stores"],'
                        + series[len(b'{"status":"success",'):]}

    def answer(request: Received) -> Answer:
        return Answer(body=bodies[request.params["query"][0]])

    with LocalAPI(answer) as api:
        client = PrometheusClient(api.url, timeout=60)
        try:
            found = {name: client.query(name, 1800000000) for name in bodies}
        finally:
            client.close()
    assert {name: len(result.data) for name, result in found.items()} == dict.fromkeys(bodies, 60_000)
    assert {name: result.warnings for name, result in found.items()} == {
        "none": [], "after": ["partial: store eu-1 is down"], "escaped": ["partial: store eu-2 is down"],
        "before": ["partial: 1 of 3 stores"]}
