"""A source's scrape interval and the diagnosis window that follows, without a Prometheus: the
``/api/v1/targets`` answer decoded target by target (scripted servers, hostile ones included),
the interval chosen from the targets that carry the engines, the window made whole intervals,
the config key, and ``check-config`` offline on a configured interval and on static targets.

The same against a real Prometheus 2.42 scraping at 30 s: test_scrape_interval_live.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from app.cli import main
from app.promql.client import ActiveTarget, PromAPIError, PrometheusClient
from app.promsource import intervals
from app.promsource.config import PrometheusSourceConfig
from tests.promapi.local_api import Answer, LocalAPI, Received

LEAK = "LEAKED-SERVER-TEXT"


def targets_answer(*targets: dict) -> bytes:
    return json.dumps({"status": "success", "data": {"activeTargets": list(targets), "droppedTargets": []}}).encode()


def target(pod: str, interval: object, namespace: str = "llm", **extra: object) -> dict:
    """One active target as Prometheus 2.42 answers it (discovered labels and all)."""
    return {"discoveredLabels": {"__address__": "10.0.0.1:8000", "__scrape_interval__": str(interval),
                                 "namespace": namespace, "pod": pod, "note": LEAK},
            "labels": {"instance": "10.0.0.1:8000", "job": "engines", "namespace": namespace, "pod": pod},
            "scrapePool": "engines", "scrapeUrl": "http://10.0.0.1:8000/metrics", "lastError": "",
            "lastScrape": "2024-01-01T00:00:00Z", "lastScrapeDuration": 0.01, "health": "up",
            "scrapeInterval": interval, "scrapeTimeout": "10s", **extra}


def ask(body: bytes, status: int = 200) -> list[ActiveTarget]:
    seen: list[Received] = []

    def handler(r: Received) -> Answer:
        seen.append(r)
        return Answer(status, body)

    with LocalAPI(handler) as api, PrometheusClient(api.url) as client:
        try:
            return client.active_targets()
        finally:
            assert [(r.method, r.path, r.params) for r in seen] == [("GET", "/api/v1/targets", {"state": ["active"]})]


def test_active_targets_keep_labels_and_interval_only() -> None:
    vm = target("g", "ignored")
    del vm["scrapeInterval"]  # VictoriaMetrics: only the discovered __scrape_interval__
    vm["discoveredLabels"]["__scrape_interval__"] = "15s"
    found = ask(targets_answer(target("a", "30s"), target("b", "1m30s"), target("c", "500ms"),
                               target("d", 30), target("e", "soon"), target("f", "0s"), vm,
                               target("h", "x" * 40)))
    assert [(t.labels["pod"], t.scrape_interval) for t in found] == [
        ("a", 30.0), ("b", 90.0), ("c", 0.5), ("d", None), ("e", None), ("f", None), ("g", 15.0), ("h", None)]
    assert found[0].labels == {"instance": "10.0.0.1:8000", "job": "engines", "namespace": "llm", "pod": "a"}


@pytest.mark.parametrize(("status", "body", "kind", "message"), [
    (200, b"<html>" + LEAK.encode(), "not_prometheus", "not a Prometheus API answer: an HTML page"),
    (404, b"404 page not found " + LEAK.encode(), "http_error", "HTTP 404 Not Found"),
    (200, json.dumps({"status": "success", "data": {"activeTargets": [7]}}).encode(), "not_prometheus",
     "not a Prometheus API answer: malformed targets list"),
    (200, targets_answer({"labels": {"pod": 1}, "scrapeInterval": "30s"}), "not_prometheus",
     "not a Prometheus API answer: malformed label set"),
    (200, json.dumps({"status": "success", "data": {}}).encode()[:-3], "not_prometheus",
     "not a Prometheus API answer: a body that is not the API's JSON"),
])
def test_a_bad_targets_answer_is_a_classified_error(status: int, body: bytes, kind: str, message: str) -> None:
    with pytest.raises(PromAPIError) as info:
        ask(body, status)
    assert (info.value.kind, info.value.message) == (kind, message)
    assert LEAK not in str(info.value)


def test_the_slowest_interval_of_the_targets_carrying_an_engine_counts() -> None:
    active = [ActiveTarget({"namespace": "llm", "pod": "a"}, 15.0),
              ActiveTarget({"namespace": "llm", "pod": "b"}, 30.0),
              ActiveTarget({"namespace": "llm", "pod": "node-exporter"}, 60.0),  # no engine: not counted
              ActiveTarget({"namespace": "llm", "pod": "c"}, None)]
    engines = {("llm", "a"), ("llm", "b"), ("llm", "c")}
    assert intervals.from_targets(active, ["namespace", "pod"], engines) == intervals.ScrapeInterval(
        30.0, "server", "the server's /api/v1/targets, 2 engine targets, from 15s to 30s: the slowest counts")
    assert intervals.from_targets(active[:1], ["namespace", "pod"], engines).note == \
        "the server's /api/v1/targets, 1 engine target"
    silent = intervals.from_targets(active[3:], ["namespace", "pod"], engines)  # c is an engine, but how often?
    assert silent == intervals.ScrapeInterval(None, "", "the server's /api/v1/targets does not say how often it "
                                                        "scrapes the engines; set the source's scrape_interval")
    none = intervals.from_targets(active, ["namespace", "instance"], engines)
    assert (none.seconds, none.origin) == (None, "")
    assert none.note == ("no active target of the server's /api/v1/targets has the target_labels values of a "
                         "discovered engine; set the source's scrape_interval")


def test_a_server_without_the_targets_endpoint_leaves_the_interval_unknown() -> None:
    with LocalAPI(lambda r: Answer(404, b"not found")) as api, PrometheusClient(api.url) as client:
        learned = intervals.learn(client, ["namespace", "pod"], {("llm", "a")})
    assert learned == intervals.ScrapeInterval(None, "", "the server's /api/v1/targets did not answer (http_error: "
                                                         "HTTP 404 Not Found); set the source's scrape_interval")


def source(**extra: object) -> PrometheusSourceConfig:
    return PrometheusSourceConfig.model_validate({"name": "prod", "url": "http://127.0.0.1:9090",
                                                  "target_labels": ["namespace", "pod"], **extra})


def test_the_window_is_at_least_window_intervals_scrape_intervals() -> None:
    config = source()
    assert (config.scrape_interval, config.window_intervals) == (None, 4)
    assert [config.fitted_window(60.0, interval) for interval in (None, 10.0, 15.0, 30.0, 60.0)] == \
        [60.0, 60.0, 60.0, 120.0, 240.0]
    assert source(window_intervals=2).fitted_window(60.0, 60.0) == 120.0
    assert source(scrape_interval="30s").scrape_interval == 30.0
    note = intervals.window_note(60.0, 120.0, intervals.configured(30.0), 4)
    assert note == ("diagnosis window 2m instead of diagnosis.window 1m: at least 4 scrape intervals, targets scraped "
                    "every 30s (the source's scrape_interval)")
    assert intervals.window_note(300.0, 300.0, intervals.configured(30.0), 4) == \
        "diagnosis window 5m (diagnosis.window), targets scraped every 30s (the source's scrape_interval)"


@pytest.mark.parametrize(("extra", "message"), [
    ({"scrape_interval": "0s"}, "Input should be greater than 0"),
    ({"scrape_interval": "2d"}, "Input should be less than or equal to 86400"),
    ({"window_intervals": 0}, "Input should be greater than or equal to 1"),
    ({"window_intervals": 101}, "Input should be less than or equal to 100"),
])
def test_bad_interval_settings_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        source(**extra)


def check_config(tmp_path: Path, text: str, *args: str) -> tuple[Path, int, str, str]:
    path = tmp_path / "targets.yaml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(main, ["check-config", *args, str(path)])
    return path, result.exit_code, result.stdout, result.stderr


def test_check_config_warns_of_a_static_target_scraped_too_rarely_for_its_window(tmp_path: Path) -> None:
    path, code, out, err = check_config(tmp_path, """\
targets:
  - name: vllm-a
    url: http://127.0.0.1:1/metrics
    scrape_interval: 30s
  - name: vllm-b
    url: http://127.0.0.1:2/metrics
    scrape_interval: 15s
diagnosis:
  window: 1m
""", "--offline")
    assert code == 0 and out == f"{path}: OK, 2 target(s), 0 receiver(s)\n"
    assert err == (f"{path}:4: warning: targets[0].scrape_interval: scraped every 30s, the 1m diagnosis window holds 2 "
                   "scrapes: bandwidth_bound needs 4 (diagnosis.thresholds.steady_min_scrapes), so it is never judged; "
                   "a window of 2m holds enough\n")
    # a window of 2m holds enough for both
    _, code, _, err = check_config(tmp_path, path.read_text().replace("window: 1m", "window: 2m"), "--offline")
    assert (code, err) == (0, "")


def test_check_config_offline_judges_a_sources_configured_interval(tmp_path: Path) -> None:
    text = """\
sources:
  - name: prod
    url: http://127.0.0.1:9
    target_labels: [namespace, pod]
    scrape_interval: 30s
diagnosis:
  window: 1m
  thresholds: {steady_min_scrapes: 6}
"""
    path, code, out, err = check_config(tmp_path, text, "--offline")
    assert code == 0 and out == f"{path}: OK, 0 target(s), 1 source(s), 0 receiver(s)\n"
    assert err == (f"{path}:5: warning: sources[0].scrape_interval: its targets are scraped every 30s, the 2m "
                   "diagnosis window holds 4 scrapes: bandwidth_bound needs 6 "
                   "(diagnosis.thresholds.steady_min_scrapes), so it is never judged; a window of 3m holds enough "
                   "(scrape interval: the source's scrape_interval)\n")
    # at the default thresholds the 2m the source's window grows to holds enough: nothing to say
    _, code, _, err = check_config(tmp_path, text.replace("  thresholds: {steady_min_scrapes: 6}\n", ""), "--offline")
    assert (code, err) == (0, "")
    # nor when the source keeps fewer intervals than a rule needs, which it then says
    _, code, _, err = check_config(tmp_path, text.replace("  thresholds: {steady_min_scrapes: 6}\n", "").replace(
        "scrape_interval: 30s", "scrape_interval: 30s\n    window_intervals: 2"), "--offline")
    assert code == 0 and "the 1m diagnosis window holds 2 scrapes: bandwidth_bound needs 4" in err
