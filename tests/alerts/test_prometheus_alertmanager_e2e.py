"""End to end with the real binaries: Debian's Prometheus loads the exported rules, scrapes
an emulated vLLM that is queueing, and sends the alert to Debian's Alertmanager, which
posts it to a webhook receiver on 127.0.0.1 -- the path a team that prefers its own
Prometheus/Alertmanager gets from `llm-latency rules export`.

The export uses a test config with short windows (regime window 10s, no hold), so the
whole chain runs in seconds. A missing binary skips locally and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.config import FileConfig
from app.emulator.server import EmulatorFleet, TargetSpec
from app.rules_export import render_rules
from app.rules_export.engines import ENGINES
from tests.support.alertmanager import running_alertmanager
from tests.support.prometheus import running_prometheus
from tests.support.receiver import WebhookReceiver

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "alertmanager-webhook-sample.json"
EXTERNAL_URL = "http://llm-latency.e2e.test"
PROMETHEUS_EXTERNAL_URL = "http://prometheus.e2e.test:9090"

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def _queueing_alerts(bodies: list[dict]) -> dict[str, tuple[dict, dict]]:
    """severity -> (payload, alert) for firing LLMLatencyQueueing alerts received so far."""
    found: dict[str, tuple[dict, dict]] = {}
    for body in bodies:
        for alert in body.get("alerts", []):
            if alert["labels"].get("alertname") == "LLMLatencyQueueing" and alert["status"] == "firing":
                found.setdefault(alert["labels"]["severity"], (body, alert))
    return found


def _seconds(humanized: str) -> float:
    """Prometheus' humanizeDuration output back to seconds ("16.21s", "1m 3s", "450ms")."""
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(ms|s|m|h|d)", humanized):
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    return total


def test_queueing_engine_alert_reaches_the_webhook_through_prometheus_and_alertmanager(tmp_path: Path) -> None:
    sample = json.loads(FIXTURE.read_text())
    started = time.monotonic()
    with EmulatorFleet([TargetSpec("q", "queueing", time_scale=5, warmup_s=120)]) as fleet, \
            WebhookReceiver() as webhook, \
            running_alertmanager(tmp_path / "am", webhook.url) as alertmanager_url:
        engine = urlsplit(fleet.urls["q"]).netloc
        config = FileConfig.model_validate({
            "targets": [{"name": "q", "url": f"{fleet.urls['q']}/metrics", "engine": "vllm"}],
            "diagnosis": {"window": "10s", "interval": "1s", "thresholds": {"activate_after": 1}},
            "alerts": {"external_url": EXTERNAL_URL, "target_down_for": "5s",
                       "slos": [{"name": "ttft_p99", "signal": "ttft", "threshold": "2s", "window": "10s",
                                 "for": "0s"}]},
        })
        rules_file = tmp_path / "llm-latency-rules.yaml"
        rules_file.write_text(render_rules(config))
        prometheus_config = (
            "scrape_configs:\n"
            "  - job_name: llm\n"
            "    static_configs:\n"
            f"      - targets: ['{engine}']\n"
            f"rule_files:\n  - {rules_file}\n"
            "alerting:\n  alertmanagers:\n    - static_configs:\n"
            f"        - targets: ['{urlsplit(alertmanager_url).netloc}']\n")
        with running_prometheus(tmp_path / "prom", prometheus_config, "1s", evaluation_interval="1s",
                                extra_args=[f"--web.external-url={PROMETHEUS_EXTERNAL_URL}"]) as prom:
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                found = _queueing_alerts([r.json for r in webhook.received])
                if {"warning", "critical"} <= set(found):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(
                    f"no LLMLatencyQueueing warning+critical at the webhook after 45s; got "
                    f"{[a['labels'] for b in [r.json for r in webhook.received] for a in b['alerts']]}")
            queue_mean = float(prom.query(f'llm_latency:vllm_queue_time_seconds:mean_10s{{instance="{engine}"}}')
                               ["result"][0]["value"][1])
            queue_share = float(prom.query(f'llm_latency:vllm_queue_share:ratio_10s{{instance="{engine}"}}')
                                ["result"][0]["value"][1])
            target_down = prom.query('ALERTS{alertname="LLMLatencyTargetDown"}')["result"]
            rule_groups = prom.api("rules")["groups"]

    # Prometheus loaded every exported group: one per engine (vLLM, TGI, SGLang, TRT-LLM) and the targets'
    assert sorted(g["name"] for g in rule_groups) == sorted(
        [f"llm-latency-{e.name}" for e in ENGINES] + ["llm-latency-targets"])
    assert len(rule_groups) == 5
    # the emulated engine really is queueing (simulated seconds: ~16 s in the queue, ~all of TTFT)
    assert queue_mean >= 2.5 and queue_share >= 0.5, (queue_mean, queue_share)
    assert target_down == []

    for severity, (payload, alert) in found.items():
        # Alertmanager's webhook format, version 4: same keys as the recorded sample
        assert set(payload) == set(sample), severity
        assert set(alert) == set(sample["alerts"][0])
        assert payload["version"] == "4" and payload["receiver"] == "webhook" and payload["status"] == "firing"
        assert payload["externalURL"] == alertmanager_url
        assert payload["groupLabels"] == {"alertname": "LLMLatencyQueueing"}
        assert alert["endsAt"] == "0001-01-01T00:00:00Z"
        assert alert["generatorURL"].startswith(f"{PROMETHEUS_EXTERNAL_URL}/graph?g0.expr=")
        labels, notes = alert["labels"], alert["annotations"]
        assert labels == {"alertname": "LLMLatencyQueueing", "severity": severity, "regime": "queueing",
                          "engine": "vllm", "job": "llm", "instance": engine, "model_name": labels["model_name"]}
        assert labels["model_name"]
        assert notes["runbook_url"] == f"{EXTERNAL_URL}/runbooks/queueing"
        assert notes["summary"] == "Requests queue for the scheduler on vLLM"
        match = re.fullmatch(
            rf"vLLM {re.escape(labels['model_name'])} on {re.escape(engine)}: requests wait (\S+) for the scheduler "
            rf"on average over the last 10s \(mean queue time >= (500ms|2\.5s)\), at least 50% of mean TTFT, with at "
            r"least 1 request\(s\) waiting on average\.", notes["description"])
        assert match, notes["description"]
        assert match.group(2) == ("2.5s" if severity == "critical" else "500ms")
        assert _seconds(match.group(1)) >= 2.5  # {{ $value }}: the mean queue time, above the critical bound
    assert time.monotonic() - started < 60
