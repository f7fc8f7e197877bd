"""The optional sink: the service posts its alerts to a real Alertmanager's /api/v2/alerts,
which routes them to the team's existing receivers."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.alerts.schemas import fingerprint
from tests.api.conftest import make_service
from tests.support.alertmanager import running_alertmanager
from tests.support.engine_pages import VllmPage
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
    assert alert["fingerprint"] == fingerprint(alert["labels"])  # Alertmanager computes the same id we send


def _active_in(alertmanager: str) -> list[dict]:
    return [a for a in httpx.get(f"{alertmanager}/api/v2/alerts", timeout=5).json()
            if a["labels"].get("alertname") == "LLMLatencyTargetDown"]


def _unix(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_a_still_firing_alert_outlives_alertmanagers_resolve_timeout_until_it_resolves(migrated_url: str,
                                                                                       tmp_path: Path) -> None:
    """Alertmanager resolves an alert it stops hearing about (after resolve_timeout, or its
    endsAt). With the service's own scheduler running (rounds every 0.5 s, re-posts every
    1 s, so endsAt = post + 4 x 1 s), the alert stays active for more than 2 x the 3 s
    resolve_timeout while its target is down, and is resolved once the target is back."""
    with WebhookReceiver() as webhook, \
            running_alertmanager(tmp_path / "am", webhook.url, resolve_timeout="3s") as alertmanager, \
            StaticPageServer(b"") as down:
        down.status = 502
        config = tmp_path / "targets.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": "gpu-7", "url": down.url}],
            "alerts": {"slos": [], "target_down_for": "0s", "group_interval": "1s", "resend_interval": "1s",
                       "receivers": [{"name": "am", "url": alertmanager, "kind": "alertmanager"}]},
        }))
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="0.5s",
                                delivery_interval="0.2s"):
            svc.scrape("gpu-7")
            deadline = time.monotonic() + 20
            while not _active_in(alertmanager) and time.monotonic() < deadline:
                time.sleep(0.1)
            first = time.monotonic()
            seen = []  # (seconds since first seen, seconds its endsAt is ahead of now)
            while not seen or seen[-1][0] < 10.0:  # > 2 x resolve_timeout, > 2 x endsAt validity
                time.sleep(0.5)
                alerts = _active_in(alertmanager)
                now = time.time()
                seen.append((time.monotonic() - first, [(a["status"]["state"], _unix(a["endsAt"]) - now)
                                                        for a in alerts]))
            firing_messages = [m.json["status"] for m in webhook.received]
            down.status, down.page = 200, VllmPage().render()
            svc.scrape("gpu-7")
            back = time.time()
            deadline = time.monotonic() + 20
            while (_active_in(alertmanager) or len(webhook.received) < 2) and time.monotonic() < deadline:
                time.sleep(0.1)
            still_active = _active_in(alertmanager)
            posts = [n for n in svc.client.get("/api/v1/notifications").json() if n["state"] == "delivered"]
    assert len(seen) >= 15 and seen[-1][0] >= 10.0
    for elapsed, alerts in seen:
        assert len(alerts) == 1, (elapsed, alerts)
        state, ahead = alerts[0]
        assert state == "active" and 0 < ahead <= 4.5, (elapsed, alerts)  # endsAt = post + 4 s, renewed
    assert firing_messages == ["firing"]  # Alertmanager never resolved it meanwhile
    assert len(posts) >= 8  # re-posted about once a second for 10 s
    assert still_active == []
    assert [m.json["status"] for m in webhook.received] == ["firing", "resolved"]
    resolved = webhook.received[1].json["alerts"][0]
    assert 0 <= _unix(resolved["endsAt"]) - back < 2.0  # resolved at the first round after the target came back
