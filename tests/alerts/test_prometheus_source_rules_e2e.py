"""End to end with Debian's Prometheus: the rules exported for a Prometheus source, loaded by
a Prometheus that scrapes emulated vLLM pods labelled the way Kubernetes discovery labels
them (``namespace``, ``pod``), name the pod in their alerts -- the queueing pod fires, the
healthy one and a queueing pod outside the source's selector stay quiet, and a pod that
cannot be scraped raises ``LLMLatencyTargetDown`` by namespace and pod.

Short windows (regime window 10s, no hold, target down after 5s) keep it to seconds. A
missing binary skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.config import FileConfig
from app.emulator.server import EmulatorFleet, TargetSpec
from app.rules_export import render_rules
from tests.support.prometheus import free_port, running_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

#: emulated engine -> (scenario, namespace, pod)
PODS = {"q": ("queueing", "llm", "vllm-q-0"), "h": ("healthy", "llm", "vllm-h-0"),
        "x": ("queueing", "batch", "vllm-x-0")}


def firing(prom, alertname: str) -> list[dict]:
    return [s["metric"] for s in prom.query(f'ALERTS{{alertname="{alertname}", alertstate="firing"}}')["result"]]


def test_source_rules_fire_per_pod_inside_the_selector_only(tmp_path: Path) -> None:
    specs = [TargetSpec(name, scenario, seed=i, time_scale=5, warmup_s=120)
             for i, (name, (scenario, _, _)) in enumerate(PODS.items())]
    config = FileConfig.model_validate({
        "sources": [{"name": "prod", "url": "http://127.0.0.1:9", "selector": '{namespace="llm"}',
                     "target_labels": ["namespace", "pod"]}],
        "diagnosis": {"window": "10s", "interval": "1s", "thresholds": {"activate_after": 1}},
        "alerts": {"target_down_for": "5s"},
    })
    rules_file = tmp_path / "llm-latency-rules.yaml"
    rules_file.write_text(render_rules(config))
    with EmulatorFleet(specs) as fleet:
        static = [{"targets": [urlsplit(fleet.urls[name]).netloc], "labels": {"namespace": ns, "pod": pod}}
                  for name, (_, ns, pod) in PODS.items()]
        # a pod of the namespace that nothing answers for: scraped with up == 0
        static.append({"targets": [f"127.0.0.1:{free_port()}"], "labels": {"namespace": "llm", "pod": "vllm-dead-0"}})
        prometheus_config = yaml.safe_dump({"scrape_configs": [{"job_name": "llm/vllm", "static_configs": static}],
                                            "rule_files": [str(rules_file)]}, sort_keys=False)
        with running_prometheus(tmp_path / "prom", prometheus_config, "1s", evaluation_interval="1s") as prom:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                queueing, down = firing(prom, "LLMLatencyQueueing"), firing(prom, "LLMLatencyTargetDown")
                if {a["severity"] for a in queueing} >= {"warning", "critical"} and down:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"no queueing warning+critical and target down after 60s: {queueing} {down}")
            time.sleep(2)  # a few more evaluations: nothing else joins
            queueing, down = firing(prom, "LLMLatencyQueueing"), firing(prom, "LLMLatencyTargetDown")
            waiting = prom.query("llm_latency:vllm_num_requests_waiting:avg_10s")["result"]

    model = queueing[0]["model_name"]
    assert model
    assert sorted(queueing, key=lambda a: a["severity"]) == [
        {"__name__": "ALERTS", "alertname": "LLMLatencyQueueing", "alertstate": "firing", "severity": severity,
         "regime": "queueing", "engine": "vllm", "namespace": "llm", "pod": "vllm-q-0", "model_name": model}
        for severity in ("critical", "warning")]
    assert down == [{"__name__": "ALERTS", "alertname": "LLMLatencyTargetDown", "alertstate": "firing",
                     "severity": "warning", "namespace": "llm", "pod": "vllm-dead-0"}]
    # recorded per pod and model, only inside the selector, no job/instance
    assert sorted(s["metric"]["pod"] for s in waiting) == ["vllm-h-0", "vllm-q-0"]
    assert all(set(s["metric"]) == {"__name__", "namespace", "pod", "model_name"} for s in waiting)
    by_pod = {s["metric"]["pod"]: float(s["value"][1]) for s in waiting}
    assert by_pod["vllm-q-0"] >= 1 > by_pod["vllm-h-0"]
