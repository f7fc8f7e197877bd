"""SLOs in the running service: scraped pages -> the alerting round (recording, SloStatus,
LLMLatencySLOBurnRate through lifecycle, receivers and the outbox) -> GET /api/v1/slos and the
llm_latency_slo_* gauges on /metrics, which show the same numbers. A target whose histogram
has no bucket at the threshold is reported, not evaluated; a counter reset counts as
Prometheus counts it."""

from __future__ import annotations

import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import Service, make_service
from tests.support.engine_pages import VllmPage
from tests.support.pages import StaticPageServer
from tests.support.receiver import WebhookReceiver


def metric_samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_burn_rate_alerts_api_and_metrics_agree(migrated_url: str, tmp_path: Path) -> None:
    pages = {"chat-a": VllmPage(), "chat-b": VllmPage()}
    with StaticPageServer(b"") as server_a, StaticPageServer(b"") as server_b, WebhookReceiver() as hook:
        servers = {"chat-a": server_a, "chat-b": server_b}
        config = {
            "targets": [{"name": name, "url": servers[name].url, "labels": {"service": "chat"}} for name in pages],
            "alerts": {"slos": [], "target_down_for": "0s", "external_url": "http://llm-latency.test",
                       "group_by": ["alertname", "target", "long_window"],
                       "receivers": [{"name": "oncall", "url": hook.url, "match": {"severity": "critical"}}]},
            "slos": [{"name": "chat-ttft", "signal": "ttft", "threshold": "2.5s", "objective": "99%",
                      "match": {"service": "chat"}},
                     {"name": "chat-itl", "signal": "itl", "threshold": "0.12s", "objective": "99%",
                      "match": {"service": "chat"}}],  # 120 ms: no vLLM ITL bucket there (auto engine: run time)
        }
        path = tmp_path / "targets.yaml"
        path.write_text(yaml.safe_dump(config))
        for svc in make_service(migrated_url, tmp_path, config_file=path, alert_interval="1h",
                                delivery_interval="1h"):
            def scrape_all(svc: Service = svc) -> None:
                for name, page in pages.items():
                    servers[name].page = page.render()
                    svc.scrape(name)

            scrape_all()  # baseline: nothing served yet
            pages["chat-a"].observe(ttft=[3.0] * 60 + [0.5] * 40)   # 60 % over 2.5 s: burn 60x
            pages["chat-b"].observe(ttft=[0.5] * 100)               # all good
            scrape_all()
            pages["chat-a"].restart()                               # a restart: counters from 0 again
            pages["chat-a"].observe(ttft=[3.0] * 20)                # counted from 0, as Prometheus' increase does
            pages["chat-b"].observe(ttft=[0.5] * 20)
            scrape_all()
            now = time.time() + 1
            svc.monitor.evaluate_alerts(now=now)
            svc.client.portal.call(svc.monitor.delivery.run_once, now)

            slos = {s["name"]: s for s in svc.client.get("/api/v1/slos").json()}
            ttft = slos["chat-ttft"]
            by_target = {t["target"]: t for t in ttft["targets"]}
            a, b = by_target["chat-a"], by_target["chat-b"]
            five = {w["window"]: w for w in a["windows"]}["5m"]
            assert (five["good"], five["total"]) == (40.0, 120.0)
            assert abs(five["burnRate"] - (80 / 120) / 0.01) < 1e-9
            assert {w["window"]: w["total"] for w in b["windows"]}["1h"] == 120.0 and b["budgetRemaining"] == 1.0
            # the SLO's totals: both targets' requests together
            assert (ttft["periodWindow"]["good"], ttft["periodWindow"]["total"]) == (160.0, 240.0)
            assert abs(ttft["budgetRemaining"] - (1 - (80 / 240) / 0.01)) < 1e-9
            assert ttft["timeToExhaustion"] == 0.0 and ttft["coverage"] < 0.01
            assert "data covers" in ttft["note"] and "samples are kept 7d" in ttft["note"]
            assert ttft["errors"] == []
            firing = {(al["kind"], al["longWindow"]) for al in a["alerts"] if al["firing"]}
            assert firing == {("page", "1h"), ("page", "6h"), ("ticket", "1d"), ("ticket", "3d")}
            assert not any(al["firing"] for al in b["alerts"])
            # a threshold that is not a bucket bound: reported per target, never interpolated
            itl = slos["chat-itl"]
            assert itl["errors"] == [
                f"{name}: threshold 0.12s is not a bucket bound of {name}'s itl histogram; the nearest bounds are "
                "0.1s and 0.15s (an SLI between bounds would be interpolated, a guess) - this target is not evaluated"
                for name in ("chat-a", "chat-b")]
            assert itl["sli"] is None and all(t["alerts"] == [] for t in itl["targets"])

            alerts = [al for al in svc.client.get("/api/v1/alerts").json()
                      if al["alertname"] == "LLMLatencySLOBurnRate"]
            assert sorted((al["labels"]["burn"], al["labels"]["long_window"], al["labels"]["short_window"],
                           al["labels"]["severity"], al["state"]) for al in alerts) == [
                ("page", "1h", "5m", "critical", "firing"), ("page", "6h", "30m", "critical", "firing"),
                ("ticket", "1d", "2h", "warning", "firing"), ("ticket", "3d", "6h", "warning", "firing")]
            page = next(al for al in alerts if al["labels"]["long_window"] == "1h")
            assert page["labels"]["target"] == "chat-a" and page["labels"]["slo"] == "chat-ttft"
            assert page["labels"]["service"] == "chat"
            assert page["annotations"]["long_burn_rate"] == page["annotations"]["short_burn_rate"] == "66.67"
            assert page["annotations"]["budget_left"] == "-65.67"
            assert page["annotations"]["runbook_url"] == "http://llm-latency.test/runbooks/slo_burn"
            # the pages went to the critical receiver through the outbox, one group per window pair
            received = [alert["labels"] for message in hook.received for alert in message.json["alerts"]]
            assert sorted(r["long_window"] for r in received) == ["1h", "6h"]
            assert svc.client.get("/runbooks/slo_burn").status_code == 200

            text = svc.client.get("/metrics").text
            burn = metric_samples(text, "llm_latency_slo_burn_rate")
            assert abs(burn[(("slo", "chat-ttft"), ("window", "5m"))] - (80 / 240) / 0.01) < 1e-9
            assert metric_samples(text, "llm_latency_slo_error_budget_remaining")[(("slo", "chat-ttft"),)] \
                == ttft["budgetRemaining"]
            assert metric_samples(text, "llm_latency_slo_requests")[
                (("kind", "total"), ("slo", "chat-ttft"), ("window", "28d"))] == 240.0
            assert metric_samples(text, "llm_latency_slo_target_error")[(("slo", "chat-itl"), ("target", "chat-a"))] \
                == 1.0
            assert metric_samples(text, "llm_latency_slo_objective")[(("signal", "ttft"), ("slo", "chat-ttft"))] == 0.99

            # the burn stops: once the 5 m window holds only the good requests after it, the page resolves
            for _ in range(2):
                pages["chat-a"].observe(ttft=[0.5] * 50)
                scrape_all()
            later = time.time() + 301  # the first scrapes are out of the 5 m window
            svc.monitor.evaluate_alerts(now=later)
            states = {al["labels"]["long_window"]: al["state"] for al in svc.client.get("/api/v1/alerts").json()
                      if al["alertname"] == "LLMLatencySLOBurnRate"}
            assert states["1h"] == "resolved"
