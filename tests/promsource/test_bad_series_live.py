"""One bad series under a source's selector, in a real Prometheus 2.42: a replica whose page also
has a TTFT bucket ``le="oops"``. Every round still evaluates every target (the source's replicas
and a target the service scrapes itself), the bad bucket is dropped, counted and named, and the
replica's numbers are Prometheus' own over its valid buckets."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx

from app.emulator.server import EmulatorFleet, TargetSpec
from tests.api.conftest import make_service
from tests.support.pages import StaticPageServer
from tests.support.prometheus import FileSD, running_prometheus

WINDOW = 20


def _bad_page(url: str) -> bytes:
    """A healthy replica's page with one more TTFT bucket whose ``le`` is not a number."""
    page = httpx.get(url, timeout=5).content
    model = next(line for line in page.decode().splitlines()
                 if line.startswith("vllm:time_to_first_token_seconds_bucket{")).split('model_name="')[1].split('"')[0]
    return page + f'vllm:time_to_first_token_seconds_bucket{{le="oops",model_name="{model}"}} 7\n'.encode()


def test_one_bad_series_stops_no_round(migrated_url: str, tmp_path: Path) -> None:
    specs = [TargetSpec("a", "healthy", time_scale=10.0, warmup_s=60, seed=1),
             TargetSpec("b", "queueing", time_scale=10.0, warmup_s=60, seed=2)]
    with EmulatorFleet(specs) as fleet, StaticPageServer(lambda: _bad_page(fleet.urls["b"] + "/metrics")) as bad:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"], "z": bad.url}, namespace="llm", service="chat")
        with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s")) as prom:
            prom.wait_for_samples('vllm:time_to_first_token_seconds_bucket{le="oops"}', WINDOW + 2, timeout=60)
            config = tmp_path / "t.yaml"
            config.write_text(f"""
targets:
  - {{name: direct, url: "{fleet.urls['a']}/metrics"}}
diagnosis: {{interval: 1h, window: {WINDOW}s}}
alerts:
  slos:
    - {{name: ttft, signal: ttft, quantile: 0.5, threshold: 1ms, window: {WINDOW}s, for: 0s}}
sources:
  - name: prod
    url: {prom.url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    query_timeout: 10s
""")
            for svc in make_service(migrated_url, tmp_path, config_file=config):
                c, monitor = svc.client, svc.monitor
                svc.scrape("direct")
                time.sleep(1.5)
                svc.scrape("direct")
                now = time.time()
                results = monitor.evaluate_diagnoses(now=now)
                assert {d.target for d, _ in results} >= {"direct", "prod.llm.a", "prod.llm.z"}
                evaluated = {d["target"]: d["evaluated_at"] for d in c.get("/api/v1/diagnoses").json()}
                assert evaluated["direct"] == evaluated["prod.llm.a"] == evaluated["prod.llm.z"] == now

                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "ok" and source["targets"] == 2
                dropped = source["bad_series"]["bad_bound"]
                assert dropped >= 1 and set(source["bad_series"]) == {"bad_bound"}
                metrics = c.get("/metrics").text
                assert f'llm_latency_source_bad_series_total{{reason="bad_bound",source="prod"}} {dropped:.1f}' \
                    in metrics

                # z's TTFT is Prometheus' own histogram_quantile over its valid buckets
                body = c.get("/api/v1/targets/prod.llm.z/latency", params={"window": f"{WINDOW}s", "end": now})
                assert body.status_code == 200
                assert body.json()["dropped_series"] == [{"signal": "ttft", "reason": "bad_bound", "series": 1}]
                expected = prom.query('histogram_quantile(0.99, sum by (le) (increase('
                                      'vllm:time_to_first_token_seconds_bucket{pod="z",le!="oops"}'
                                      f'[{WINDOW}s])))', time=now)["result"]
                assert math.isclose(body.json()["ttft"]["p99"], float(expected[0]["value"][1]), rel_tol=1e-9)
                a = c.get("/api/v1/targets/prod.llm.a/latency", params={"window": f"{WINDOW}s", "end": now}).json()
                assert "dropped_series" not in a and a["ttft"]["count"] > 0

                # the alert and summary rounds go through too, for every target
                assert monitor.evaluate_alerts(now=now)["conditions"] >= 2
                slo = {a["labels"]["target"] for a in c.get("/api/v1/alerts").json() if a["labels"].get("slo")}
                assert {"prod.llm.a", "prod.llm.z"} <= slo
                monitor.refresh_summaries()
                metrics = c.get("/metrics").text
                # a scraped target's quantiles; a source's replicas their means (read means first)
                for target, family in (("direct", "quantile_seconds"), ("prod.llm.a", "mean_seconds"),
                                       ("prod.llm.z", "mean_seconds")):
                    assert any(line.startswith(f"llm_latency_{family}{{") and f'target="{target}"' in line
                               for line in metrics.splitlines()), target
                assert 'llm_latency_round_target_errors_total{round="diagnosis"}' not in metrics
