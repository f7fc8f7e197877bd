"""trtllm-serve's two endpoints: its ``/metrics`` answers a JSON array of iteration statistics and its
Prometheus page is ``/prometheus/metrics``. A target pointed at the JSON is recognised and every place
that reports it (the scrape record, the targets API for static and discovered targets, check-config,
``diagnose``) names the page to scrape instead; ``engine: auto`` on the Prometheus page finds
TensorRT-LLM, also before the first request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.diagnosis import oneshot
from app.scrape.jobs import NO_ENGINE_METRICS, PageProcessor
from app.sources import trtllm
from app.store.record import ScrapeRecord
from tests.scrape.test_discovery import refresh_all, start_service, targets, write_groups
from tests.support.pages import StaticPageServer

EXPOSITION = Path(__file__).parents[1] / "fixtures" / "exposition"
ITERATION_STATS = (EXPOSITION / "trtllm-serve-iteration-stats-constructed.json").read_bytes()
PROMETHEUS_PAGE = (EXPOSITION / "trtllm-serve-constructed.prom").read_bytes()
#: trtllm-serve's /prometheus/metrics before its first request: only the counter MetricsCollector
#: creates with its labels at start (prometheus_client multiprocess mode lists nothing else yet)
IDLE_PAGE = ("# HELP trtllm_prompt_cached_tokens_total Process-lifetime total prompt tokens served from KV cache.\n"
             "# TYPE trtllm_prompt_cached_tokens_total counter\n"
             'trtllm_prompt_cached_tokens_total{engine_type="undefined",model_name="undefined"} 0.0\n')


def fixes_the_url(message: str | None) -> bool:
    """The message names the page, the switch that serves it and the one its gauges need."""
    return message is not None and all(part in message for part in (
        "/prometheus/metrics", "return_perf_metrics: true", "enable_iter_perf_stats: true"))


def test_the_recorded_iteration_stats_are_recognised_from_their_first_element() -> None:
    stats = json.loads(ITERATION_STATS)
    assert [s["iter"] for s in stats] == [15231, 15232] and stats[0]["numActiveRequests"] == 24
    assert trtllm.is_iteration_stats(ITERATION_STATS)
    assert trtllm.is_iteration_stats(b"[]") and trtllm.is_iteration_stats(b" [ ]\n")  # nothing since the last read
    # only the first element is decoded: whatever follows it is never read
    assert trtllm.is_iteration_stats(ITERATION_STATS[:-1] + b"," + b"x" * 5_000_000)
    for other in (PROMETHEUS_PAGE, b"[1, 2]", b'[{"status": "ok"}]', b'{"iter": 1}', b"[" + b'{"a":' * 50_000,
                  b"[" + ITERATION_STATS[1:-1] * 0 + b'{"iter": 1, "iterLatencyMS": 2, "numActiveRequests": 3, "x": "'
                  + b"y" * trtllm.SNIFF_BYTES + b'"}]', b"[]" + b" " * trtllm.SNIFF_BYTES + b"x"):
        assert not trtllm.is_iteration_stats(other), other[:80]


@pytest.mark.parametrize("engine", ["auto", "trtllm", "vllm"])
def test_the_json_answer_is_a_wrong_endpoint_whatever_the_configured_engine(engine: str) -> None:
    page, canonical, error = PageProcessor(engine).process(ITERATION_STATS)
    assert (page.families, page.samples_seen, canonical, error) == ({}, 0, None, "wrong_endpoint")


def test_auto_detects_trtllm_on_its_prometheus_page_also_before_the_first_request() -> None:
    processor = PageProcessor()
    page, canonical, error = processor.process(IDLE_PAGE)
    assert (processor.engine, canonical, error) == ("trtllm", None, "no_engine_metrics")
    page, canonical, error = processor.process(PROMETHEUS_PAGE)  # after requests: the same processor reads it
    assert error is None and canonical is not None and canonical.engine == "trtllm"
    assert {h.signal for h in canonical.histograms} >= {"ttft", "queue_time", "prefill_time"}


@pytest.fixture(scope="module")
def trtllm_serve() -> Iterator[tuple[StaticPageServer, StaticPageServer]]:
    """trtllm-serve's /metrics (JSON) and /prometheus/metrics (each served by its own server)."""
    with StaticPageServer(ITERATION_STATS, content_type="application/json") as json_metrics, \
            StaticPageServer(PROMETHEUS_PAGE, path="/prometheus/metrics") as prometheus:
        yield json_metrics, prometheus


def test_scrapes_of_static_and_discovered_targets_name_the_page(tmp_path: Path, trtllm_serve) -> None:
    json_metrics, prometheus = trtllm_serve
    (tmp_path / "sd.json").write_text("[]")
    write_groups(tmp_path / "sd.json", [{"targets": [json_metrics.host_port]}])
    config = ("targets:\n"
              f"  - {{name: trt-json, url: '{json_metrics.url}'}}\n"
              f"  - {{name: trt-page, url: '{prometheus.url}'}}\n"
              "file_sd_configs:\n  - files: [sd.json]\n")
    service = start_service(tmp_path, config)
    client, monitor = next(service)
    try:
        refresh_all(client, monitor)
        discovered = next(name for name, t in targets(client).items() if t["source"] == "file_sd")
        records: dict[str, ScrapeRecord] = {name: client.portal.call(monitor.scraping.scrape_now, name)
                                            for name in ("trt-json", "trt-page", discovered)}
        client.portal.call(monitor.scraping.flush)
        shown = targets(client)
    finally:
        next(service, None)
    for name in ("trt-json", discovered):
        record = records[name]
        assert (record.up, record.error_class, record.engine, record.samples_seen) == (False, "wrong_endpoint",
                                                                                       "trtllm", 0)
        assert record.error == trtllm.WRONG_ENDPOINT and fixes_the_url(record.error)
        assert json_metrics.host_port not in record.error  # no URL: every API reader sees it
        last = shown[name]["last_scrape"]
        assert (last["up"], last["error_class"], last["engine"]) == (False, "wrong_endpoint", "trtllm")
        assert last["error"] == trtllm.WRONG_ENDPOINT
    page = records["trt-page"]
    assert (page.up, page.error_class, page.engine) == (True, None, "trtllm")
    assert page.canonical is not None and page.samples_kept > 100
    assert shown["trt-page"]["last_scrape"]["engine"] == "trtllm"


def test_a_page_without_any_engine_says_so_for_every_engine_it_knows() -> None:
    assert "TensorRT-LLM" in NO_ENGINE_METRICS and "cannot be diagnosed from metrics" in NO_ENGINE_METRICS


def test_check_config_refuses_the_json_endpoint_and_names_the_page(tmp_path: Path, trtllm_serve) -> None:
    json_metrics, prometheus = trtllm_serve
    (tmp_path / "sd.json").write_text(json.dumps([{"targets": [json_metrics.host_port]}]))
    path = tmp_path / "targets.yaml"
    path.write_text("targets:\n"
                    f"  - name: page\n    url: {prometheus.url}\n"
                    f"  - name: json\n    url: {json_metrics.url}\n"
                    "  - name: down\n    url: http://127.0.0.1:1/metrics\n"
                    "file_sd_configs:\n  - files: [sd.json]\n")
    result = CliRunner().invoke(main, ["check-config", str(path)])
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 3  # the Prometheus page is fine
    assert lines[0] == f"{path}:5: targets[1].url: {trtllm.WRONG_ENDPOINT}"
    assert lines[1].startswith(f"{path}:7: warning: targets[2].url: not scrapable now: connect: cannot connect")
    assert lines[2] == f"{path}: file_sd_configs[0] target {json_metrics.host_port}: {trtllm.WRONG_ENDPOINT}"
    offline = CliRunner().invoke(main, ["check-config", "--offline", str(path)])
    assert (offline.exit_code, offline.stderr) == (0, "")
    assert offline.stdout == f"{path}: OK, 3 target(s), 0 receiver(s), 1 discovery config(s) (1 target(s) in the " \
                             "files now)\n"


def test_diagnose_exits_unreachable_with_the_prometheus_url_as_its_hint(trtllm_serve) -> None:
    json_metrics, _ = trtllm_serve
    result = oneshot.run(json_metrics.url, window=1.0, interval=1.0)
    assert (result.exit_code, result.engine, len(result.scrapes)) == (oneshot.EXIT_UNREACHABLE, "trtllm", 1)
    assert result.hint == (f"did you mean {json_metrics.base_url}/prometheus/metrics? (trtllm-serve serves it "
                           "with return_perf_metrics: true)")
    text = oneshot.format_text(result)
    assert f"scrape problem: wrong_endpoint: {trtllm.WRONG_ENDPOINT}" in text and result.hint in text
    assert result.to_dict()["last_error"] == ("wrong_endpoint", trtllm.WRONG_ENDPOINT)
