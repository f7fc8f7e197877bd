"""Alerts end to end inside the service: SLO and target-down alerts, the durable outbox
(receiver outage, ordering, restart), signatures, silences and the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.alerts.delivery import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from tests.api.conftest import make_service
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer
from tests.support.receiver import WebhookReceiver

FIXTURES = Path(__file__).parents[1] / "fixtures"
SECRET = "correct horse battery staple"


def write_config(tmp_path: Path, targets: dict[str, str], hook_url: str) -> Path:
    config = {
        "targets": [{"name": name, "url": url} for name, url in targets.items()],
        "alerts": {
            "external_url": "http://llm-latency.test",
            "dashboard_url": "http://grafana.test/d/llm-latency-target",
            "slos": [{"name": "ttft_p99", "signal": "ttft", "quantile": 0.99, "threshold": "2s", "window": "5m",
                      "for": "0s", "severity": "critical"}],
            "target_down_for": "0s", "group_interval": "1ms", "repeat_interval": "4h",
            "receivers": [{"name": "oncall", "url": hook_url, "secret_env": "TEST_HOOK_SECRET",
                           "headers": {"X-Team": "inference"}}],
        },
    }
    path = tmp_path / "targets.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def shape(value):
    """The structure of a JSON value: dict keys with their shapes, types elsewhere."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()} if value else "dict"
    if isinstance(value, list):
        return [shape(value[0])] if value else "list"
    return type(value).__name__


@pytest.fixture
def hook():
    with WebhookReceiver() as receiver:
        yield receiver


def test_outage_retries_ordering_restart_and_signatures(migrated_url: str, tmp_path: Path, hook,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    slow = VllmPage(model="llama")
    with StaticPageServer(slow.render()) as a, StaticPageServer(b"") as b:
        b.status = 500
        config = write_config(tmp_path, {"a": a.url, "b": b.url}, hook.url)
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            svc.scrape("a")
            slow.observe(ttft=[5.0] * 20)
            a.page = slow.render()
            last_a, _ = svc.scrape("a"), svc.scrape("b")
            t = last_a.ts + 1
            assert svc.monitor.evaluate_alerts(now=t) == {"conditions": 2, "notifications": 2}
            alerts = {x["alertname"]: x for x in svc.client.get("/api/v1/alerts").json()}
            assert alerts["LLMLatencyTTFTHigh"]["state"] == "firing" and alerts["LLMLatencyTargetDown"]["state"] == "firing"
            hook.status = 503  # the receiver is down
            assert svc.client.portal.call(svc.monitor.delivery.run_once, t) == 0
            b.status, b.page = 200, slow.render()  # b comes back: its alert resolves
            svc.scrape("b")
            assert svc.monitor.evaluate_alerts(now=t + 2)["notifications"] == 1
            assert svc.client.portal.call(svc.monitor.delivery.run_once, t + 2) == 0
            log = svc.client.get("/api/v1/notifications").json()
            assert sorted((n["groupKey"], n["seq"], n["status"], n["state"]) for n in log) == [
                ('{}:{alertname="LLMLatencyTTFTHigh", target="a"}', 1, "firing", "pending"),
                ('{}:{alertname="LLMLatencyTargetDown", target="b"}', 1, "firing", "pending"),
                ('{}:{alertname="LLMLatencyTargetDown", target="b"}', 2, "resolved", "pending"),
            ]
            failed = [n for n in log if n["attempts"]]
            assert all(a["statusCode"] == 503 and a["response"] == '{"error":"unavailable"}'
                       for n in failed for a in n["attemptLog"])
        # the service restarts while all three are pending; the receiver is back
        hook.status = 200
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            assert svc.client.portal.call(svc.monitor.delivery.run_once, t + 3600) == 2  # the two group heads
            assert svc.client.portal.call(svc.monitor.delivery.run_once, t + 3600) == 1  # then b's resolution
            assert svc.client.portal.call(svc.monitor.delivery.run_once, t + 3600) == 0
            log = svc.client.get("/api/v1/notifications").json()
    assert all(n["state"] == "delivered" for n in log)
    assert len(hook.received) == 3 and len(hook.rejected) >= 4
    by_group: dict[str, list] = {}
    for item in hook.received:
        by_group.setdefault(item.json["groupKey"], []).append(item.json["status"])
    assert by_group['{}:{alertname="LLMLatencyTargetDown", target="b"}'] == ["firing", "resolved"]
    ids = [item.headers["Idempotency-Key"] for item in hook.received]
    assert len(set(ids)) == 3 and set(ids) == {n["id"] for n in log}
    retried_ids = {r.headers["Idempotency-Key"] for r in hook.rejected}
    assert retried_ids <= set(ids)  # a retry carries the same key
    for item in hook.received:
        assert item.headers["X-Team"] == "inference"
        stamp, signature = item.headers[TIMESTAMP_HEADER], item.headers[SIGNATURE_HEADER]
        assert verify(SECRET, stamp, item.body, signature)
        tampered = item.body.replace(b'"receiver":"oncall"', b'"receiver":"attacker"')
        assert tampered != item.body and not verify(SECRET, stamp, tampered, signature)
        assert not verify("wrong secret", stamp, item.body, signature)
        assert not verify(SECRET, stamp, item.body, signature, now=float(stamp) + 3600)  # replayed later
    ttft = next(r.json for r in hook.received if r.json["groupLabels"]["alertname"] == "LLMLatencyTTFTHigh")
    alert = ttft["alerts"][0]
    assert alert["labels"] == {"alertname": "LLMLatencyTTFTHigh", "severity": "critical", "slo": "ttft_p99",
                               "target": "a"}
    assert alert["annotations"]["summary"].startswith("a: p99 TTFT is 4.") and "above the 2s objective" in \
        alert["annotations"]["summary"]
    assert alert["annotations"]["dashboard_url"] == "http://grafana.test/d/llm-latency-target?var-target=a"
    assert ttft["externalURL"] == "http://llm-latency.test" and ttft["version"] == "4"


def test_webhook_json_has_the_alertmanager_structure(migrated_url: str, tmp_path: Path, hook,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    with StaticPageServer(b"") as down:
        down.status = 503
        config = write_config(tmp_path, {"b": down.url}, hook.url)
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            record = svc.scrape("b")
            svc.monitor.evaluate_alerts(now=record.ts + 1)
            svc.client.portal.call(svc.monitor.delivery.run_once, record.ts + 1)
            down.status = 200
            down.page = VllmPage().render()
            record = svc.scrape("b")
            svc.monitor.evaluate_alerts(now=record.ts + 1)
            svc.client.portal.call(svc.monitor.delivery.run_once, record.ts + 1)
    firing, resolved = (r.json for r in hook.received)
    for ours, sample_file in ((firing, "alertmanager-webhook-sample.json"),
                              (resolved, "alertmanager-webhook-sample-resolved.json")):
        sample = json.loads((FIXTURES / sample_file).read_text())
        assert set(ours) == set(sample)
        assert set(ours["alerts"][0]) == set(sample["alerts"][0])
        for key in ("receiver", "status", "externalURL", "version", "groupKey"):
            assert type(ours[key]) is type(sample[key]) is str
        assert type(ours["truncatedAlerts"]) is type(sample["truncatedAlerts"]) is int
        for key in ("labels", "annotations"):
            assert all(isinstance(v, str) for v in ours["alerts"][0][key].values())
        assert len(ours["alerts"][0]["fingerprint"]) == len(sample["alerts"][0]["fingerprint"]) == 16
        assert ours["alerts"][0]["startsAt"].endswith("Z") and len(ours["alerts"][0]["startsAt"]) == 24
    assert firing["status"] == "firing" and firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    assert firing["alerts"][0]["fingerprint"] == resolved["alerts"][0]["fingerprint"]


def test_silences_receivers_and_bad_input(migrated_url: str, tmp_path: Path, hook,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    with StaticPageServer(b"") as down:
        down.status = 503
        config = write_config(tmp_path, {"b": down.url}, hook.url)
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            c = svc.client
            bad = c.post("/api/v1/silences", json={"matchers": ['target=="b'], "duration": "1h", "createdBy": "me",
                                                    "comment": "x"})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "matchers", "0"]
            bad = c.post("/api/v1/silences", json={"matchers": ['target=~"(b"'], "duration": "1h",
                                                    "createdBy": "me", "comment": "x"})
            assert bad.status_code == 422 and "bad regex" in bad.json()["detail"][0]["msg"]
            bad = c.post("/api/v1/silences", json={"matchers": [], "duration": "1h", "createdBy": "me", "comment": "x"})
            assert bad.status_code == 422
            assert c.get("/api/v1/silences/nope").status_code == 404
            assert c.delete("/api/v1/silences/nope").status_code == 404
            made = c.post("/api/v1/silences", json={"matchers": ['target="b"', "alertname=~\"LLMLatency.*\""],
                                                     "duration": "1h", "createdBy": "oncall", "comment": "maintenance"})
            assert made.status_code == 201 and made.json()["status"]["state"] == "active"
            record = svc.scrape("b")
            assert svc.monitor.evaluate_alerts(now=record.ts + 1) == {"conditions": 1, "notifications": 0}
            alert = c.get("/api/v1/alerts").json()[0]
            assert alert["state"] == "firing" and alert["silencedBy"] == [made.json()["id"]]
            expired = c.delete(f"/api/v1/silences/{made.json()['id']}")
            assert expired.status_code == 200 and expired.json()["status"]["state"] == "expired"
            assert svc.monitor.evaluate_alerts(now=record.ts + 2)["notifications"] == 1

            bad = c.post("/api/v1/receivers", json={"name": "x", "url": "mailto:ops@example.com"})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "url"]
            bad = c.post("/api/v1/receivers", json={"name": "x", "url": "http://h/", "kind": "pager"})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "kind"]
            bad = c.post("/api/v1/receivers", json={"name": "x", "url": "http://h/", "headers": {"Idempotency-Key": "1"}})
            assert bad.status_code == 422 and "is set by the service" in bad.json()["detail"][0]["msg"]
            assert c.post("/api/v1/receivers", json={"name": "oncall", "url": hook.url}).status_code == 409
            made = c.post("/api/v1/receivers", json={"name": "chat", "url": hook.url, "match": {"severity": "info"}})
            assert made.status_code == 201 and made.json()["source"] == "api"
            assert {r["name"]: r["has_secret"] for r in c.get("/api/v1/receivers").json()} == {"chat": False,
                                                                                              "oncall": True}
            assert c.post("/api/v1/receivers/nope/test").status_code == 404
            queued = c.post("/api/v1/receivers/chat/test")
            assert queued.status_code == 202
            assert svc.client.portal.call(svc.monitor.delivery.run_once, record.ts + 3) == 2
            assert c.delete("/api/v1/receivers/oncall").status_code == 409
            assert c.delete("/api/v1/receivers/chat").status_code == 204
    test_message = next(r.json for r in hook.received if r.json["receiver"] == "chat")
    assert test_message["alerts"][0]["labels"]["alertname"] == "LLMLatencyTestNotification"
    assert SIGNATURE_HEADER not in next(r.headers for r in hook.received if r.json["receiver"] == "chat")


def test_an_active_diagnosis_becomes_an_alert_with_its_cause_and_remedies(migrated_url: str, tmp_path: Path, hook,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.api.test_diagnoses_api import stepping_page

    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    with StaticPageServer(stepping_page("queueing")) as busy:
        config = write_config(tmp_path, {"busy": busy.url}, hook.url)
        for svc in make_service(migrated_url, tmp_path, config_file=config, alert_interval="1h",
                                delivery_interval="1h"):
            last = None
            for _ in range(24):
                last = svc.scrape("busy")
            svc.monitor.evaluate_diagnoses(now=last.ts)
            svc.monitor.evaluate_alerts(now=last.ts)
            assert "LLMLatencyQueueing" not in {a["alertname"] for a in svc.client.get("/api/v1/alerts").json()}
            svc.monitor.evaluate_diagnoses(now=last.ts + 1)  # the finding is active now
            svc.monitor.evaluate_alerts(now=last.ts + 1)
            svc.client.portal.call(svc.monitor.delivery.run_once, last.ts + 1)
    message = next(r.json for r in hook.received if r.json["groupLabels"]["alertname"] == "LLMLatencyQueueing")
    alert = message["alerts"][0]
    assert alert["labels"]["regime"] == "queueing" and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    annotations = alert["annotations"]
    assert annotations["runbook_url"] == "http://llm-latency.test/runbooks/queueing"
    assert "queue share of TTFT = " in annotations["description"] and "(>= 0.50)" in annotations["description"]
    assert "--max-num-seqs" in annotations["remedies"]
    assert float(annotations["confidence"]) >= 0.5
