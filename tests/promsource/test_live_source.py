"""A running service reading its engines from a real Prometheus 2.42 that scrapes emulated vLLM
replicas through file-based service discovery: replicas discovered, added, removed (gone, never
"down"), a replica that stops answering (down), and Prometheus itself stopped and restarted.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from app.diagnosis.tails import TAIL_SIGNALS
from app.emulator.server import EmulatorFleet, TargetSpec
from app.summaries import refresh_summaries
from tests.api.conftest import make_service
from tests.support.pages import StaticPageServer
from tests.support.prometheus import FileSD, running_prometheus

WINDOW = 20.0


def _config(path: Path, prometheus_url: str) -> Path:
    path.write_text(f"""
targets: []
diagnosis: {{interval: 1h, window: {int(WINDOW)}s}}
alerts:
  slos:
    - {{name: chat_ttft, signal: ttft, quantile: 0.5, threshold: 1ms, window: {int(WINDOW)}s, for: 0s,
       targets: [prod.llm.b]}}
sources:
  - name: prod
    url: {prometheus_url}
    selector: '{{namespace="llm"}}'
    target_labels: [namespace, pod]
    service_labels: [namespace, service]
    query_timeout: 10s
""")
    return path


def _targets(client) -> dict[str, dict]:
    return {t["name"]: t for t in client.get("/api/v1/targets").json()}


def test_source_discovers_replicas_and_survives_an_outage(migrated_url: str, tmp_path: Path) -> None:
    specs = [TargetSpec("a", "healthy", time_scale=10.0, warmup_s=60, seed=1),
             TargetSpec("b", "queueing", time_scale=10.0, warmup_s=60, seed=2),
             TargetSpec("c", "healthy", time_scale=10.0, warmup_s=60, seed=3)]
    with EmulatorFleet(specs) as fleet, StaticPageServer(lambda: fleet_page(fleet)) as flaky:
        sd = FileSD(tmp_path / "targets.json")
        sd.set({"a": fleet.urls["a"], "b": fleet.urls["b"], "d": flaky.url}, namespace="llm", service="chat")
        with running_prometheus(tmp_path / "prom", sd.scrape_configs(scrape_interval="1s")) as prom:
            for pod in ("a", "b", "d"):  # each replica's own series: a pod not yet scraped has none to count
                prom.wait_for_samples(f'vllm:num_requests_running{{namespace="llm",pod="{pod}"}}', int(WINDOW) + 2,
                                      timeout=60)
            for svc in make_service(migrated_url, tmp_path, config_file=_config(tmp_path / "t.yaml", prom.url)):
                c, monitor = svc.client, svc.monitor
                now = time.time()
                results = monitor.evaluate_diagnoses(now=now)
                targets = _targets(c)
                assert {"prod.llm.a", "prod.llm.b", "prod.llm.d"} <= set(targets)
                a = targets["prod.llm.a"]
                assert a["source"] == "prometheus" and a["origin"] == "prod" and a["gone_at"] is None
                assert a["labels"] == {"namespace": "llm", "pod": "a", "service": "chat"}
                assert a["detected_engine"] == "vllm" and a["url"] == prom.url
                verdicts = {d.target: d.verdict for d, _ in results}
                assert verdicts["prod.llm.b"] == "queueing", verdicts

                # /latency is Prometheus' own histogram_quantile over the same range (1e-9).
                body = c.get("/api/v1/targets/prod.llm.b/latency", params={"window": "20s", "end": now}).json()
                expected = prom.query('histogram_quantile(0.99, sum by (le) (increase('
                                      'vllm:time_to_first_token_seconds_bucket{pod="b"}[20s])))', time=now)
                assert math.isclose(body["ttft"]["p99"], float(expected["result"][0]["value"][1]), rel_tol=1e-9)
                assert body["rates"]["requests_per_second"] > 0
                odd = c.get("/api/v1/targets/prod.llm.b/latency", params={"start": now - 20.0001234, "end": now})
                assert odd.status_code == 200 and odd.json()["ttft"]["count"] > 0  # any float range, to the ms
                # /series: every point is Prometheus' histogram_quantile at that time.
                series = c.get("/api/v1/targets/prod.llm.b/series", params={
                    "signal": "ttft", "q": "0.9", "step": "5s", "window": "15s", "lookback": "10s",
                    "end": now}).json()["points"]
                assert len(series) >= 3
                for point in series:
                    answer = prom.query('histogram_quantile(0.9, sum by (le) (increase('
                                        'vllm:time_to_first_token_seconds_bucket{pod="b"}[10s])))', time=point["ts"])
                    assert math.isclose(point["value"], float(answer["result"][0]["value"][1]), rel_tol=1e-9)

                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "ok" and source["targets"] == 3 and source["url"] == prom.url
                # a diagnosis round's 44 (with the restarts), discovery's 2, the scrape interval's 1 (every
                # 10 min), and one per histogram whose buckets a replica needs
                means_first = source["queries_last_round"] - len(source["buckets_last_round"])
                assert 0 < means_first <= 47 and len(source["buckets_last_round"]) <= len(TAIL_SIGNALS)
                assert set(source["buckets_last_round"]) <= TAIL_SIGNALS and source["bytes_last_round"] > 10_000
                assert c.get("/readyz").json()["sources"] == {"prod": "ok"}
                # /metrics: each replica's up as its Prometheus saw it, and its mean and count gauges, read
                # means first (its quantiles are its Prometheus' own: no bucket is read for them).
                source_client = monitor.sources.sources["prod"].client
                mirror = monitor.sources.sources["prod"].reader.mirror
                assert mirror is not None and mirror.time is not None
                before, asked, refreshes, at = source_client.bytes_read, source_client.queries, mirror.refreshes, \
                    time.time()
                refresh_summaries(monitor.sessions, monitor.settings.latency_window, monitor.telemetry.derived, end=at,
                                  windows=monitor.windows)
                # within 30 s of the round's read of the raw samples, the summaries use it: their window
                # is the one that ended then; later, one read of what is new
                shared = mirror.refreshes == refreshes
                ended = min(at, mirror.time)
                metrics = c.get("/metrics").text
                assert 'llm_latency_target_up{target="prod.llm.a"} 1.0' in metrics
                lines = [line for line in metrics.splitlines()
                         if 'target="prod.llm.b"' in line and 'signal="ttft"' in line]
                assert [line.split("{")[0] for line in lines] == ["llm_latency_mean_seconds",
                                                                  "llm_latency_observations"]
                w = f"[{monitor.settings.latency_window:g}s]"
                mean = prom.query(f'sum(increase(vllm:time_to_first_token_seconds_sum{{pod="b"}}{w})) / '
                                  f'sum(increase(vllm:time_to_first_token_seconds_count{{pod="b"}}{w}))', time=ended)
                assert math.isclose(float(lines[0].rsplit(" ", 1)[1]), float(mean["result"][0]["value"][1]),
                                    rel_tol=1e-9)
                # no bucket is queried: nothing at all, or the one read of the raw samples since the last
                # (one request per group: the means series, the TTFT buckets, the ITL buckets)
                assert len(mirror.selectors) == 3 and source_client.queries - asked == (0 if shared else 3)
                assert shared == (source_client.bytes_read == before)
                # A discovered target belongs to its discovery.
                assert c.delete("/api/v1/targets/prod.llm.a").status_code == 409

                # SLOs are judged on the source's numbers: b's TTFT p50 is far above 1 ms.
                monitor.evaluate_alerts(now=now)
                slo = [a for a in c.get("/api/v1/alerts").json() if a["labels"].get("slo") == "chat_ttft"]
                assert [(a["labels"]["target"], a["state"]) for a in slo] == [("prod.llm.b", "firing")]

                # Scale: c added, a removed; d stops answering (Prometheus scrapes it with up == 0).
                sd.set({"b": fleet.urls["b"], "c": fleet.urls["c"], "d": flaky.url}, namespace="llm",
                       service="chat")
                prom.wait_for_samples('vllm:num_requests_running{pod="c"}', 3, timeout=60)
                flaky.status = 503  # Prometheus now scrapes it with up == 0
                deadline = time.monotonic() + 60
                while not prom.query('up{pod="d"} == 0')["result"] or \
                        prom.query('vllm:num_requests_running{pod="a"}')["result"]:
                    assert time.monotonic() < deadline, "Prometheus did not see a removed and d down"
                    time.sleep(0.5)
                monitor.evaluate_diagnoses(now=time.time())
                targets = _targets(c)
                assert targets["prod.llm.c"]["gone_at"] is None
                assert targets["prod.llm.a"]["gone_at"] is not None
                assert targets["prod.llm.d"]["gone_at"] is None and targets["prod.llm.d"]["last_scrape"]["up"] is False
                monitor.evaluate_alerts(now=time.time())
                down = {a["labels"]["target"] for a in c.get("/api/v1/alerts").json()
                        if a["labels"]["alertname"] == "LLMLatencyTargetDown"}
                assert down == {"prod.llm.d"}  # the gone replica a raises nothing
                assert 'llm_latency_target_up{target="prod.llm.d"} 0.0' in c.get("/metrics").text
                (source,) = c.get("/api/v1/sources").json()
                assert source["gone"] == 1 and source["down"] == 1

                # Prometheus down: nothing changes, the source says why, and comes back after.
                before = c.get("/api/v1/diagnoses").json()
                busy = next(d for d in before if d["target"] == "prod.llm.b")
                assert "queueing" in busy["active"], busy  # active after two rounds
                prom.stop()
                outage = time.time()
                for offset in (0.0, 20.0, 40.0, 60.0):  # a minute of rounds without the source
                    monitor.evaluate_diagnoses(now=outage + offset)
                    monitor.evaluate_alerts(now=outage + offset)
                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "failing" and source["last_error"].startswith("unreachable")
                assert c.get("/readyz").json()["sources"]["prod"].startswith("failing: unreachable")
                after = c.get("/api/v1/diagnoses").json()
                assert [(d["target"], d["verdict"], d["evaluated_at"]) for d in after] == \
                    [(d["target"], d["verdict"], d["evaluated_at"]) for d in before]
                assert "queueing" in next(d for d in after if d["target"] == "prod.llm.b")["active"]
                # no numbers: the SLO alert neither resolves nor moves
                slo = [a for a in c.get("/api/v1/alerts").json() if a["labels"].get("slo") == "chat_ttft"]
                assert [(a["labels"]["target"], a["state"]) for a in slo] == [("prod.llm.b", "firing")]
                r = c.get("/api/v1/targets/prod.llm.b/latency")
                assert r.status_code == 502 and "unreachable" in r.json()["detail"]
                prom.start()
                monitor.evaluate_diagnoses(now=time.time())
                (source,) = c.get("/api/v1/sources").json()
                assert source["state"] == "ok"


def fleet_page(fleet: EmulatorFleet) -> bytes:
    """A fourth replica serving a copy of a's page (its own labels come from discovery)."""
    import httpx

    return httpx.get(fleet.urls["a"] + "/metrics", timeout=5).content
