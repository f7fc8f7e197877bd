"""Alerts end to end inside the service: SLO and target-down alerts, the durable outbox
(receiver outage, ordering, restart), signatures, silences and the API."""

from __future__ import annotations

import datetime as dt
import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from app.alerts.delivery import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign, verify
from app.alerts.schemas import ZERO_TIME, AlertInstance, fingerprint, webhook_payload
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


#: Maps whose keys are the alert's own label / annotation names: str -> str, not fixed fields.
LABEL_MAPS = ("labels", "annotations", "groupLabels", "commonLabels", "commonAnnotations")
RFC3339_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def assert_same_structure(ours, sample, path: str = "$") -> None:
    """Field for field: every field of Alertmanager's sample is in ours, no other field is,
    and each value has the sample's JSON type, recursively (list items against the
    sample's first item; label maps hold strings)."""
    assert type(ours) is type(sample), f"{path}: {type(ours).__name__} != {type(sample).__name__}"
    if isinstance(sample, dict) and path.rsplit(".", 1)[-1] in LABEL_MAPS:
        assert ours and all(isinstance(k, str) and isinstance(v, str) for k, v in ours.items()), path
    elif isinstance(sample, dict):
        assert list(ours) == list(sample), f"{path}: fields {list(ours)} != {list(sample)}"
        for key in sample:
            assert_same_structure(ours[key], sample[key], f"{path}.{key}")
    elif isinstance(sample, list):
        assert ours, f"{path}: empty"
        for index, item in enumerate(ours):
            assert_same_structure(item, sample[0], f"{path}[{index}]")


def unix(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


DOCS_ALERTS = Path(__file__).parents[2] / "docs" / "alerts.md"


def docs_verify():
    """The signature check exactly as the manual documents it (docs/alerts.md, "Verifying a
    notification")."""
    page = DOCS_ALERTS.read_text(encoding="utf-8")
    section = page.split("\n## Verifying a notification\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)
    code = next(b for b in blocks if "def verify(" in b)
    namespace: dict = {}
    exec(compile(textwrap.dedent(code), str(DOCS_ALERTS), "exec"), namespace)
    return namespace["verify"]


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
            assert (alerts["LLMLatencyTTFTHigh"]["state"] == "firing"
                    and alerts["LLMLatencyTargetDown"]["state"] == "firing")
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
    # 20 requests of 5 s: all in the bucket 2.5-5 s, whose p99 interpolates to 4.975 s, 99 % of the way through
    # it: the annotation says what the buckets know
    assert alert["annotations"]["summary"] == "a: p99 TTFT is 2.5–5 s, above the 2s objective"
    assert alert["annotations"]["description"].startswith("p99 TTFT over the last ")
    assert " is 2.5–5 s (objective: at most 2s, " in alert["annotations"]["description"]
    assert alert["annotations"]["dashboard_url"] == "http://grafana.test/d/llm-latency-target?var-target=a"
    assert alert["annotations"]["runbook_url"] == "http://llm-latency.test/runbooks/slo_ttft"
    down = next(r.json for r in hook.received if r.json["groupLabels"]["alertname"] == "LLMLatencyTargetDown")
    assert down["alerts"][0]["annotations"]["runbook_url"] == "http://llm-latency.test/runbooks/target_down"
    assert ttft["externalURL"] == "http://llm-latency.test" and ttft["version"] == "4"


def test_webhook_json_has_the_alertmanager_structure_and_the_documented_check_verifies_it(
        migrated_url: str, tmp_path: Path, hook, monkeypatch: pytest.MonkeyPatch) -> None:
    docs_check = docs_verify()
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
        assert_same_structure(ours, sample)
        alert, sample_alert = ours["alerts"][0], sample["alerts"][0]
        assert (ours["status"], alert["status"]) == (sample["status"], sample_alert["status"])
        assert (ours["version"], ours["truncatedAlerts"]) == ("4", 0)
        assert ours["groupKey"] == '{}:{alertname="LLMLatencyTargetDown", target="b"}'
        for value in (alert["startsAt"], sample_alert["startsAt"], alert["endsAt"], sample_alert["endsAt"]):
            assert value == ZERO_TIME or RFC3339_MS.match(value), value  # Go's zero time: "not ended"
        assert (alert["endsAt"] == ZERO_TIME) == (sample_alert["endsAt"] == ZERO_TIME)
        # the fingerprint is Alertmanager's: the sample's for the sample's labels, ours for ours
        assert fingerprint(sample_alert["labels"]) == sample_alert["fingerprint"] == "2f597b1074285ee4"
        assert alert["fingerprint"] == fingerprint(alert["labels"]) == fingerprint(
            {"alertname": "LLMLatencyTargetDown", "severity": "critical", "target": "b"})
        assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])
    assert firing["alerts"][0]["endsAt"] == ZERO_TIME
    assert resolved["alerts"][0]["endsAt"] != ZERO_TIME
    assert unix(resolved["alerts"][0]["endsAt"]) > unix(resolved["alerts"][0]["startsAt"])
    assert firing["alerts"][0]["fingerprint"] == resolved["alerts"][0]["fingerprint"]
    # The manual's verification snippet, run verbatim on the raw bodies and headers as received
    for request in hook.received:
        raw, headers = request.body, request.headers
        assert docs_check(SECRET.encode(), headers, raw) is True
        tampered = raw.replace(b'"target":"b"', b'"target":"c"')
        assert tampered != raw and len(tampered) == len(raw)
        assert docs_check(SECRET.encode(), headers, tampered) is False
        assert docs_check(b"another secret", headers, raw) is False
        old = str(int(headers[TIMESTAMP_HEADER]) - 3600)  # correctly signed an hour ago: a replay
        assert docs_check(SECRET.encode(), {TIMESTAMP_HEADER: old, SIGNATURE_HEADER: sign(SECRET, old, raw)},
                          raw) is False


def test_the_payload_reproduces_alertmanagers_captured_samples_exactly() -> None:
    """Given the sample's alert, receiver, group and external URL, our payload is the captured
    one: the same fields in the same order with the same values (fingerprint, timestamps,
    groupKey, common labels and annotations included)."""
    for sample_file in ("alertmanager-webhook-sample.json", "alertmanager-webhook-sample-resolved.json"):
        text = (FIXTURES / sample_file).read_text()
        sample = json.loads(text)
        a = sample["alerts"][0]
        instance = AlertInstance(a["labels"], a["annotations"], a["status"], unix(a["startsAt"]),
                                 None if a["endsAt"] == ZERO_TIME else unix(a["endsAt"]), a["generatorURL"])
        ours = webhook_payload(sample["receiver"], sample["groupLabels"], [instance], sample["externalURL"])
        assert ours == sample, sample_file
        assert json.dumps(ours, separators=(",", ":")) == json.dumps(sample, separators=(",", ":"))  # field order


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
            bad = c.post("/api/v1/receivers",
                         json={"name": "x", "url": "http://h/", "headers": {"Idempotency-Key": "1"}})
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
