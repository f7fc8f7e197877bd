"""The service and a real Prometheus scrape the same engine: their percentiles agree.

Debian's Prometheus 2.42 scrapes a vLLM-format page every 500 ms; the service scrapes
the same page through its real scrape → parse → store path. The page changes once
(state A → state B). When both are asked about the window that starts at their last
sample of A and ends at their first sample of B, both see "the same two scrapes"
and must give the same p50/p90/p99, to 1e-9 relative.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer
from tests.support.prometheus import running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

COUNT = 'vllm:time_to_first_token_seconds_count{model_name="llama"}'


def sample_times(prom, value: float, at: float) -> list[float]:
    """Timestamps of Prometheus' samples of the TTFT count equal to ``value``."""
    result = prom.query(f"{COUNT}[1m]", time=at)["result"]
    return [float(ts) for ts, v in result[0]["values"] if float(v) == value]


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_service_percentiles_equal_prometheus_over_the_same_two_scrapes(service, tmp_path: Path) -> None:
    page = VllmPage(model="llama")
    page.observe(ttft=[0.02] * 7 + [0.3] * 3, itl=[0.015] * 40)
    with StaticPageServer(page.render()) as server, \
            running_prometheus(tmp_path / "prom", [server.url], scrape_interval="500ms") as prom:
        assert service.client.post("/api/v1/targets", json={"name": "v", "url": server.url}).status_code == 201
        prom.wait_for_samples(COUNT, 2, timeout=30)
        ours_a = service.scrape("v")
        time.sleep(0.6)  # let Prometheus take another sample of state A after ours
        page.observe(ttft=[0.05] * 13 + [0.7] * 21 + [1.8] * 6 + [9.0], itl=[0.03] * 300 + [0.12] * 45 + [0.6] * 5)
        server.page = page.render()
        ours_b = service.scrape("v")
        wait_until(lambda: sample_times(prom, 51.0, time.time()))
        now = time.time()
        prom_a = max(sample_times(prom, 10.0, now))
        prom_b = min(sample_times(prom, 51.0, now))
        window_ms = round((prom_b - prom_a) * 1000)
        answers = {}
        for signal, metric in (("ttft", "vllm:time_to_first_token_seconds"),
                               ("itl", "vllm:inter_token_latency_seconds")):
            for q in (0.5, 0.9, 0.99):
                res = prom.query(f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket[{window_ms}ms])))",
                                 time=prom_b)["result"]
                answers[(signal, q)] = float(res[0]["value"][1])
            res = prom.query(f"sum(increase({metric}_count[{window_ms}ms]))", time=prom_b)["result"]
            answers[(signal, "count")] = float(res[0]["value"][1])
    body = service.client.get("/api/v1/targets/v/latency", params={"start": ours_a.ts, "end": ours_b.ts}).json()
    assert answers[("ttft", "count")] == body["ttft"]["count"] == 41.0
    assert answers[("itl", "count")] == body["itl"]["count"] == 350.0
    for (signal, q), expected in answers.items():
        if q == "count":
            continue
        ours = body[signal][{0.5: "p50", 0.9: "p90", 0.99: "p99"}[q]]
        assert ours == pytest.approx(expected, rel=1e-9), (signal, q, ours, expected)
    # and the numbers are the interesting ones, not a degenerate case
    assert 0.5 < body["ttft"]["p50"] < 0.75 and 1.0 < body["ttft"]["p90"] <= 2.5
    assert 0.1 < body["itl"]["p99"] < 0.75
