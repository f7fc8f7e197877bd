"""The optional sink: the service posts its alerts to a real Alertmanager's /api/v2/alerts,
which routes them to the team's existing receivers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tests.api.conftest import make_service
from tests.support.alertmanager import running_alertmanager
from tests.support.pages import StaticPageServer
from tests.support.receiver import WebhookReceiver

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def test_alerts_reach_a_webhook_through_a_real_alertmanager(migrated_url: str, tmp_path: Path) -> None:
    with WebhookReceiver() as webhook, running_alertmanager(tmp_path / "am", webhook.url) as alertmanager, \
            StaticPageServer(b"") as down:
        down.status = 502
        config = tmp_path / "targets.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": "gpu-7", "url": down.url, "labels": {"cluster": "east"}}],
            "alerts": {"target_down_for": "0s", "external_url": "http://llm-latency.test",
                       "receivers": [{"name": "am", "url": alertmanager, "kind": "alertmanager"}]},
        }))
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            record = svc.scrape("gpu-7")
            assert svc.monitor.evaluate_alerts(now=record.ts + 1)["notifications"] == 1
            assert svc.client.portal.call(svc.monitor.delivery.run_once, record.ts + 1) == 1
            log = svc.client.get("/api/v1/notifications").json()
            deadline = time.monotonic() + 20
            while not webhook.received and time.monotonic() < deadline:
                time.sleep(0.1)
    assert log[0]["attemptLog"][0]["statusCode"] == 200  # Alertmanager accepted the POST /api/v2/alerts
    message = webhook.received[0].json
    alert = message["alerts"][0]
    assert message["receiver"] == "webhook" and message["status"] == "firing" and message["version"] == "4"
    assert alert["labels"] == {"alertname": "LLMLatencyTargetDown", "cluster": "east", "severity": "critical",
                               "target": "gpu-7"}
    assert alert["annotations"]["summary"] == "gpu-7: scrapes fail (http_status)"
    assert alert["generatorURL"].endswith("/api/v1/alerts")
