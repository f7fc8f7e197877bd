"""The optional sink: the service posts its alerts to a real Alertmanager's /api/v2/alerts,
which routes them to the team's existing receivers."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml

from app.alerts.schemas import fingerprint, unix
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


def test_a_still_firing_alert_outlives_alertmanagers_resolve_timeout_until_it_resolves(migrated_url: str,
                                                                                       tmp_path: Path) -> None:
    """Alertmanager resolves an alert it stops hearing about: at its endsAt, or after
    resolve_timeout (3 s here) without one. With the service's own scheduler running
    (rounds every 1 s, re-posts every 2 s, so endsAt = delivery + 4 x 2 s), the alert stays
    active for 20 s while its target is down: more than 2 x the 8 s validity of one post
    and 6 x resolve_timeout, so only the re-posts keep it (a stall of the service shorter
    than 6 s does not end it). Once the target is back it is resolved with the service's
    own resolution time."""
    validity, watch = 8.0, 20.0
    with WebhookReceiver() as webhook, \
            running_alertmanager(tmp_path / "am", webhook.url, resolve_timeout="3s") as alertmanager, \
            StaticPageServer(b"") as down:
        down.status = 502
        config = tmp_path / "targets.yaml"
        config.write_text(yaml.safe_dump({
            "targets": [{"name": "gpu-7", "url": down.url}],
            "alerts": {"slos": [], "target_down_for": "0s", "group_interval": "1s", "resend_interval": "2s",
                       "receivers": [{"name": "am", "url": alertmanager, "kind": "alertmanager"}]},
        }))
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1s",
                                delivery_interval="0.2s"):
            svc.scrape("gpu-7")
            deadline = time.monotonic() + 30
            while not _active_in(alertmanager) and time.monotonic() < deadline:
                time.sleep(0.1)
            first = time.monotonic()
            seen = []  # (seconds since first seen, [(state, seconds its endsAt is ahead of now)])
            while not seen or seen[-1][0] < watch:
                time.sleep(1.0)
                alerts = _active_in(alertmanager)
                now = time.time()
                seen.append((time.monotonic() - first, [(a["status"]["state"], unix(a["endsAt"]) - now)
                                                        for a in alerts]))
            firing_messages = [m.json["status"] for m in webhook.received]
            down.status, down.page = 200, VllmPage().render()
            back = time.time()
            svc.scrape("gpu-7")
            deadline = time.monotonic() + 30
            while (_active_in(alertmanager) or len(webhook.received) < 2) and time.monotonic() < deadline:
                time.sleep(0.1)
            still_active = _active_in(alertmanager)
            posts = [n for n in svc.client.get("/api/v1/notifications").json() if n["state"] == "delivered"]
            ours = svc.client.get("/api/v1/alerts").json()
    assert len(seen) >= 10 and seen[-1][0] >= watch
    for elapsed, alerts in seen:
        assert len(alerts) == 1, (elapsed, alerts)
        state, ahead = alerts[0]
        assert state == "active" and 0 < ahead <= validity + 0.5, (elapsed, alerts)  # renewed, never past
    assert firing_messages == ["firing"]  # Alertmanager never resolved it meanwhile
    assert len(posts) >= 5  # re-posted about every 2 s (10 expected in 20 s; 3 needed to outlive 8 s twice)
    assert still_active == []
    assert [m.json["status"] for m in webhook.received] == ["firing", "resolved"]
    resolved_at = unix(webhook.received[1].json["alerts"][0]["endsAt"])
    assert [a["state"] for a in ours] == ["resolved"]
    assert abs(resolved_at - unix(ours[0]["endsAt"])) < 0.001  # our resolution, not an expired endsAt
    # by the round running when the target came back (1 s apart) or a later one, before a post could expire
    assert -1.0 < resolved_at - back < validity
