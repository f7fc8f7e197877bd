"""PrometheusClient against a real Prometheus 2.42 and a real VictoriaMetrics single node,
both scraping emulated vLLM engines discovered through a file_sd target file.

Each answer must equal what the server's API returns for the same request read directly
(label sets and float values exactly; NaN equal to NaN). One Prometheus, one
VictoriaMetrics and one fleet serve the whole module; the discovery and restart tests run
last because they change the targets and stop Prometheus for a moment.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.emulator.server import EmulatorFleet, TargetSpec
from app.promql.client import PromAPIError, PrometheusClient
from app.promsource.reader import FIRST_SEEN_STEP, SourceReader
from tests.support.prometheus import FileSD, PrometheusHandle, running_prometheus
from tests.support.victoria_metrics import running_victoria_metrics

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

TTFT = "vllm:time_to_first_token_seconds_bucket"


@dataclass
class Stack:
    fleet: EmulatorFleet
    sd: FileSD
    servers: dict[str, PrometheusHandle]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("promapi")
    with EmulatorFleet([TargetSpec("a", "healthy"), TargetSpec("b", "healthy", seed=1)]) as fleet:
        sd = FileSD(tmp / "targets.json")
        sd.set({"a": fleet.urls["a"]}, namespace="llm")
        with running_prometheus(tmp / "prom", sd.scrape_configs()) as prom, \
                running_victoria_metrics(tmp / "vm", sd.scrape_configs(refresh_interval=None)) as vm:
            # VictoriaMetrics makes new series visible after up to ~10 s: generous timeouts
            for server in (prom, vm):
                server.wait_for_samples(f'{TTFT}{{pod="a",le="+Inf"}}', 5, timeout=90)
            yield Stack(fleet, sd, {"prometheus": prom, "victoria-metrics": vm})


@pytest.fixture(params=["prometheus", "victoria-metrics"])
def server(request: pytest.FixtureRequest, stack: Stack) -> PrometheusHandle:
    return stack.servers[request.param]


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def direct_vector(data: dict[str, Any]) -> dict[tuple[tuple[str, str], ...], float]:
    assert data["resultType"] == "vector"
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}


def now_ms() -> float:
    return round(time.time() - 1.0, 3)


@pytest.mark.parametrize("promql", [
    f'{TTFT}{{namespace="llm"}}',
    'sum by (pod, le) (rate(vllm:time_to_first_token_seconds_bucket{namespace="llm"}[10s]))',
    "vector(1) / 0",
    "-vector(1) / 0",
    "42.5",
])
def test_query_equals_api(server: PrometheusHandle, promql: str) -> None:
    t = now_ms()
    with PrometheusClient(server.url) as client:
        result = client.query(promql, t)
        assert client.queries == 1
    data = server.query(promql, time=t)
    expected = ({(): float(data["result"][1])} if data["resultType"] == "scalar" else direct_vector(data))
    got = {tuple(sorted(s.labels.items())): s.value for s in result.data}
    assert got.keys() == expected.keys() and len(got) >= 1
    assert all(same(got[k], expected[k]) for k in got)
    assert result.warnings == []
    if promql.startswith(TTFT):
        assert {s.labels["pod"] for s in result.data} == {"a"} and len(result.data) >= 10
        assert {s.labels["namespace"] for s in result.data} == {"llm"}
    if promql.endswith("/ 0"):
        assert got[()] == (math.inf if promql[0] != "-" else -math.inf)


def test_nan_value_from_prometheus(stack: Stack) -> None:
    with PrometheusClient(stack.servers["prometheus"].url) as client:
        (sample,) = client.query("vector(0) / 0", now_ms()).data
    assert math.isnan(sample.value)


def test_query_range_equals_api(server: PrometheusHandle) -> None:
    end = now_ms()
    start, step = end - 6.0, 0.5
    promql = f'sum by (pod) (increase({TTFT}{{le="+Inf"}}[5s]))'
    with PrometheusClient(server.url) as client:
        series = client.query_range(promql, start, end, step).data
    data = server.query_range(promql, start, end, step)
    expected = {tuple(sorted(r["metric"].items())): [(float(t), float(v)) for t, v in r["values"]]
                for r in data["result"]}
    got = {tuple(sorted(s.labels.items())): s.points for s in series}
    assert got == expected and set(got) == {(("pod", "a"),)}
    points = got[(("pod", "a"),)]
    assert len(points) >= 3 and all(start <= t <= end for t, _ in points)  # >= 5 samples scraped
    assert [t for t, _ in points] == sorted(t for t, _ in points)


def test_series_equals_api(server: PrometheusHandle) -> None:
    end = now_ms()
    matchers = [f'{TTFT}{{namespace="llm",le="+Inf"}}', 'up{job="engines"}']
    with PrometheusClient(server.url) as client:
        got = client.series(matchers, end - 30, end)
    direct = server.api("series", **{"match[]": matchers}, start=str(end - 30), end=str(end))
    key = sorted
    assert key(tuple(sorted(d.items())) for d in got) == key(tuple(sorted(d.items())) for d in direct)
    assert sorted(d["__name__"] for d in got) == sorted([TTFT, "up"])
    assert all(d["pod"] == "a" and d["namespace"] == "llm" for d in got)


def test_check_selector_uses_the_servers_parser(server: PrometheusHandle) -> None:
    with PrometheusClient(server.url) as client:
        assert client.check_selector('{namespace="llm"}') is None
        assert client.check_selector('{namespace="no-such-namespace"}') is None  # valid, matches nothing
        bad = client.check_selector('{namespace=~"("}')
        assert bad is not None and bad.startswith("selector rejected")
        assert client.check_selector("sum(up)") is not None  # not a selector
        assert client.queries == 4


def test_bad_query_and_too_large(server: PrometheusHandle) -> None:
    with PrometheusClient(server.url, max_response_bytes=2000) as client:
        with pytest.raises(PromAPIError) as info:
            client.query("sum(", now_ms())
        assert info.value.kind == "bad_query"
        assert info.value.message.startswith("query rejected")
        with pytest.raises(PromAPIError) as info:
            client.query(TTFT, now_ms())  # ~15 buckets of ~300 bytes each
        assert (info.value.kind, info.value.message) == ("too_large", "answer larger than 2000 bytes")




def test_build_info_prometheus_and_victoria_metrics(stack: Stack) -> None:
    with PrometheusClient(stack.servers["prometheus"].url) as client:
        info = client.build_info()
    assert info is not None and info["version"].startswith("2.42.")
    with PrometheusClient(stack.servers["victoria-metrics"].url) as client:
        assert client.build_info() is None  # an empty stub there


def test_victoria_metrics_answers_histogram_quantile(stack: Stack) -> None:
    promql = f"histogram_quantile(0.99, sum by (le)(increase({TTFT}[1m])))"
    vm = stack.servers["victoria-metrics"]
    with PrometheusClient(vm.url) as client:
        (sample,) = client.query(promql, now_ms()).data
    assert math.isfinite(sample.value) and 0 < sample.value < 60
    assert sample.labels == {}


def test_first_seen_is_within_a_step_of_the_first_sample(server: PrometheusHandle) -> None:
    """Where a replica's data begins (the SLOs' coverage of a source, app/promsource/slo.py): both
    servers answer the subquery, within one 4 m step after the first raw sample they hold."""
    t = now_ms()
    raw = server.query('vllm:time_to_first_token_seconds_count{pod="a"}[1h]', time=t)["result"]
    first_sample = min(float(ts) for series in raw for ts, _ in series["values"])
    with PrometheusClient(server.url) as client:
        seen = SourceReader(client, ["pod"], '{namespace="llm"}').first_seen("ttft", 3600.0, t)
    assert set(seen) == {("a",)}, seen
    assert first_sample <= seen[("a",)] <= first_sample + FIRST_SEEN_STEP, (first_sample, seen)


def test_map_runs_one_query_per_signal(stack: Stack) -> None:
    prom = stack.servers["prometheus"]
    signals = [f"sum({TTFT})", "sum(vllm:num_requests_running)", "sum(vllm:num_requests_waiting)", "count(up)"]
    t = now_ms()
    with PrometheusClient(prom.url, max_concurrency=2) as client:
        results = client.map(lambda q: client.query(q, t).data, signals)
        assert client.queries == len(signals)
    assert [[s.value for s in r] for r in results] == [
        [float(x["value"][1]) for x in prom.query(q, time=t)["result"]] for q in signals]
    assert results[3][0].value == 1.0  # one target discovered


def wait_until(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def test_file_sd_adds_and_removes_targets(stack: Stack) -> None:
    stack.sd.set({"a": stack.fleet.urls["a"], "b": stack.fleet.urls["b"]}, namespace="llm")
    clients = {name: PrometheusClient(h.url) for name, h in stack.servers.items()}
    try:
        def pods(name: str) -> set[str]:
            samples = clients[name].query('up{job="engines"} == 1', time.time()).data
            return {s.labels["pod"] for s in samples}

        for name in clients:
            assert wait_until(lambda n=name: pods(n) == {"a", "b"}, 60, f"{name} to discover b") is True
        series = clients["prometheus"].series([f'{TTFT}{{le="+Inf"}}'], time.time() - 5, time.time())
        assert sorted(s["pod"] for s in series) == ["a", "b"]
        stack.sd.set({"a": stack.fleet.urls["a"]}, namespace="llm")
        # Prometheus writes stale markers for a removed target: its series end at once
        assert wait_until(lambda: pods("prometheus") == {"a"}, 30, "prometheus to drop b") is True
    finally:
        for c in clients.values():
            c.close()


@pytest.mark.parametrize("name", ["prometheus", "victoria-metrics"])
def test_stopped_and_restarted_keeps_port_and_history(stack: Stack, name: str) -> None:
    server = stack.servers[name]
    url, selector = server.url, f'{TTFT}{{pod="a",le="+Inf"}}'
    with PrometheusClient(url, timeout=5) as client:
        before = client.query(f"count_over_time({selector}[1h])", time.time()).data[0].value
        server.stop()
        with pytest.raises(PromAPIError) as info:
            client.query("up", time.time())
        assert (info.value.kind, info.value.message) == ("unreachable", "connection refused")
        server.start()
        assert server.url == url and server.running
        after = client.query(f"count_over_time({selector}[1h])", time.time()).data[0].value
    assert after >= before >= 5  # the same data dir: nothing scraped before the outage is lost
