"""The stack the dashboards are built for, in one process: emulated engines, the monitor
(uvicorn on a free port), a webhook receiver and a real Prometheus scraping the engines
(with a ``target`` label per engine, as ``deploy/compose/prometheus.yml`` does) and the
monitor's ``/metrics``.

The monitor's periodic jobs are set to an hour so the test drives summaries, diagnoses
and alerts itself, in a known order: a first diagnosis round before the targets have
data (``insufficient_data``) and later rounds with data, so the verdict *changes* and the
regime-change annotation has something to show.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.emulator.server import EmulatorFleet, TargetSpec
from app.lifespan import Monitor
from app.main import create_app
from app.settings import Settings
from tests.support.prometheus import PrometheusHandle, free_port, running_prometheus
from tests.support.receiver import WebhookReceiver

#: name -> (scenario, emulator engine). One target per engine kind the dashboards support,
#: and scenarios that make the regime panels non-empty (queueing, KV pressure/preemptions).
ENGINES = {
    "vllm-queueing": ("queueing", "vllm"),
    "vllm-kv-pressure": ("kv_cache_pressure", "vllm"),
    "tgi-bandwidth": ("bandwidth_bound", "tgi"),
}
ENGINE_KIND = {name: engine for name, (_, engine) in ENGINES.items()}


@dataclass
class Stack:
    prometheus: PrometheusHandle
    monitor: Monitor
    monitor_url: str
    hook: WebhookReceiver


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@contextlib.contextmanager
def serve(settings: Settings) -> Iterator[tuple[Monitor, str]]:
    """The monitor app under uvicorn in a thread; stops it (and its lifespan) on exit."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="monitor", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "the monitor to start")
        assert server.started, "the monitor did not start (see the log above)"
        yield app.state.monitor, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def scrape_configs(monitor_url: str, engine_urls: dict[str, str]) -> str:
    """The two jobs of deploy/compose/prometheus.yml: the monitor, and the engines with a
    static ``target`` label equal to the monitor's target name -- and, as there, the
    ``namespace``/``pod`` labels the dashboards generated for a Prometheus source group by."""
    jobs = [
        {"job_name": "llm-latency", "static_configs": [{"targets": [monitor_url.removeprefix("http://")]}]},
        {"job_name": "llm-engines", "static_configs": [
            {"targets": [url.removeprefix("http://")], "labels": {"target": name, "namespace": "demo",
                                                                  "pod": f"{name}-0"}}
            for name, url in engine_urls.items()]},
    ]
    return yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False)


def count_samples(prom: PrometheusHandle, selector: str) -> float:
    result = prom.query(f"min(count_over_time({selector}[5m]))")["result"]
    return float(result[0]["value"][1]) if result else 0.0


@contextlib.contextmanager
def running_stack(tmp_path: Path) -> Iterator[Stack]:
    specs = [TargetSpec(name, scenario, engine=engine, seed=i, time_scale=5.0, warmup_s=60)
             for i, (name, (scenario, engine)) in enumerate(ENGINES.items())]
    with EmulatorFleet(specs) as fleet, WebhookReceiver() as hook:
        config = {
            "targets": [{"name": name, "url": f"{fleet.urls[name]}/metrics"} for name in ENGINES],
            "diagnosis": {"interval": "1h", "window": "20s"},
            # the slos: section (error budgets) on every target: the queueing engine burns it, TGI has no TTFT
            # histogram to evaluate it on, so every llm_latency_slo_* series exists
            "slos": [{"name": "chat-ttft", "signal": "ttft", "threshold": "2.5s", "objective": "99%",
                      "period": "28d"}],
            "alerts": {"slos": [{"name": "ttft_p99", "signal": "ttft", "quantile": 0.99, "threshold": "1s",
                                 "window": "30s", "for": "0s"}],
                       "group_interval": "1s", "receivers": [{"name": "hook", "url": hook.url}]},
        }
        config_path = tmp_path / "targets.yaml"
        config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        settings = Settings(database_url=f"sqlite:///{tmp_path / 'monitor.db'}", data_dir=tmp_path,
                            config_file=config_path, default_scrape_interval="1s", default_scrape_timeout="1s",
                            latency_window="30s", summary_interval="1h", alert_interval="1h",
                            delivery_interval="0.5s")
        with serve(settings) as (monitor, url), \
                running_prometheus(tmp_path / "prom", scrape_configs(url, fleet.urls), "1s") as prom:
            stack = Stack(prom, monitor, url, hook)
            prepare(stack)
            yield stack


def monitor_scrapes(stack: Stack) -> dict[str, int]:
    """Successful scrapes per target, from the monitor's own counter (as /metrics shows it)."""
    ok = {s.labels["target"]: int(s.value)
          for family in text_string_to_metric_families(stack.monitor.telemetry.targets.exposition().decode())
          for s in family.samples if s.name == "llm_latency_scrapes_total" and s.labels["result"] == "ok"}
    return {name: ok.get(name, 0) for name in ENGINES}


def prepare(stack: Stack) -> None:
    prom, monitor = stack.prometheus, stack.monitor
    # 1. a diagnosis round as soon as every target has one scrape: not enough data yet
    wait_until(lambda: min(monitor_scrapes(stack).values()) >= 1, 30, "a first scrape of every target")
    first = {d.verdict for d, _ in monitor.evaluate_diagnoses()}
    assert first == {"insufficient_data"}, first
    wait_until(lambda: count_samples(prom, 'llm_latency_diagnosis_verdict{verdict="insufficient_data"}') >= 2, 30,
               "Prometheus to record the first verdicts")
    # 2. enough scrapes for the diagnosis window: regimes, an active finding, a firing SLO alert
    wait_until(lambda: min(monitor_scrapes(stack).values()) >= 12, 60, "a dozen scrapes of every target")
    monitor.refresh_summaries()
    monitor.evaluate_diagnoses()
    time.sleep(1.0)
    verdicts = {d.target: d.verdict for d, _ in monitor.evaluate_diagnoses()}
    assert verdicts["vllm-queueing"] == "queueing", verdicts
    monitor.evaluate_alerts()
    monitor.detect_changes()  # the findings that became active: regime change events (their annotation)
    wait_until(lambda: stack.hook.received, 30, "the SLO alert to be delivered")
    run_probe(stack, "tgi-bandwidth")
    # 3. Prometheus has scraped the new state a few times, and every engine a few times
    wait_until(lambda: count_samples(prom, 'llm_latency_finding_confidence{state="active"}') >= 3, 30,
               "Prometheus to record the active findings")
    wait_until(lambda: count_samples(prom, "llm_latency_deliveries_total") >= 2, 30,
               "Prometheus to record the deliveries")
    wait_until(lambda: count_samples(prom, 'up{job="llm-engines"}') >= 5, 30, "five scrapes of every engine")
    wait_until(lambda: count_samples(prom, "llm_latency_probe_requests") >= 2, 30,
               "Prometheus to record the probe run")
    wait_until(lambda: count_samples(prom, "llm_latency_change_event_last_timestamp_seconds") >= 2, 30,
               "Prometheus to record the change events")


def run_probe(stack: Stack, target: str) -> None:
    """A small client-side probe (one request alone, then two at once) through the API,
    so the probe panels have a run to show."""
    body = {"target": target, "concurrency": [1, 2], "requests": 2, "prompt_tokens": [64], "max_tokens": 16}
    created = httpx.post(f"{stack.monitor_url}/api/v1/probes", json=body, timeout=10)
    assert created.status_code == 202, created.text
    url = f"{stack.monitor_url}/api/v1/probes/{created.json()['id']}"
    wait_until(lambda: httpx.get(url, timeout=10).json()["state"] != "running", 60, "the probe to finish")
    run = httpx.get(url, timeout=10).json()
    assert run["state"] == "done" and all(level["failed"] == 0 for level in run["summary"]["levels"]), run


def metrics_page(stack: Stack) -> str:
    return httpx.get(f"{stack.monitor_url}/metrics", timeout=10).text
